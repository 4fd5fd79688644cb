"""The row-reduction family's matcher: per-row reductions over the last axis of [T, G, H] data, scalar math
on the per-row results, an elementwise combine with broadcast, and weights without the token axis that
are prepared once per launch. Matches IR structure only, never names.

Per-row [T, G] inputs are read as columns (`unindex` restores the kept axis: `s[:, :, None]`). A backward
IR (codegen/autodiff.py) adds columns `expand`ed over the width and, carried only by the backward kernel,
sums over the head axis (accumulated across the head loop) and over the token axis (accumulated across
token tiles) and outputs packed from head slices (`unindex` + `add`, e.g. grad_kv). A [G, H]
output may apply elementwise post-ops to token sums, [G, H] weights and scalars (grad_w_h = Σ_T(...)·w_e):
they run once the sums are whole, in the kernel that adds up the cores' partial sums.
"""

from __future__ import annotations

from dataclasses import dataclass

from fusegen.codegen.family import ELEMENTWISE, SCALAR_LEAVES, Mismatch, leave
from fusegen.dsl.diagnostics import Span
from fusegen.dsl.ir import Dim, IndexItem, KernelIR, Node, OutputDecl, TensorDecl

FAMILY = "rowreduce"
REDUCTIONS = frozenset(("sum", "mean", "max"))
ONE = Dim.const(1)
ZERO = Dim.const(0)
UNCOVERED = "the head slices of a packed output must cover it without overlap"


@dataclass(frozen=True)
class RowLoad:
    """A [T, G, H] (or head-shared [T, 1, H]) value read from an input: which node, from where."""

    node: int
    input: str  # the input's name
    head_start: Dim  # first head index in the input
    per_head: bool  # False: one row shared by every head (loaded once per token tile)
    column_start: Dim = ZERO  # first column in the input (`x[:, D:2*D]` of a [T, 2*D] input)


@dataclass(frozen=True)
class ColumnLoad:
    """A per-row [T, G] input read as a [T, G, 1] column: staged once per token tile."""

    node: int  # the `unindex` node that restores the kept axis
    input: str


@dataclass(frozen=True)
class PackedTerm:
    """One head slice of a packed output: a per-head value (rows start + h) or a head sum (row start)."""

    node: int
    start: Dim
    per_head: bool


@dataclass(frozen=True)
class PackedOutput:
    """A [T, X, H] output assembled from disjoint head slices that cover it."""

    output: OutputDecl
    terms: tuple[PackedTerm, ...]


@dataclass(frozen=True)
class RowReduceMatch:
    """The matched structure: dims, loads, the weight-prep graph, reductions by level, outputs."""

    rows: Dim  # T, on partitions
    heads: Dim  # G, looped
    width: Dim  # H, reduced and on the free axis
    loads: tuple[RowLoad, ...]
    weights: tuple[Node, ...]  # inputs without the token axis
    prep_roots: tuple[int, ...]  # prep values the main graph reads, resident in SBUF
    levels: tuple[tuple[int, ...], ...]  # reduction node ids; level n reads only levels < n
    tile_outputs: tuple[OutputDecl, ...]  # [T, G, H]
    column_outputs: tuple[tuple[OutputDecl, int], ...]  # [T, G] outputs and the [T, G, 1] node they drop from
    column_loads: tuple[ColumnLoad, ...] = ()
    head_sums: tuple[int, ...] = ()  # sum over the head axis: [T, G, H] -> [T, 1, H]
    token_sums: tuple[int, ...] = ()  # sum over the token axis: [T, G, H] -> [G, H]
    token_outputs: tuple[OutputDecl, ...] = ()  # [G, H] outputs: token sums under elementwise post-ops
    post_inputs: tuple[Node, ...] = ()  # the [G, H] weights and params the post-ops read
    packed_outputs: tuple[PackedOutput, ...] = ()

    def backward_only(self, ir: KernelIR) -> Span | None:
        """Where it uses a role only the backward kernel's template carries (a sum over the heads or
        tokens, a packed output), or None."""
        sums = [ir.node(n).span for n in self.head_sums + self.token_sums]
        return next(iter(sums + [p.output.span for p in self.packed_outputs]), None)


