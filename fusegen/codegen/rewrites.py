"""IR rewrites before family selection: factor hoisting and weight folding in sums, then CSE and DCE.

The rule (general, keyed to structure only): a sum over an axis of a product of factors
  sum(f1 * f2 * ... , axis=a, keepdim=true)
is split by each factor's shape relative to the product's:
- constant along `a` (a per-row statistic such as an rstd, or a scalar): hoisted out of the sum;
- broadcast along some other axis (a per-column weight, no token axis): multiplied into one fused
  fp32 weight that a kernel can build once per launch;
- everything else (the data) stays inside.
So `sum((x * rx * w_h) * (k * rk * w_e))` becomes `sum(x * k * (w_h * w_e)) * rx * rk`, and an
`rmsnorm(x, eps, w)` factor is first expanded into `x * rsqrt(mean(x^2) + eps) * w` so that its rstd
can be hoisted. A column slice of a product with an input weight, `(x @ w12)[:, 0:I]`, becomes the
product with the sliced weight, `x @ w12[:, 0:I]` (exact: the same dot products), so a packed gate|up
weight gives two projections. A row max of an absolute product, `max(abs(x * rstd * w))`, takes its
per-row factors that are never negative (an rstd) out as a scale, `max(abs(x * w)) * rstd`, so a per-token
quantisation scale needs no pass over the normalised row before the epilogue. Nodes are hash-consed
while they are rebuilt, so identical sums merge (CSE); nodes no output needs are dropped (DCE). A spec
without the patterns comes back as the same object.

First, row reductions keep their axis (`keep_axes`): a `keepdim=false` reduction over the last axis
becomes the kept-dim one followed by a drop of the size-1 axis (`[:, 0]`), per-row math on dropped values
runs on the kept ones (`rsqrt(mean(x, -1) + eps)` is [T, 1] inside), and `r[:, None]` of such a value is
the kept value itself; so the families see only [T, 1] statistics, and a [T] output is the drop of one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from fusegen.codegen.family import ELEMENTWISE
from fusegen.dsl.ir import REDUCE_OPS as REDUCTIONS
from fusegen.dsl.ir import AttrValue, Dim, IndexItem, KernelIR, Node, OutputDecl, Shape

COMMUTATIVE = frozenset(("add", "mul", "maximum", "minimum"))
#: nodes kept even when nothing reads them: they are the kernel's signature.
SIGNATURE_OPS = frozenset(("input", "param"))
ONE = Dim.const(1)
NORMS = frozenset(("rmsnorm", "layernorm"))
#: ops whose value is never negative (nan aside): a per-row factor of these leaves max(abs(...)) as a scale
NON_NEGATIVE = frozenset(("rsqrt", "sqrt", "exp", "abs", "square", "sigmoid"))


def rewrite(ir: KernelIR) -> KernelIR:
    """`ir` with reduced axes kept and its sums of products factored (see the module doc), CSE'd and DCE'd;
    `ir` if none is."""
    ir = keep_axes(ir)
    return _rebuild(ir, _rmsnorm_factors(ir), fuse=True)


def keep_axes(ir: KernelIR) -> KernelIR:
    """`ir` with every reduction's axis kept and `[:, None]` of a dropped axis folded away; `ir` if it
    has no `keepdim=false` reduction or new axis to fold."""
    graph = _Graph()
    remap: dict[int, int] = {}
    kept: dict[int, tuple[int, int]] = {}  # node -> (its value with a size-1 axis at `axis`, axis)
    changed = False
    for node in ir.nodes:
        args = tuple(remap[a] for a in node.args)
        form = _kept_form(graph, ir, node, args, kept)
        if form is None:
            remap[node.id] = graph.add(node, args)
        elif node.op == "unindex":  # `[:, None]` of a dropped axis: the kept value
            remap[node.id] = form[0]
            changed = True
        elif node.op == "index":  # the drop itself, `[:, 0]` of a size-1 axis
            remap[node.id] = graph.add(node, args)
            kept[node.id] = form
        else:
            kept[node.id] = form
            remap[node.id] = _drop(graph, node, *form)
            changed = True
    if not changed:
        return ir
    outputs = tuple(dataclasses.replace(o, node=remap[o.node]) for o in ir.outputs)
    nodes, outputs = _live(graph.nodes, outputs)
    return dataclasses.replace(ir, nodes=nodes, outputs=outputs)


def _kept_form(graph: _Graph, ir: KernelIR, node: Node, args: tuple[int, ...],
               kept: dict[int, tuple[int, int]]) -> tuple[int, int] | None:  # fmt: skip
    """(the node computing `node` with a size-1 axis kept, that axis), where there is one."""
    axis = int(node.attr("axis")) if node.op in REDUCTIONS else -1  # type: ignore[arg-type]
    if node.op in REDUCTIONS and not node.attr("keepdim") and axis == len(node.shape):  # over the last axis
        shape = (*node.shape[:axis], ONE, *node.shape[axis:])
        attrs = tuple((k, True if k == "keepdim" else v) for k, v in node.attrs)
        return graph.add(node, args, attrs=attrs, shape=shape), axis
    if node.op in ("index", "unindex"):
        single = _single_axis(node, ir.node(node.args[0]))
        if single is None:
            return None
        source = kept.get(node.args[0]) if node.op == "unindex" else (args[0], single)
        return source if source is not None and source[1] == single else None
    tensors = [a for a in node.args if ir.node(a).shape != ()]
    forms = {kept.get(a) is not None and ir.node(a).shape == node.shape for a in tensors}
    if node.op not in ELEMENTWISE or forms != {True}:
        return None
    axis = kept[tensors[0]][1]
    if any(kept[a][1] != axis for a in tensors):
        return None
    kept_args = tuple(kept[old][0] if old in kept else new for old, new in zip(node.args, args, strict=True))
    shape = (*node.shape[:axis], ONE, *node.shape[axis:])
    return graph.add(node, kept_args, shape=shape), axis


def _single_axis(node: Node, source: Node) -> int | None:
    """The axis an index only drops (`[:, 0]` of a size-1 axis) or an unindex only inserts (`[:, None]`)."""
    items: tuple[IndexItem, ...] = node.attr("index")  # type: ignore[assignment]
    full = node.shape if node.op == "unindex" else source.shape
    points = [i for i, it in enumerate(items) if it.kind == "at"]
    if len(points) != 1 or items[points[0]].start != Dim.const(0) or full[points[0]] != ONE:
        return None
    if any(not _whole(it, d) for it, d in zip(items, full, strict=True) if it.kind == "slice"):
        return None
    return points[0]


def _drop(graph: _Graph, like: Node, kept_id: int, axis: int) -> int:
    """`kept[:, 0]`: the kept value without its size-1 `axis`, in `like`'s shape."""
    shape = graph.nodes[kept_id].shape
    items = tuple(IndexItem("at", Dim.const(0)) if i == axis else IndexItem("slice", Dim.const(0), d)
                  for i, d in enumerate(shape))  # fmt: skip
    return graph.add(like, (kept_id,), op="index", attrs=(("index", items),), shape=like.shape, name=None)


