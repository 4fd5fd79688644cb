"""Matcher pieces the matmul families share: a projection weight's columns, the row-wise prologue computing
the projected operand, and the nodes of a stage. Structure only, never names.
"""

from __future__ import annotations

from fusegen.codegen.family import ELEMENTWISE, SCALAR_LEAVES, Mismatch, leave, shape_is
from fusegen.dsl.ir import Dim, IndexItem, KernelIR, Node

#: Row-wise ops a matmul family's prologue, combine or epilogue may hold (besides elementwise ones).
ROW_WISE = frozenset(("sum", "mean", "max", "layernorm", "rmsnorm"))


def weight_columns(ir: KernelIR, weight: Node) -> tuple[Node, Dim] | None:
    """(the input, its first column) a projection weight reads: an input, or a column slice of one
    (a packed gate|up weight after the rewrite); None for anything else."""
    if weight.op == "input":
        return weight, Dim.const(0)
    source = ir.node(weight.args[0]) if weight.op == "index" else None
    if source is None or source.op != "input":
        return None
    items: tuple[IndexItem, ...] = weight.attr("index")  # type: ignore[assignment]
    rows, columns = items
    if rows.start != Dim.const(0) or rows.stop not in (None, source.shape[0]) or columns.kind != "slice":
        return None
    return source, columns.start


def row_prologue(family: str, ir: KernelIR, x: Node, rows: Dim, hidden: Dim) -> tuple[Node, tuple[int, ...]]:
    """The [R, K] input the kernel reads, and the row-wise prologue computing the projected operand."""
    if x.op == "input":
        return x, ()
    nodes = stage_nodes(family, ir, x, stops=set(), what="prologue")
    sources = [
        ir.node(n) for n in sorted(nodes) if ir.node(n).op == "input" and ir.node(n).shape == (rows, hidden)
    ]
    if len(sources) != 1:
        raise leave(family, x, f"a prologue must read exactly one [{rows}, {hidden}] input")
    for nid in sorted(nodes):
        node = ir.node(nid)
        if (
            node.op == "input"
            and node.id != sources[0].id
            and not shape_is(node.shape, (hidden,), (Dim.const(1), hidden))
        ):
            raise leave(
                family,
                node,
                f"a prologue may read one [{rows}, {hidden}] input, [{hidden}] vectors and scalars",
            )
        if node.op in ("sum", "mean", "max") and (node.attr("axis") != 1 or not node.attr("keepdim")):
            raise leave(family, node, "prologue reductions must be over the last axis with keepdim=true")
    return sources[0], tuple(sorted(nodes))


def epilogue_shapes(rows: Dim, width: Dim) -> tuple[tuple[Dim, ...], ...]:
    """The shapes a projection's epilogue values may take: per element, per column, per row, or scalar."""
    one = Dim.const(1)
    return ((rows, width), (rows, one), (width,), (one, width), ())


def stage_nodes(family: str, ir: KernelIR, root: Node, stops: set[int], what: str) -> set[int]:
    """Ids of the nodes `root` is computed from, stopping at `stops`, inputs and scalars."""
    seen: set[int] = set()
    todo = [root.id]
    while todo:
        nid = todo.pop()
        if nid in seen:
            continue
        seen.add(nid)
        node = ir.node(nid)
        if nid in stops or node.op == "input" or node.op in SCALAR_LEAVES:
            continue
        if node.op not in ELEMENTWISE and node.op not in ROW_WISE:
            raise _outside(family, ir, node, what)
        todo.extend(node.args)
    return seen


def _outside(family: str, ir: KernelIR, node: Node, what: str) -> Mismatch:
    """Why `node` leaves a stage, in the spec's syntax (`[:, None]`, not the IR's `unindex`), with the fix for
    a per-row vector broadcast back over the row: a stage reads a per-row column as an [R, 1] input."""
    source = ir.node(node.args[0]) if node.args else node
    if node.op == "unindex" and source.op == "input" and len(source.shape) == 1:
        fix = f"declare `{source.name}` as [{source.shape[0]}, 1] and use it without `[:, None]`"
        return Mismatch(family, node.span, f"`{source.name}[:, None]` cannot appear in the {what}: {fix}")
    syntax = {"index": "indexing (`[...]`)", "unindex": "`None` in an index"}.get(node.op, f"`{node.op}`")
    return leave(family, node, f"{syntax} cannot appear in the {what}")
