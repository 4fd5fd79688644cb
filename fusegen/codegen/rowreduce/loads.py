"""Row-reduction loads: the DMAs of row inputs and [T, G] columns into SBUF tiles, and their operands."""

from __future__ import annotations

from dataclasses import dataclass

from fusegen.codegen.family import kernel_arg
from fusegen.codegen.rowreduce.match import ColumnLoad, RowLoad, RowReduceMatch
from fusegen.codegen.select_span import CURRENT_HEAD
from fusegen.codegen.select_tables import NL_DTYPE
from fusegen.codegen.stage import Operand, dim_source
from fusegen.dsl.ir import DTYPE_BYTES, Dim, KernelIR, Node


@dataclass(frozen=True)
class Load:
    """One DMA into a fresh SBUF tile: tile name, nl dtype, source access."""

    tile: str
    nl_dtype: str
    source: str


def leaf_name(node: Node) -> str:
    """A tile name for a loaded value: `<spec name>_ld`, else `_<node id>_ld` (spec names never start `_`)."""
    return f"{node.name or f'_{node.id}'}_ld"


def load_row(ir: KernelIR, ld: RowLoad, columns: str) -> Load:
    """The DMA of a row input's `columns` (e.g. `0:d_H`, or a chunk's) for token tile t0 and head h."""
    node = ir.node(ld.node)
    head = dim_source(ld.head_start) + (" + h" if ld.per_head else "")
    head = "h" if head == "0 + h" else head
    source = f"{kernel_arg(ld.input)}[t0:t0 + pt, {head}, {_shifted(columns, ld.column_start)}]"
    return Load(leaf_name(node), NL_DTYPE[node.dtype], source)


def _shifted(columns: str, start: Dim) -> str:
    """`lo:hi` moved right by a column slice's `start` (`d_D + c0:d_D + c0 + hw`)."""
    if start == Dim.const(0):
        return columns
    lo, hi = columns.split(":")
    offset = dim_source(start)
    return f"{offset if lo == '0' else f'{offset} + {lo}'}:{offset} + {hi}"


def column_load(ir: KernelIR, col: ColumnLoad, heads: str) -> Load:
    source = f"{kernel_arg(col.input)}[t0:t0 + pt, 0:{heads}]"
    return Load(_column_tile(col), NL_DTYPE[_column_dtype(ir, col)], source)


def _column_tile(col: ColumnLoad) -> str:
    return f"{col.input}_cl"


def column_leaves(ir: KernelIR, m: RowReduceMatch) -> dict[int, Operand]:
    """Head h's column of every staged [T, G] input, in the dtype it was staged in (an operand that must
    be fp32, e.g. of tensor_scalar, is converted by the selector)."""
    return {c.node: Operand("vec", f"{_column_tile(c)}[0:pt, {CURRENT_HEAD}]", dtype=_column_dtype(ir, c))
            for c in m.column_loads}  # fmt: skip


def column_bytes(ir: KernelIR, m: RowReduceMatch) -> int:
    """Bytes per token and head of the staged [T, G] inputs: their [P, G] tiles' SBUF, their HBM reads."""
    return sum(DTYPE_BYTES[_column_dtype(ir, c)] for c in m.column_loads)


def _column_dtype(ir: KernelIR, col: ColumnLoad) -> str:
    return ir.node(ir.node(col.node).args[0]).dtype