def expand_norms(ir: KernelIR) -> KernelIR:
    """`ir` with every rmsnorm / layernorm spelled out as its reductions and per-row math, nothing else
    changed (for a family that lowers reductions but not norms); `ir` if it has no norm."""
    return _rebuild(ir, {n.id for n in ir.nodes if n.op in NORMS}, fuse=False)


def _rebuild(ir: KernelIR, expand: set[int], fuse: bool) -> KernelIR:
    """`ir` rebuilt node by node: norms in `expand` spelled out, sums factored and slices pushed into
    products when `fuse`; CSE'd and DCE'd, or `ir` itself when nothing changed."""
    graph = _Graph()
    remap: dict[int, int] = {}
    changed = False
    for node in ir.nodes:
        args = tuple(remap[a] for a in node.args)
        if node.id in expand:
            remap[node.id] = graph.expand_norm(node, args)
            changed = True
            continue
        rewritten = graph.fuse(node, args) if fuse else None
        changed |= rewritten is not None
        remap[node.id] = rewritten if rewritten is not None else graph.add(node, args)
    outputs = tuple(dataclasses.replace(o, node=remap[o.node]) for o in ir.outputs)
    if not changed and len(graph.nodes) == len(ir.nodes):
        return ir
    nodes, outputs = _live(graph.nodes, outputs)
    return dataclasses.replace(ir, nodes=nodes, outputs=outputs)


def broadcast(*shapes: Shape) -> Shape:
    """NumPy broadcast of symbolic shapes (dims equal, or 1, or missing)."""
    rank = max(len(s) for s in shapes)
    out: list[Dim] = []
    for axis in range(rank):
        dims = {s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0} - {ONE}
        if len(dims) > 1:
            raise ValueError(f"shapes {shapes} do not broadcast")
        out.append(dims.pop() if dims else ONE)
    return tuple(out)