def match_rowreduce(ir: KernelIR) -> RowReduceMatch:
    """The row-reduction roles of `ir`'s nodes, or raise Mismatch where it does not fit."""
    data = next((i for i in ir.inputs if len(i.shape) == 3), None)
    if data is None:
        raise Mismatch(FAMILY, ir.inputs[0].span, "expected a [T, H] or [T, G, H] data input (tokens, "
                       "[heads,] width)", relevant=False)  # fmt: skip
    rows, heads, _ = data.shape
    shapes = _Shapes(rows, heads, _width(ir, data))
    prep = _prep_nodes(ir, shapes)
    packed = tuple(_packed(ir, o, shapes) for o in ir.outputs if _is_packed(o, shapes))
    packing = {n for p in packed for n in _packing_nodes(ir, p.output.node)}
    token_sums = tuple(n.id for n in ir.nodes if n.op == "sum" and n.attr("axis") == 0)
    post = _post_ops(ir, shapes, token_sums)
    loads: list[RowLoad] = []
    columns: list[ColumnLoad] = []
    for node in ir.nodes:
        if node.id not in prep | packing | post.nodes and node.op not in SCALAR_LEAVES:
            _check_main_node(ir, node, shapes, loads, columns)
    levels = _levels(ir, shapes)  # none: an elementwise row kernel (silu_and_mul), no reduction pass
    tile_outs, col_outs, token_outs = _outputs(ir, shapes, packed, post.after)
    roots = sorted({a for n in ir.nodes if n.id not in prep | post.nodes for a in n.args if a in prep})
    head_sums = tuple(n.id for n in ir.nodes if n.op == "sum" and n.attr("axis") == 1)
    _check_accumulated_once(ir, head_sums, packing)
    return RowReduceMatch(
        rows, heads, shapes.width, tuple(loads), _graph_inputs(ir, roots), tuple(roots), levels, tile_outs,
        col_outs, tuple(columns), head_sums, token_sums, token_outs, post.inputs, packed,
    )  # fmt: skip


def _width(ir: KernelIR, data: TensorDecl) -> Dim:
    """The row width H: the data input's last axis, or the width of its column slices when it is read
    only through them (`silu(x[:, 0:D]) * x[:, D:2*D]` of a [T, 2*D] input works on rows of D)."""
    node = next(n for n in ir.nodes if n.op == "input" and n.name == data.name)
    users = ir.users(node.id)
    if users and all(u.op == "index" and _column_slice(u, node) for u in users):
        return users[0].shape[-1]
    return data.shape[-1]


def _column_slice(node: Node, source: Node) -> bool:
    """Whether index `node` slices part of the last axis of `source`."""
    items: tuple[IndexItem, ...] = node.attr("index")  # type: ignore[assignment]
    last = items[-1]
    return last.kind == "slice" and (last.start, last.stop) != (Dim.const(0), source.shape[-1])


@dataclass(frozen=True)
class _Shapes:
    """The shapes the family knows, by role."""

    rows: Dim
    heads: Dim
    width: Dim

    def is_tile(self, node: Node) -> bool:
        """[T, G, H] or head-shared [T, 1, H]."""
        return node.shape in ((self.rows, self.heads, self.width), (self.rows, ONE, self.width))

    def is_column(self, node: Node) -> bool:
        """A per-row value [T, G, 1] (or head-shared [T, 1, 1])."""
        return node.shape in ((self.rows, self.heads, ONE), (self.rows, ONE, ONE))

    def is_weight(self, node: Node) -> bool:
        """[G, H], [1, H] or [H]: no token axis."""
        return node.shape in ((self.heads, self.width), (ONE, self.width), (self.width,))


@dataclass(frozen=True)
class _PostOps:
    """What follows the sums over the tokens: nodes that read one, the elementwise graph to the outputs."""

    after: set[int]  # every node that depends on a token sum, the sums included
    nodes: set[int]  # the post-op graphs' nodes (weight-only ones too), outside the per-token loop nest
    inputs: tuple[Node, ...]  # [G, H] weights and params the post-ops read, in IR order


