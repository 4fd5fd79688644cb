"""The per-row math of a token tile's heads at once: the epilogue lowered again with a span (select_span.py).

The forward kernel runs its per-row math (rstd, a scale, a gate: a chain of one-column Scalar steps, each
at the instruction's fixed cost) once per token tile and head. When a spec has a heads axis, the Selector
emits the same chain once per token tile over the columns `c0:c1` (all heads) of `[P, G]` tiles, reading
each head's statistics from its column of `<acc>_t` (copied there at the end of its passes); the epilogue
then reads column h and diagonal h. Where a tile cannot wait for its last head (the kernel's last tile, or
no SBUF for the pending heads) the kernel runs the per-head lowering unchanged: on shared `[P, HC]` tiles
each head's chain would wait for the next head's writes (the cost model orders every access to one
tile). docs/performance.md, second pass, step 12.
"""

from __future__ import annotations

import dataclasses

from fusegen.codegen.rowreduce.lower import RowReduceLowering, acc, balanced, lower_epilogue, lower_passes
from fusegen.codegen.rowreduce.match import RowReduceMatch
from fusegen.codegen.select_span import Span
from fusegen.codegen.select_tables import EngineLoad
from fusegen.codegen.stage import dim_source
from fusegen.dsl.ir import KernelIR

#: the trace-time condition of the Scalar engine's share of PE-formed evictions: the tile's first head,
#: whose epilogue runs while the Scalar engine has no chain of the next tile's yet
SHARE_WHEN = "h == 0"


def tiled(ir: KernelIR, m: RowReduceMatch, low: RowReduceLowering) -> RowReduceLowering:
    """`low`'s per-tile variant: its per-row prefix run once per token tile on `[P, heads]` columns; or `low`
    itself where the prefix reads a per-head value other than an accumulator (a hoisted pass value, a
    column load), which the per-tile chain would not have."""
    if low.streamed or not low.epi_columns:
        return low
    return balanced(lambda load: _tiled(ir, m, low, load))


def _tiled(ir: KernelIR, m: RowReduceMatch, low: RowReduceLowering, load: EngineLoad) -> RowReduceLowering:
    """`tiled` with the full-width steps balanced by `load`, counted as the per-head lowering counts them
    (the passes, then the epilogue), so every choice is the per-head lowering's."""
    passes = lower_passes(ir, m, load, pe_staging=True)
    span = Span(dim_source(m.heads), frozenset(acc(rid).name for level in m.levels for rid in level))
    share = SHARE_WHEN if low.scalar_share else ""
    epi, n_required, _, col_outs = lower_epilogue(ir, m, passes.resident, load, span, share)
    if span.foreign or span.end == 0:
        return low
    return dataclasses.replace(
        low, epi_columns=span.copies(), epi_lines=tuple(epi.lines[span.end:n_required]),
        save_lines=tuple(epi.lines[n_required:]),
        required_columns=tuple(c for c in col_outs if not c.optional),
        optional_columns=tuple(c for c in col_outs if c.optional),
        tile_allocs=tuple(span.allocs) + span.stats_allocs(), tile_math=tuple(epi.lines[:span.end]),
        model=low.model._replace(tile_heads=1),
    )  # fmt: skip