class _Graph:
    """A growing node list with hash-consing: adding a node equal to an earlier one returns that one."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self._ids: dict[tuple[object, ...], int] = {}

    def add(self, like: Node, args: tuple[int, ...], **changes: object) -> int:
        """A node like `like` over `args` (with field `changes`); an identical existing node is reused."""
        node = dataclasses.replace(like, id=len(self.nodes), args=args, **changes)  # type: ignore[arg-type]
        key = _key(node)
        if key in self._ids:
            self.name(self._ids[key], node.name)  # a merged twin lends its name
            return self._ids[key]
        self._ids[key] = node.id
        self.nodes.append(node)
        return node.id

    def op(
        self,
        like: Node,
        op: str,
        args: tuple[int, ...],
        shape: Shape,
        attrs: tuple[tuple[str, AttrValue], ...] = (),
    ) -> int:
        """An unnamed f32 node `op(args)` located at `like`'s source span."""
        return self.add(like, args, op=op, attrs=attrs, shape=shape, dtype="f32", name=None)

    def product(self, like: Node, factors: Iterable[int]) -> int:
        """The left-to-right product of `factors` (at least one)."""
        ids = list(factors)
        acc = ids[0]
        for f in ids[1:]:
            acc = self.op(like, "mul", (acc, f), broadcast(self.nodes[acc].shape, self.nodes[f].shape))
        return acc

    def fuse(self, node: Node, args: tuple[int, ...]) -> int | None:
        """The fused form of `node` over `args` (a factored sum, a sliced product), or None."""
        if node.op == "sum":
            return self.factor_sum(node, args)
        if node.op == "max":
            return self.factor_max_abs(node, args)
        return self.slice_product(node, args) if node.op == "index" else None

    def expand_norm(self, node: Node, args: tuple[int, ...]) -> int:
        """`rmsnorm(x, eps[, w])` as `x * rsqrt(mean(square(x)) + eps) [* w]` (so its rstd can be hoisted),
        `layernorm(x, eps[, w, b])` as `c * rsqrt(mean(square(c)) + eps) [* w] [+ b]`, c = x - mean(x)."""
        x, eps, *affine = args
        shape = self.nodes[x].shape
        stat = (*shape[:-1], ONE)
        if node.op == "layernorm":
            x = self.op(node, "sub", (x, self._mean(node, x)), shape)
        variance = self._mean(node, self.op(node, "square", (x,), shape))
        rstd = self.op(node, "rsqrt", (self.op(node, "add", (variance, eps), stat),), stat)
        gamma, beta = affine[:1], affine[1:]
        out = self.product(node, (x, rstd, *gamma))
        for b in beta:
            out = self.op(node, "add", (out, b), shape)
        self.name(out, node.name)
        return out

    def _mean(self, like: Node, x: int) -> int:
        """mean(x, axis=-1, keepdim=true)."""
        shape = self.nodes[x].shape
        return self.op(like, "mean", (x,), (*shape[:-1], ONE), (("axis", len(shape) - 1), ("keepdim", True)))

    def factor_sum(self, node: Node, args: tuple[int, ...]) -> int | None:
        """The factored form of sum node `node` over `args`, or None when no factor moves."""
        operand = self.nodes[args[0]]
        axis = int(node.attr("axis"))  # type: ignore[arg-type]
        if not node.attr("keepdim") or node.dtype != "f32":
            return None
        hoisted, weights, data = _split_factors(self, operand, axis)
        if not data or (not hoisted and len(weights) < 2):
            return None
        inner = sorted(data)
        if weights:
            inner.append(self.product(node, sorted(weights)))
        body = self.product(node, inner)
        if self.nodes[body].shape != operand.shape:
            return None  # a factor would change what is summed; leave the sum alone
        total = self.add(node, (body,), shape=node.shape, name=None if hoisted else node.name)
        result = self.product(node, (total, *sorted(hoisted)))
        if self.nodes[result].shape != node.shape:
            return None
        self.name(result, node.name)
        return result

    def factor_max_abs(self, node: Node, args: tuple[int, ...]) -> int | None:
        """`max(abs(a * c))` as `max(abs(a)) * c` for factors c constant along the axis and never negative
        (an rstd): exact in reals, and rounding is monotone, so both forms round the same products."""
        operand = self.nodes[args[0]]
        if operand.op != "abs" or not node.attr("keepdim") or node.dtype != "f32":
            return None
        product = self.nodes[operand.args[0]]
        hoisted, _, data = _split_factors(self, product, int(node.attr("axis")))  # type: ignore[arg-type]
        hoisted = [f for f in hoisted if self.nodes[f].op in NON_NEGATIVE]
        rest = sorted(f for f in _factors(self.nodes, product.id) if f not in hoisted)
        if not hoisted or not data or self.nodes[self.product(node, rest)].shape != product.shape:
            return None
        inner = self.op(operand, "abs", (self.product(node, rest),), product.shape)
        result = self.product(node, (self.add(node, (inner,), shape=node.shape, name=None), *sorted(hoisted)))
        self.name(result, node.name)
        return result

    def slice_product(self, node: Node, args: tuple[int, ...]) -> int | None:
        """`(x @ w)[:, a:b]` as `x @ w[:, a:b]` for an input `w` (packed gate|up weights become two
        projections), or None when `node` is not a column slice of such a product."""
        product = self.nodes[args[0]]
        items: tuple[IndexItem, ...] = node.attr("index")  # type: ignore[assignment]
        if product.op != "matmul" or len(items) != 2 or not _whole(items[0], product.shape[0]):
            return None
        x, weight = (self.nodes[a] for a in product.args)
        if weight.op != "input" or len(weight.shape) != 2 or items[1].kind != "slice":
            return None
        columns = (IndexItem("slice", Dim.const(0), weight.shape[0]), items[1])
        shape = (weight.shape[0], node.shape[1])
        sliced = self.add(node, (weight.id,), attrs=(("index", columns),), shape=shape, dtype=weight.dtype,
                          name=None)  # fmt: skip
        return self.add(product, (x.id, sliced), shape=node.shape, name=node.name)

    def name(self, node_id: int, name: str | None) -> None:
        """Give node `node_id` the spec's name `name` unless it already has one."""
        if name is not None and self.nodes[node_id].name is None:
            self.nodes[node_id] = dataclasses.replace(self.nodes[node_id], name=name)