def _post_ops(ir: KernelIR, shapes: _Shapes, token_sums: tuple[int, ...]) -> _PostOps:
    """The elementwise graph from the token sums to the [G, H] outputs, over [G, H] weights and scalars."""
    after = set(token_sums)
    for node in ir.nodes:
        if any(a in after for a in node.args):
            after.add(node.id)
    nodes: set[int] = set()
    leaves: set[int] = set()
    stack = [o.node for o in ir.outputs if o.node in after]
    while stack:
        node = ir.node(stack.pop())
        if node.id in nodes | leaves or node.id in token_sums or node.op == "const":
            continue
        if node.op == "param" or (node.op == "input" and node.shape == (shapes.heads, shapes.width)):
            leaves.add(node.id)
        elif node.op == "dim":
            raise leave(FAMILY, node, "the post-ops of a sum over the tokens cannot read a dim")
        elif node.op in ELEMENTWISE and node.shape in ((shapes.heads, shapes.width), ()):
            nodes.add(node.id)
            stack.extend(node.args)
        else:
            raise leave(FAMILY, node, "a sum over the tokens is followed only by elementwise [G, H] ops "
                                      "on token sums, [G, H] weights and scalars")  # fmt: skip
    stray = sorted(after - nodes - set(token_sums))
    if stray:  # read by the per-token graph, which runs before the sums are whole
        raise leave(FAMILY, ir.node(stray[0]), "a sum over the tokens may only feed [G, H] outputs")
    return _PostOps(after, nodes, tuple(n for n in ir.nodes if n.id in leaves))


def _graph_inputs(ir: KernelIR, roots: list[int]) -> tuple[Node, ...]:
    """The inputs the nodes `roots` are computed from, in IR order."""
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        nid = stack.pop()
        if nid not in seen:
            seen.add(nid)
            stack.extend(ir.node(nid).args)
    return tuple(n for n in ir.nodes if n.op == "input" and n.id in seen)


def _prep_nodes(ir: KernelIR, shapes: _Shapes) -> set[int]:
    """Nodes computed from weight inputs (and constants) only: the per-launch prep graph."""
    prep: set[int] = set()
    for node in ir.nodes:
        if not shapes.is_weight(node):
            continue
        if node.op == "input" or (node.op in ELEMENTWISE and all(
            a in prep or ir.node(a).op in ("const", "dim") for a in node.args
        )):  # fmt: skip
            prep.add(node.id)
    return prep


def _check_main_node(
    ir: KernelIR, node: Node, shapes: _Shapes, loads: list[RowLoad], columns: list[ColumnLoad]
) -> None:
    """A node of the per-token graph must be a load, elementwise, or a reduction the loop nest carries."""
    if node.op == "input" and shapes.is_tile(node):
        loads.append(RowLoad(node.id, str(node.name), Dim.const(0), node.shape[1] != ONE))
    elif node.op == "index" and ir.node(node.args[0]).op == "input":
        loads.append(_indexed_load(ir, node, shapes))
    elif node.op == "index":
        _check_drop(ir, node, shapes)
    elif node.op == "input" and len(node.shape) == 3 and node.shape[0] == shapes.rows and all(
        u.op == "index" for u in ir.users(node.id)
    ):  # fmt: skip
        pass  # packed rows (e.g. kv): read only through head slices, each a load of its own
    elif node.op == "input" and node.shape == (shapes.rows, shapes.heads) and all(
        u.op == "unindex" for u in ir.users(node.id)
    ):  # fmt: skip
        pass  # per-row columns: each read through an unsqueeze, a ColumnLoad of its own
    elif node.op == "input":
        raise leave(FAMILY, node, "inputs must be [T, G, H] data, [T, G] columns or weights (no token axis)")
    elif node.op == "unindex":
        columns.append(_column_load(ir, node, shapes))
    elif node.op == "expand":
        if not shapes.is_column(ir.node(node.args[0])) or not shapes.is_tile(node):
            raise leave(FAMILY, node, "only a per-row column may be expanded, over the width")
    elif node.op in REDUCTIONS:
        _check_reduction(node, shapes)
    elif node.op not in ELEMENTWISE:
        raise leave(FAMILY, node, f"`{node.op}` is not an elementwise or row-reduction op")
    elif not (shapes.is_tile(node) or shapes.is_column(node) or node.shape == ()):
        raise leave(FAMILY, node, "values must be [T, G, H] tiles, [T, G, 1] per-row columns or scalars")


