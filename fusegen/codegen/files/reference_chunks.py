"""Row chunking of the generated reference: at real shapes its f32 intermediates can exceed a
developer's memory (the Engram gate's at T=4001 HC=4 H=7168: ~16 GB), so a reference whose every
row-dependent value is per-row runs in row chunks and concatenates. Family-independent."""

from __future__ import annotations

from dataclasses import dataclass

from fusegen.codegen.stage import dim_source
from fusegen.dsl.ir import KernelIR

#: bytes of f32 intermediates the reference may hold at once before it works in row chunks
MEMORY_BUDGET = 1 << 30


@dataclass(frozen=True)
class RowChunks:
    """How the reference splits its rows: which arguments are sliced, and its f32 elements per row."""

    row_inputs: tuple[str, ...]
    row_elements: str  # Python source over the d_<dim> locals: f32 elements all row values hold per row


def row_chunks(ir: KernelIR) -> RowChunks | None:
    """The chunking of `ir`'s reference, or None when a value mixes rows (a reduction or a matmul over
    them, a dim of the row count used as a number) or the row count is fixed."""
    if not ir.inputs or not ir.inputs[0].shape or not ir.inputs[0].shape[0].symbols():
        return None
    rows = ir.inputs[0].shape[0]
    row_syms = set(rows.symbols())
    row_inputs = [i for i in ir.inputs if i.shape and i.shape[0] == rows]
    others = [i for i in ir.inputs if i not in row_inputs]
    if any(row_syms & set(d.symbols()) for i in others for d in i.shape):
        return None
    names = {i.name for i in row_inputs}
    depends = {n.id for n in ir.nodes if n.op == "input" and n.name in names}
    per_row: dict[str, int] = {}
    for node in ir.nodes:
        if node.op == "dim" and row_syms & set(node.attr("dim").symbols()):  # type: ignore[union-attr]
            return None
        if node.id in depends or any(a in depends for a in node.args):
            if not node.shape or node.shape[0] != rows:
                return None
            depends.add(node.id)
            size = " * ".join(dim_source(d) for d in node.shape[1:] if dim_source(d) != "1") or "1"
            per_row[size] = per_row.get(size, 0) + 1
    if any(not o.shape or o.shape[0] != rows for o in ir.outputs):
        return None
    total = " + ".join(f"{n} * {size}" for size, n in sorted(per_row.items()))
    return RowChunks(tuple(str(i.name) for i in row_inputs), total)
