"""The row-reduction family's matcher: per-row reductions over the last axis of [T, G, H] data, scalar math
on the per-row results, an elementwise combine with broadcast, and weights without the token axis that
are prepared once per launch. Matches IR structure only, never names.
"""

from __future__ import annotations

from dataclasses import dataclass

from fusegen.codegen.family import ELEMENTWISE, SCALAR_LEAVES, Mismatch, leave
from fusegen.dsl.ir import Dim, KernelIR, Node, OutputDecl

FAMILY = "rowreduce"
REDUCTIONS = frozenset(("sum", "mean", "max"))
ONE = Dim.const(1)


@dataclass(frozen=True)
class RowLoad:
    """A [T, G, H] (or head-shared [T, 1, H]) value read from an input: which node, from where."""

    node: int
    input: str  # the input's name
    head_start: Dim  # first head index in the input
    per_head: bool  # False: one row shared by every head (loaded once per token tile)


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


def match_rowreduce(ir: KernelIR) -> RowReduceMatch:
    """The row-reduction roles of `ir`'s nodes, or raise Mismatch where it does not fit."""
    data = next((i for i in ir.inputs if len(i.shape) == 3), None)
    if data is None:
        raise Mismatch(FAMILY, ir.inputs[0].span, "expected a 3-D input [T, G, H] (tokens, heads, width)")
    rows, heads, width = data.shape
    shapes = _Shapes(rows, heads, width)
    prep = _prep_nodes(ir, shapes)
    loads: list[RowLoad] = []
    for node in ir.nodes:
        if node.id not in prep and node.op not in SCALAR_LEAVES:
            _check_main_node(ir, node, shapes, loads)
    levels = _levels(ir, shapes)
    if not levels:
        raise Mismatch(FAMILY, ir.outputs[0].span, "there is no per-row reduction over the last axis")
    tile_outs, col_outs = _outputs(ir, shapes)
    roots = sorted({a for n in ir.nodes if n.id not in prep for a in n.args if a in prep})
    weights = tuple(n for n in ir.nodes if n.op == "input" and n.id in prep)
    return RowReduceMatch(
        rows, heads, width, tuple(loads), weights, tuple(roots), levels, tile_outs, col_outs
    )


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


def _check_main_node(ir: KernelIR, node: Node, shapes: _Shapes, loads: list[RowLoad]) -> None:
    """A node of the per-token graph must be a load, elementwise, or a last-axis reduction."""
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
    elif node.op == "input":
        raise leave(FAMILY, node, "inputs must be [T, G, H] data or weights without the token axis")
    elif node.op in REDUCTIONS:
        if node.attr("axis") != 2 or not node.attr("keepdim") or not shapes.is_column(node):
            raise leave(FAMILY, node, "reductions must be over the last axis with keepdim=true")
    elif node.op not in ELEMENTWISE:
        raise leave(FAMILY, node, f"`{node.op}` is not an elementwise or row-reduction op")
    elif not (shapes.is_tile(node) or shapes.is_column(node) or node.shape == ()):
        raise leave(FAMILY, node, "values must be [T, G, H] tiles, [T, G, 1] per-row columns or scalars")


def _indexed_load(ir: KernelIR, node: Node, shapes: _Shapes) -> RowLoad:
    """`kv[:, a:b, :]`: a slice of heads of an input, full tokens and width."""
    source = ir.node(node.args[0])
    items = node.attr("index")
    if not isinstance(items, tuple) or len(items) != 3 or any(it.kind != "slice" for it in items):
        raise leave(FAMILY, node, "an input may only be sliced along the head axis")
    ends = [(it.start, it.stop) for it in items]
    zero = Dim.const(0)
    if ends[0] != (zero, source.shape[0]) or ends[2] != (zero, source.shape[2]) or not shapes.is_tile(node):
        raise leave(FAMILY, node, "an input may only be sliced along the head axis")
    return RowLoad(node.id, str(source.name), items[1].start, node.shape[1] != ONE)


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
        if node.op in REDUCTIONS:
            depth[node.id] = below + 1
        elif below >= 0:
            depth[node.id] = below
    levels: dict[int, list[int]] = {}
    for node in ir.nodes:
        if node.op in REDUCTIONS:
            levels.setdefault(depth[node.id], []).append(node.id)
    return tuple(tuple(levels[d]) for d in sorted(levels))


def _outputs(
    ir: KernelIR, shapes: _Shapes
) -> tuple[tuple[OutputDecl, ...], tuple[tuple[OutputDecl, int], ...]]:
    tiles, columns = [], []
    for out in ir.outputs:
        node = ir.node(out.node)
        if (
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
    if not tiles:
        raise Mismatch(FAMILY, ir.outputs[0].span, "expected at least one [T, G, H] output")
    return tuple(tiles), tuple(columns)