def _whole(item: IndexItem, dim: Dim) -> bool:
    """Whether index item `item` takes all of an axis of size `dim`."""
    return item.kind == "slice" and item.start == Dim.const(0) and item.stop in (None, dim)


def _split_factors(graph: _Graph, operand: Node, axis: int) -> tuple[list[int], list[int], list[int]]:
    """(hoistable, weight, data) factor ids of a product tree of `mul` nodes."""
    hoisted: list[int] = []
    weights: list[int] = []
    data: list[int] = []
    rank = len(operand.shape)
    for fid in _factors(graph.nodes, operand.id):
        shape = graph.nodes[fid].shape
        padded = (ONE,) * (rank - len(shape)) + shape
        if padded[axis] == ONE:
            hoisted.append(fid)
        elif any(p == ONE and o != ONE for p, o in zip(padded, operand.shape, strict=True)):
            weights.append(fid)
        else:
            data.append(fid)
    return hoisted, weights, data


def _factors(nodes: list[Node], root: int) -> list[int]:
    """Leaves of the `mul` tree under `root` (a non-mul root is its own single factor)."""
    node = nodes[root]
    if node.op != "mul":
        return [root]
    return [f for a in node.args for f in _factors(nodes, a)]


def _rmsnorm_factors(ir: KernelIR) -> set[int]:
    """rmsnorm nodes that are factors of some sum's product, or of a max of an absolute product (those get
    expanded, so their rstd can be hoisted)."""
    found: set[int] = set()
    nodes = list(ir.nodes)
    for node in ir.nodes:
        if node.op == "sum":
            found |= {f for f in _factors(nodes, node.args[0]) if nodes[f].op == "rmsnorm"}
        if node.op == "max" and nodes[node.args[0]].op == "abs":
            found |= {f for f in _factors(nodes, nodes[node.args[0]].args[0]) if nodes[f].op == "rmsnorm"}
    return found


def _key(node: Node) -> tuple[object, ...]:
    """What makes two nodes the same value (commutative operands unordered; inputs/params by name)."""
    args = tuple(sorted(node.args)) if node.op in COMMUTATIVE else node.args
    name = node.name if node.op in SIGNATURE_OPS else None
    return (node.op, args, node.attrs, node.shape, node.dtype, name)


def _live(
    nodes: list[Node], outputs: tuple[OutputDecl, ...]
) -> tuple[tuple[Node, ...], tuple[OutputDecl, ...]]:
    """Drop nodes no output reads (signature nodes stay) and renumber: ids == indices, order kept."""
    keep = {n.id for n in nodes if n.op in SIGNATURE_OPS}
    todo = [o.node for o in outputs]
    while todo:
        nid = todo.pop()
        if nid not in keep:
            keep.add(nid)
            todo.extend(nodes[nid].args)
    new_id = {old: new for new, old in enumerate(sorted(keep))}
    renumbered = tuple(
        dataclasses.replace(nodes[old], id=new, args=tuple(new_id[a] for a in nodes[old].args))
        for old, new in sorted(new_id.items())
    )
    return renumbered, tuple(dataclasses.replace(o, node=new_id[o.node]) for o in outputs)
