"""The streamed variant of a row-reduction lowering, for rows too wide to keep in SBUF.

Each reduction pass reads its chunk of every row input it needs from HBM at the top of the chunk loop
(the statistics fold into [P, 1] accumulators as before); the per-row math on the accumulators runs once
per head; the epilogue then loops over the chunks again, re-reading each chunk from HBM, and stores each
output chunk as soon as it is computed. Nothing width-long stays in SBUF but the prepared weights.
"""

from __future__ import annotations

import dataclasses

from fusegen.codegen.engines import GPSIMD
from fusegen.codegen.family import kernel_arg
from fusegen.codegen.rowreduce.loads import Load, column_leaves, load_row
from fusegen.codegen.rowreduce.lower import (
    CHUNK,
    LOCAL,
    RowReduceLowering,
    acc,
    balanced,
    chunk_leaves,
    frontier,
    lower_column,
    lower_levels,
    output_value,
    tile_bytes,
)
from fusegen.codegen.rowreduce.match import RowReduceMatch
from fusegen.codegen.rowreduce.prep import row_kind
from fusegen.codegen.select import Layout, Selector
from fusegen.codegen.select_tables import NL_DTYPE, EngineLoad
from fusegen.codegen.stage import StageBuilder
from fusegen.dsl.ir import KernelIR

TAG = "s"  # prefix of the streamed helpers' tile names


def with_streamed(ir: KernelIR, m: RowReduceMatch, low: RowReduceLowering
                  ) -> tuple[RowReduceLowering, RowReduceLowering]:  # fmt: skip
    """(the resident lowering `low`, its streamed variant), both with the model of both."""
    streamed = lower_streamed(ir, m, low)
    model = low.model._replace(stream_epilogue=streamed.model.stream_epilogue)
    return dataclasses.replace(low, model=model), dataclasses.replace(streamed, model=model)


def lower_streamed(ir: KernelIR, m: RowReduceMatch, low: RowReduceLowering) -> RowReduceLowering:
    """`low` with every row input read per chunk from HBM and a chunked epilogue."""
    return balanced(lambda load: _lower_streamed(ir, m, low, load))


def _lower_streamed(ir: KernelIR, m: RowReduceMatch, low: RowReduceLowering, load: EngineLoad
                    ) -> RowReduceLowering:  # fmt: skip
    """lower_streamed with the full-width steps balanced by `load`."""
    resident = low.passes.resident
    levels, chunk_bytes, _, _, constants = lower_levels(ir, m, resident, row_free=LOCAL, tag=TAG, load=load)
    loads = [load_row(ir, ld, CHUNK) for ld in m.loads]
    levels = tuple(dataclasses.replace(lv, loads=_used(loads, lv.lines)) for lv in levels)
    # per-row values: everything the chunked combine reads, and the [T, G] outputs, once per head
    columns = column_leaves(ir, m) | {rid: acc(rid, ir) for level in m.levels for rid in level}
    col_builder = StageBuilder(ir, columns, row_kind(m), free_size=lambda n: m.width)
    col_sel = Selector(Layout(part="pt", free="1", free_alloc="1"), prefix=f"{TAG}c", column_engine=GPSIMD)
    needed = frontier(ir, columns, [o.node for o in m.tile_outputs], row_kind(m))
    exprs = {nid: col_builder.expr(nid) for nid in needed}  # all first: users counts must be complete
    outs = {o.name: col_builder.expr(src) for o, src in m.column_outputs}
    hoisted = {nid: col_sel.value(e) for nid, e in exprs.items()}
    required = [lower_column(col_sel, o, outs[o.name]) for o, _ in m.column_outputs if not o.optional]
    n_required = len(col_sel.lines)
    optional = [lower_column(col_sel, o, outs[o.name]) for o, _ in m.column_outputs if o.optional]
    # the combine over one chunk
    leaves = chunk_leaves(ir, m, resident, LOCAL) | columns | hoisted
    builder = StageBuilder(ir, leaves, row_kind(m), free_size=lambda n: m.width)
    sel = Selector(Layout(part="pt", free="hw", free_alloc="HB"), prefix=f"{TAG}e", column_engine=GPSIMD,
                   load=load)
    tile_exprs = {o.node: builder.expr(o.node) for o in m.tile_outputs}
    tiles = tuple(
        (kernel_arg(o.name), NL_DTYPE[o.dtype], output_value(sel, tile_exprs[o.node], o.dtype).code)
        for o in m.tile_outputs
    )
    passes = dataclasses.replace(low.passes, levels=levels, shared_loads=(), head_loads=(),
                                 chunk_bytes=chunk_bytes, constants=constants)  # fmt: skip
    return dataclasses.replace(
        low, passes=passes, epi_columns=tuple(col_sel.lines[:n_required]), epi_lines=tuple(sel.lines),
        save_lines=tuple(col_sel.lines[n_required:]), tile_outputs=tiles, required_columns=tuple(required),
        optional_columns=tuple(optional), model=low.model._replace(stream_epilogue=tile_bytes(sel)),
        constants=constants + tuple(col_sel.constants) + tuple(sel.constants), streamed=True,
        epi_loads=_used(loads, sel.lines),
    )  # fmt: skip


def _used(loads: list[Load], lines: tuple[str, ...] | list[str]) -> tuple[Load, ...]:
    """The loads whose tile `lines` read: a pass or the epilogue streams in only the inputs it uses."""
    return tuple(ld for ld in loads if any(f"{ld.tile}[" in line for line in lines))