def _check_reduction(node: Node, shapes: _Shapes) -> None:
    """Over the width (keepdim), the heads (sums, keepdim) or the tokens (sums into a [G, H] output)."""
    axis, keepdim = node.attr("axis"), node.attr("keepdim")
    if axis == 2 and keepdim and shapes.is_column(node):
        return
    head_sum = node.shape == (shapes.rows, ONE, shapes.width)
    token_sum = node.shape == (shapes.heads, shapes.width)
    over_heads = axis == 1 and keepdim and head_sum
    if node.op == "sum" and (over_heads or (axis == 0 and not keepdim and token_sum)):
        return
    raise leave(FAMILY, node, "reductions must be over the last axis with keepdim=true (or sums over "
                              "the heads with keepdim, or over the tokens into an output)")  # fmt: skip


def _column_load(ir: KernelIR, node: Node, shapes: _Shapes) -> ColumnLoad:
    """`unindex(col)` restoring the kept last axis of a [T, G] input."""
    source = ir.node(node.args[0])
    items = node.attr("index")
    ok = source.op == "input" and isinstance(items, tuple) and items[-1].kind == "at"
    if not ok or not shapes.is_column(node) or source.shape != (shapes.rows, shapes.heads):
        raise leave(FAMILY, node, "only a [T, G] input may be read as a per-row column")
    return ColumnLoad(node.id, str(source.name))


def _indexed_load(ir: KernelIR, node: Node, shapes: _Shapes) -> RowLoad:
    """`kv[:, a:b, :]` or `x[:, :, a:b]`: a slice of heads and of row-wide columns of an input."""
    source = ir.node(node.args[0])
    items = node.attr("index")
    sliced = "an input may be sliced along the head axis and, as wide as the rows, along the width"
    if not isinstance(items, tuple) or len(items) != 3 or any(it.kind != "slice" for it in items):
        raise leave(FAMILY, node, sliced)
    zero = Dim.const(0)
    if (items[0].start, items[0].stop) != (zero, source.shape[0]):
        raise leave(FAMILY, node, "an input may not be sliced along the token axis")
    if not shapes.is_tile(node):
        raise leave(FAMILY, node, f"{sliced} ({shapes.width} columns here)")
    return RowLoad(node.id, str(source.name), items[1].start, node.shape[1] != ONE, items[2].start)


def _check_drop(ir: KernelIR, node: Node, shapes: _Shapes) -> None:
    """`col[:, :, 0]`: a per-row column without its kept axis (only as an output)."""
    items = node.attr("index")
    source = ir.node(node.args[0])
    ok = isinstance(items, tuple) and items[-1].kind == "at" and shapes.is_column(source)
    if not ok or node.shape != (shapes.rows, shapes.heads):
        raise leave(FAMILY, node, "only `column[:, :, 0]` may index a computed value")


def _levels(ir: KernelIR, shapes: _Shapes) -> tuple[tuple[int, ...], ...]:
    """Reductions grouped by how many reductions feed them (each level is one pass over the width)."""
    depth: dict[int, int] = {}  # node -> deepest reduction level it depends on
    for node in ir.nodes:
        below = max((depth[a] for a in node.args if a in depth), default=-1)
        if node.op in REDUCTIONS and node.attr("axis") == 2:
            depth[node.id] = below + 1
        elif below >= 0:
            depth[node.id] = below
    levels: dict[int, list[int]] = {}
    for node in ir.nodes:
        if node.id in depth and node.op in REDUCTIONS and node.attr("axis") == 2:
            levels.setdefault(depth[node.id], []).append(node.id)
    return tuple(tuple(levels[d]) for d in sorted(levels))


