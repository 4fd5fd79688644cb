"""Reverse-mode differentiation of a `KernelIR` into a backward KernelIR over inputs, saved values, grads.

The backward IR reads the forward inputs, the optional f32 outputs that recover a forward value exactly
(`gate = g[:, :, 0]` recovers `g`), and one `d_<output>` per differentiated output; it returns one
`d_<input>` per input, in the input's shape and in f32 (the caller casts to the input's dtype).
Forward values it needs and has not saved are recomputed. Besides the spec vocabulary it uses four ops
that codegen/reference.py renders (docs/autodiff.md):
  expand    (a,)   node shape is the target shape       a broadcast to that shape
  unindex   (a,)   attrs: index (the forward index's)   zeros of the source shape, a placed at index
  transpose (a,)   swaps the last two axes
  erf       (a,)   the error function (exact gelu's derivative)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from fusegen.codegen.rewrites import expand_norms
from fusegen.dsl.diagnostics import Span
from fusegen.dsl.ir import AttrValue, Dim, IndexItem, KernelIR, Node, OutputDecl, Shape, TensorDecl

ONE = Dim.const(1)
#: spec names never start with `d_` (fusegen/dsl/names.py), so a gradient's name cannot meet a spec name
GRAD_PREFIX = "d_"
_LEAVES = ("input", "param", "const", "dim")


def broadcast(a: Shape, b: Shape) -> Shape:
    """NumPy broadcast of two symbolic shapes (the IR's BROADCAST_RULE)."""
    n = max(len(a), len(b))
    pa, pb = (ONE,) * (n - len(a)) + a, (ONE,) * (n - len(b)) + b
    if any(x != y and ONE not in (x, y) for x, y in zip(pa, pb, strict=True)):
        raise ValueError(f"shapes {a} and {b} do not broadcast")
    return tuple(y if x == ONE else x for x, y in zip(pa, pb, strict=True))


@dataclass
class Graph:
    """Append-only node list with shape inference and common-subexpression reuse."""

    span: Span
    nodes: list[Node] = field(default_factory=list)
    memo: dict[tuple[object, ...], int] = field(default_factory=dict)

    def add(
        self,
        op: str,
        args: Sequence[int],
        shape: Shape,
        dtype: str = "f32",
        name: str | None = None,
        **attrs: AttrValue,
    ) -> int:
        """The id of node `op(args)`, reusing an identical unnamed node."""
        items = tuple(sorted(attrs.items()))
        key = (op, tuple(args), items, shape, dtype)
        if name is None and op != "input" and key in self.memo:
            return self.memo[key]
        node = Node(len(self.nodes), op, tuple(args), items, shape, dtype, self.span, name)
        self.nodes.append(node)
        self.memo.setdefault(key, node.id)
        return node.id

    def shape(self, a: int) -> Shape:
        """Shape of node `a`."""
        return self.nodes[a].shape

    def const(self, value: float) -> int:
        """A scalar constant."""
        return self.add("const", (), (), value=float(value))

    def un(self, op: str, a: int, exponent: float | None = None) -> int:
        """A shape-preserving op (`pow` takes its exponent)."""
        if exponent is None:
            return self.add(op, (a,), self.shape(a))
        return self.add(op, (a,), self.shape(a), exponent=exponent)

    def bin(self, op: str, a: int, b: int) -> int:
        """A broadcasting binary op; comparisons give bool."""
        dtype = "bool" if op in ("lt", "le", "gt", "ge", "eq", "ne") else "f32"
        return self.add(op, (a, b), broadcast(self.shape(a), self.shape(b)), dtype)

    def mul(self, *factors: int) -> int:
        """Product of several nodes."""
        acc = factors[0]
        for f in factors[1:]:
            acc = self.bin("mul", acc, f)
        return acc

    def mask(self, op: str, a: int, b: int) -> int:
        """A comparison as 0.0 / 1.0."""
        return self.add("cast", (self.bin(op, a, b),), broadcast(self.shape(a), self.shape(b)), to="f32")

    def reduce(self, op: str, a: int, axis: int, keepdim: bool) -> int:
        """sum/mean/max over `axis`."""
        shape = self.shape(a)
        out = shape[:axis] + ((ONE,) if keepdim else ()) + shape[axis + 1 :]
        return self.add(op, (a,), out, axis=axis, keepdim=keepdim)

    def unsqueeze(self, a: int, axis: int) -> int:
        """Insert a size-1 axis (the adjoint of indexing position 0 of a size-1 axis)."""
        shape = self.shape(a)
        items = tuple(IndexItem("slice", Dim.const(0), d) for d in shape)
        items = (*items[:axis], IndexItem("at", Dim.const(0)), *items[axis:])
        return self.add("unindex", (a,), (*shape[:axis], ONE, *shape[axis:]), index=items)

    def transpose(self, a: int) -> int:
        """Swap the last two axes."""
        s = self.shape(a)
        return self.add("transpose", (a,), (*s[:-2], s[-1], s[-2]))

    def fit(self, g: int, target: Shape) -> int:
        """Sum `g` over the axes broadcasting added, then expand it to `target` where it is still smaller."""
        while len(self.shape(g)) > len(target):
            g = self.reduce("sum", g, 0, False)
        for axis, dim in enumerate(target):
            if dim == ONE and self.shape(g)[axis] != ONE:
                g = self.reduce("sum", g, axis, True)
        return g if self.shape(g) == target else self.add("expand", (g,), target)


# ---- derivative rules: (graph, node, adjoint, primal values of the args, primal value of node) ----

Rule = Callable[[Graph, Node, int, list[int], int], list[int | None]]


def _maximum(sel: str) -> Rule:
    # torch's rule: the selected side takes the gradient, ties split it in half
    other = {"gt": "lt", "lt": "gt"}[sel]

    def rule(gr: Graph, n: Node, g: int, a: list[int], y: int) -> list[int | None]:
        half = gr.mul(gr.mask("eq", a[0], a[1]), gr.const(0.5))
        return [
            gr.mul(g, gr.bin("add", gr.mask(sel, a[0], a[1]), half)),
            gr.mul(g, gr.bin("add", gr.mask(other, a[0], a[1]), half)),
        ]

    return rule


def _pow(gr: Graph, n: Node, g: int, a: list[int], y: int) -> list[int | None]:
    e = float(n.attr("exponent"))  # type: ignore[arg-type]
    if e == 0.0:
        return [None]
    return [gr.mul(g, gr.un("pow", a[0], exponent=e - 1.0), gr.const(e))]


def _reduce_rule(gr: Graph, n: Node, g: int, a: list[int], y: int) -> list[int | None]:
    axis, keepdim = int(n.attr("axis")), bool(n.attr("keepdim"))  # type: ignore[arg-type]
    g = g if keepdim else gr.unsqueeze(g, axis)
    if n.op == "sum":
        return [g]
    size = gr.add("dim", (), (), dim=gr.shape(a[0])[axis])
    if n.op == "mean":
        return [gr.bin("div", g, size)]
    hit = gr.mask("eq", a[0], y if keepdim else gr.unsqueeze(y, axis))  # amax: ties share the gradient
    return [gr.bin("div", gr.mul(g, hit), gr.reduce("sum", hit, axis, True))]


def _clamp(gr: Graph, n: Node, g: int, a: list[int], y: int) -> list[int | None]:
    lo, hi = n.attr("lo"), n.attr("hi")
    masks = [gr.mask(op, a[0], gr.const(b)) for op, b in (("ge", lo), ("le", hi)) if b is not None]  # type: ignore[arg-type]
    return [gr.mul(g, *masks)]


def _silu(gr: Graph, n: Node, g: int, a: list[int], y: int) -> list[int | None]:
    s = gr.un("sigmoid", a[0])
    inner = gr.bin("add", gr.const(1.0), gr.mul(a[0], gr.bin("sub", gr.const(1.0), s)))
    return [gr.mul(g, s, inner)]


def _gelu(gr: Graph, n: Node, g: int, a: list[int], y: int) -> list[int | None]:
    cdf = gr.mul(
        gr.bin("add", gr.un("erf", gr.mul(a[0], gr.const(math.sqrt(0.5)))), gr.const(1.0)), gr.const(0.5)
    )
    pdf = gr.mul(
        gr.un("exp", gr.mul(gr.un("square", a[0]), gr.const(-0.5))), gr.const(1 / math.sqrt(2 * math.pi))
    )
    return [gr.mul(g, gr.bin("add", cdf, gr.mul(a[0], pdf)))]


def _gelu_tanh(gr: Graph, n: Node, g: int, a: list[int], y: int) -> list[int | None]:
    c, k = math.sqrt(2 / math.pi), 0.044715
    x2 = gr.un("square", a[0])
    t = gr.un("tanh", gr.mul(a[0], gr.bin("add", gr.const(1.0), gr.mul(x2, gr.const(k))), gr.const(c)))
    left = gr.mul(gr.bin("add", gr.const(1.0), t), gr.const(0.5))
    du = gr.mul(gr.bin("add", gr.const(1.0), gr.mul(x2, gr.const(3 * k))), gr.const(c))
    right = gr.mul(a[0], gr.bin("sub", gr.const(1.0), gr.un("square", t)), du, gr.const(0.5))
    return [gr.mul(g, gr.bin("add", left, right))]


def _matmul(gr: Graph, n: Node, g: int, a: list[int], y: int) -> list[int | None]:
    def mm(p: int, q: int) -> int:
        return gr.add(
            "matmul",
            (p, q),
            (*broadcast(gr.shape(p)[:-2], gr.shape(q)[:-2]), gr.shape(p)[-2], gr.shape(q)[-1]),
        )

    return [mm(g, gr.transpose(a[1])), mm(gr.transpose(a[0]), g)]


def _where(gr: Graph, n: Node, g: int, a: list[int], y: int) -> list[int | None]:
    zero = gr.const(0.0)
    both = broadcast(gr.shape(g), gr.shape(a[0]))
    return [None, gr.add("where", (a[0], g, zero), both), gr.add("where", (a[0], zero, g), both)]


def _simple(fn: Callable[[Graph, int, int, int], int]) -> Rule:
    """A one-operand rule from (graph, adjoint, x, y) -> gradient of x."""
    return lambda gr, n, g, a, y: [fn(gr, g, a[0], y)]


RULES: dict[str, Rule] = {
    "add": lambda gr, n, g, a, y: [g, g],
    "sub": lambda gr, n, g, a, y: [g, gr.un("neg", g)],
    "mul": lambda gr, n, g, a, y: [gr.mul(g, a[1]), gr.mul(g, a[0])],
    "div": lambda gr, n, g, a, y: [gr.bin("div", g, a[1]), gr.un("neg", gr.bin("div", gr.mul(g, y), a[1]))],
    "maximum": _maximum("gt"),
    "minimum": _maximum("lt"),
    "matmul": _matmul,
    "pow": _pow,
    "neg": _simple(lambda gr, g, x, y: gr.un("neg", g)),
    "square": _simple(lambda gr, g, x, y: gr.mul(g, x, gr.const(2.0))),
    "sqrt": _simple(lambda gr, g, x, y: gr.bin("div", gr.mul(g, gr.const(0.5)), y)),
    "rsqrt": _simple(lambda gr, g, x, y: gr.mul(g, gr.un("pow", y, exponent=3.0), gr.const(-0.5))),
    "abs": _simple(lambda gr, g, x, y: gr.mul(g, gr.un("sign", x))),
    "sign": lambda gr, n, g, a, y: [None],
    "sigmoid": _simple(lambda gr, g, x, y: gr.mul(g, y, gr.bin("sub", gr.const(1.0), y))),
    "tanh": _simple(lambda gr, g, x, y: gr.mul(g, gr.bin("sub", gr.const(1.0), gr.un("square", y)))),
    "exp": _simple(lambda gr, g, x, y: gr.mul(g, y)),
    "log": _simple(lambda gr, g, x, y: gr.bin("div", g, x)),
    "relu": _simple(lambda gr, g, x, y: gr.mul(g, gr.mask("gt", x, gr.const(0.0)))),
    "silu": _silu,
    "gelu": _gelu,
    "gelu_tanh": _gelu_tanh,
    "sum": _reduce_rule,
    "mean": _reduce_rule,
    "max": _reduce_rule,
    "clamp": _clamp,
    "where": _where,
    # torch rounds the gradient of `.to(bf16)` to bf16 on its way back; so do we
    "cast": lambda gr, n, g, a, y: [gr.add("cast", (g,), gr.shape(g), n.dtype, to=n.dtype)],
    "index": lambda gr, n, g, a, y: [gr.add("unindex", (g,), gr.shape(a[0]), index=n.attr("index"))],
    # a spec's `a[:, None]` (new axes): the gradient picks the operand's place back out
    "unindex": lambda gr, n, g, a, y: [gr.add("index", (g,), gr.shape(a[0]), index=n.attr("index"))],
    **{op: (lambda gr, n, g, a, y: [None, None]) for op in ("lt", "le", "gt", "ge", "eq", "ne")},
}


def primitive_graph(ir: KernelIR) -> tuple[Graph, dict[int, int]]:
    """The forward as a graph of differentiable primitives (norms spelled out by rewrites.expand_norms
    first), and each IR node's id in it."""
    gr = Graph(Span.whole_file(ir.path))
    where: dict[int, int] = {}
    for n in ir.nodes:
        where[n.id] = gr.add(n.op, [where[a] for a in n.args], n.shape, n.dtype, n.name, **dict(n.attrs))
    return gr, where


@dataclass(frozen=True)
class Saved:
    """An optional output the backward reads instead of recomputing: the index that squeezed it, if any."""

    output: OutputDecl
    index: tuple[IndexItem, ...] | None


def _is_squeeze(items: tuple[IndexItem, ...], shape: Shape) -> bool:
    """Whether an index only drops size-1 axes, so its result recovers its operand exactly."""
    return all(
        (it.kind == "at" and d == ONE and it.start == Dim.const(0))
        or (it.kind == "slice" and it.start == Dim.const(0) and it.stop == d)
        for it, d in zip(items, shape, strict=True)
    )


def saved_values(ir: KernelIR, fwd: Graph, where: dict[int, int], outputs: bool = False) -> dict[int, Saved]:
    """Forward values an optional f32 output recovers exactly (`outputs`: any f32 output), by their id in
    `fwd`."""
    saved: dict[int, Saved] = {}
    for out in ir.outputs:
        node = fwd.nodes[where[out.node]]
        if not (out.optional or outputs) or out.dtype != "f32" or node.op in _LEAVES:
            continue
        items: tuple[IndexItem, ...] = node.attr("index") if node.op == "index" else ()  # type: ignore[assignment]
        if items and _is_squeeze(items, fwd.shape(node.args[0])):
            saved.setdefault(node.args[0], Saved(out, items))
        else:
            saved.setdefault(node.id, Saved(out, None))
    return saved


@dataclass
class _Replay:
    """Forward values inside the backward graph: saved where the forward saves them, else recomputed."""

    fwd: Graph
    bw: Graph
    inputs: dict[str, int]
    saved: dict[int, Saved]
    memo: dict[int, int] = field(default_factory=dict)

    def __call__(self, fid: int) -> int:
        if fid not in self.memo:
            self.memo[fid] = self._value(self.fwd.nodes[fid])
        return self.memo[fid]

    def _value(self, n: Node) -> int:
        if n.op == "input":
            return self.inputs[str(n.name)]
        if n.id in self.saved:
            got, index = self.inputs[self.saved[n.id].output.name], self.saved[n.id].index
            return got if index is None else self.bw.add("unindex", (got,), n.shape, index=index)
        args = [self(a) for a in n.args]
        return self.bw.add(n.op, args, n.shape, n.dtype, n.name, **dict(n.attrs))


def grad_name(name: str) -> str:
    """The backward IR's name for the gradient of forward tensor `name`."""
    return GRAD_PREFIX + name


def backward_ir(ir: KernelIR, grads: Sequence[str] | None = None, read_outputs: bool = False) -> KernelIR:
    """The backward of `ir` for the outputs named in `grads` (default: the required outputs); with
    `read_outputs`, it reads the values its f32 outputs hold (autograd keeps an op's outputs) instead of
    recomputing them."""
    ir = expand_norms(ir)
    fwd, where = primitive_graph(ir)
    outs = [o for o in ir.outputs if (o.name in grads if grads is not None else not o.optional)]
    saved = saved_values(ir, fwd, where, read_outputs)
    decls = [
        *ir.inputs,
        *(TensorDecl(s.output.name, s.output.dtype, s.output.shape, s.output.span) for s in saved.values()),
        *(TensorDecl(grad_name(o.name), o.dtype, o.shape, o.span) for o in outs),
    ]
    bw = Graph(fwd.span)
    inputs = {d.name: bw.add("input", (), d.shape, d.dtype, d.name, index=i) for i, d in enumerate(decls)}
    val = _Replay(fwd, bw, inputs, saved)
    adj: dict[int, int] = {}
    for out in outs:
        _accumulate(bw, adj, where[out.node], inputs[grad_name(out.name)])
    for n in reversed(fwd.nodes):
        if n.id not in adj or n.op in _LEAVES:
            continue
        contribs = RULES[n.op](bw, n, adj[n.id], [val(a) for a in n.args], val(n.id))
        for arg, grad in zip(n.args, contribs, strict=True):
            if grad is not None and fwd.nodes[arg].op not in ("param", "const", "dim"):
                _accumulate(bw, adj, arg, bw.fit(grad, fwd.shape(arg)))
    results = []
    for decl in ir.inputs:
        fid = next(n.id for n in fwd.nodes if n.op == "input" and n.name == decl.name)
        results.append(adj[fid] if fid in adj else bw.add("expand", (bw.const(0.0),), decl.shape))
    return _assemble(ir, bw, decls, results, keep=len(ir.inputs) + len(saved))


def _accumulate(gr: Graph, adj: dict[int, int], fid: int, grad: int) -> None:
    adj[fid] = gr.bin("add", adj[fid], grad) if fid in adj else grad


def _assemble(ir: KernelIR, bw: Graph, decls: list[TensorDecl], results: list[int], keep: int) -> KernelIR:
    """Drop dead nodes (and saved inputs nothing reads), renumber, and wrap as a KernelIR."""
    # input nodes are bw's first len(decls) nodes; ids in [len(ir.inputs), keep) are the saved values
    live = set(results) | {n.id for n in bw.nodes if n.op == "param"}
    live |= {i for i in range(len(decls)) if i < len(ir.inputs) or i >= keep}
    for n in reversed(bw.nodes):
        if n.id in live:
            live.update(n.args)
    remap: dict[int, int] = {}
    nodes: list[Node] = []
    for n in (n for n in bw.nodes if n.id in live):
        attrs = (("index", len(remap)),) if n.op == "input" else n.attrs
        remap[n.id] = len(nodes)
        nodes.append(replace(n, id=len(nodes), args=tuple(remap[a] for a in n.args), attrs=attrs))
    outputs = tuple(
        OutputDecl(grad_name(d.name), remap[r], "f32", d.shape, False, d.span)
        for d, r in zip(ir.inputs, results, strict=True)
    )
    inputs = tuple(d for i, d in enumerate(decls) if i in live)
    doc = f"Backward of {ir.name}: the input gradients, derived by fusegen/codegen/autodiff.py."
    return replace(
        ir, name=f"{ir.name}_backward", inputs=inputs, nodes=tuple(nodes), outputs=outputs, doc=doc
    )