def _outputs(ir: KernelIR, shapes: _Shapes, packed: tuple[PackedOutput, ...], after: set[int]) -> tuple[
    tuple[OutputDecl, ...], tuple[tuple[OutputDecl, int], ...], tuple[OutputDecl, ...]
]:  # fmt: skip
    tiles, columns, token_sums = [], [], []
    for out in ir.outputs:
        node = ir.node(out.node)
        if any(p.output == out for p in packed):
            continue
        if node.id in after and not out.optional:
            token_sums.append(out)
        elif (
            out.shape == (shapes.rows, shapes.heads, shapes.width)
            and shapes.is_tile(node)
            and not out.optional
        ):
            tiles.append(out)
        elif out.shape == (shapes.rows, shapes.heads) and node.op == "index":
            columns.append((out, node.args[0]))
        else:
            raise Mismatch(
                FAMILY,
                out.span,
                f"outputs must be [{shapes.rows}, {shapes.heads}, {shapes.width}] "
                f"or per-row [{shapes.rows}, {shapes.heads}] (only per-row ones may be optional)",
            )
    if not tiles and not packed:
        raise Mismatch(FAMILY, ir.outputs[0].span, "expected at least one [T, G, H] output")
    return tuple(tiles), tuple(columns), tuple(token_sums)


def _is_packed(out: OutputDecl, shapes: _Shapes) -> bool:
    """A [T, X, H] output with X not the head count: rows assembled from head slices."""
    return len(out.shape) == 3 and out.shape[0] == shapes.rows and out.shape[2] == shapes.width and (
        out.shape[1] not in (shapes.heads, ONE)
    )  # fmt: skip


def _packing_nodes(ir: KernelIR, node_id: int) -> list[int]:
    """The `add` / `unindex` nodes that assemble a packed output."""
    node = ir.node(node_id)
    if node.op == "add":
        return [node_id, *_packing_nodes(ir, node.args[0]), *_packing_nodes(ir, node.args[1])]
    return [node_id] if node.op == "unindex" else []


def _packed(ir: KernelIR, out: OutputDecl, shapes: _Shapes) -> PackedOutput:
    """The head slices of a packed output, which must be disjoint and cover it in order."""
    terms = []
    for nid in _packing_nodes(ir, out.node):
        node = ir.node(nid)
        if node.op == "unindex":
            terms.append(_packed_term(ir, node, shapes))
        elif node.op != "add":
            raise leave(FAMILY, node, "a packed output is a sum of head slices (`unindex`)")
    ordered: list[PackedTerm] = []
    end = Dim.const(0)
    while len(ordered) < len(terms):  # chain the slices from row 0: each must start where the last ended
        term = next((t for t in terms if t.start == end), None)
        if term is None:
            raise Mismatch(FAMILY, out.span, UNCOVERED)
        ordered.append(term)
        end = term.start + (shapes.heads if term.per_head else ONE)
    if end != out.shape[1]:
        raise Mismatch(FAMILY, out.span, UNCOVERED)
    return PackedOutput(out, tuple(ordered))


def _packed_term(ir: KernelIR, node: Node, shapes: _Shapes) -> PackedTerm:
    items = node.attr("index")
    value = ir.node(node.args[0])
    per_head = value.shape == (shapes.rows, shapes.heads, shapes.width)
    shared = value.shape == (shapes.rows, ONE, shapes.width)
    if not isinstance(items, tuple) or len(items) != 3 or items[1].kind != "slice" or not (
        per_head or shared
    ):  # fmt: skip
        raise leave(FAMILY, node, "a packed output's slices run along the head axis")
    return PackedTerm(value.id, items[1].start, per_head)


def _check_accumulated_once(ir: KernelIR, head_sums: tuple[int, ...], packing: set[int]) -> None:
    """Head sums are whole only after the head loop: only the packed outputs may read them."""
    for nid in head_sums:
        if any(u.id not in packing for u in ir.users(nid)):
            raise leave(FAMILY, ir.node(nid), "a sum over the heads may only be written to an output")
