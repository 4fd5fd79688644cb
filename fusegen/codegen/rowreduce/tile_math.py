"""The per-row math of a token tile's heads at once: the epilogue lowered again with a span (select_span.py).

The forward kernel runs its per-row math (rstd, a scale, a gate: a chain of one-column Scalar steps, each
at the instruction's fixed cost) once per token tile and head. When a spec has a heads axis, the Selector
emits the same chain once per token tile over the columns `c0:c1` (all heads) of `[P, G]` tiles, reading
each head's statistics from its column of `<acc>_t` (copied there at the end of its passes); the epilogue
then reads column `hc` and diagonal `hc`. Where a tile cannot wait for its last head (the kernel's last
tile, or no SBUF for the pending heads) each head runs the same chain, `_row_math`, over columns 0:1 of
`[P, 1]` tiles of its own, reading its accumulators directly, and the same epilogue with hc = 0: the
per-head lowering's instructions (on shared `[P, HC]` tiles each head's chain would wait for the next
head's writes: the cost model orders every access to one tile). docs/performance.md, second pass, step 12.
"""

from __future__ import annotations

import dataclasses

from fusegen.codegen.rowreduce.lower import (
    RowReduceLowering,
    acc,
    balanced,
    lower_epilogue,
    lower_passes,
)
from fusegen.codegen.rowreduce.match import RowReduceMatch
from fusegen.codegen.select_span import COLUMN_OF_HEAD, Span
from fusegen.codegen.select_tables import EngineLoad
from fusegen.codegen.stage import dim_source
from fusegen.dsl.ir import KernelIR

#: the trace-time condition of the Scalar engine's share of PE-formed evictions: set per head, true for a
#: tile's first head, whose epilogue runs while the Scalar engine has no chain of the next tile's yet
SHARE = "share"


def tiled(ir: KernelIR, m: RowReduceMatch, low: RowReduceLowering
          ) -> tuple[RowReduceLowering, RowReduceLowering | None]:  # fmt: skip
    """(`low` as the per-head helpers of a kernel with the per-tile chain run it, the per-tile lowering);
    (`low`, None) where the per-row prefix reads a per-head value other than an accumulator (a hoisted pass
    value, a column load), which the per-tile chain would not have."""
    if low.streamed or not low.epi_columns:
        return low, None
    return balanced(lambda load: _tiled(ir, m, low, load))


def _tiled(ir: KernelIR, m: RowReduceMatch, low: RowReduceLowering, load: EngineLoad
           ) -> tuple[RowReduceLowering, RowReduceLowering | None]:  # fmt: skip
    """`tiled` with the full-width steps balanced by `load`, counted as the per-head lowering counts them
    (the passes, then the epilogue), so every choice is the per-head lowering's."""
    passes = lower_passes(ir, m, load, pe_staging=True)
    span = Span(dim_source(m.heads), frozenset(acc(rid).name for level in m.levels for rid in level))
    epi, n_required, _, col_outs = lower_epilogue(ir, m, passes.resident, load, span,
                                                  SHARE if low.scalar_share else "")  # fmt: skip
    if span.foreign or span.end == 0:
        return low, None
    shared = dataclasses.replace(
        low, epi_lines=tuple(epi.lines[span.end:n_required]), save_lines=tuple(epi.lines[n_required:]),
        required_columns=tuple(c for c in col_outs if not c.optional),
        optional_columns=tuple(c for c in col_outs if c.optional),
        tile_math=tuple(epi.lines[:span.end]), tile_accs=tuple(sorted(span.read_accs)),
        model=low.model._replace(tile_heads=1),
    )  # fmt: skip
    tile = dataclasses.replace(
        shared, epi_columns=span.copies(), tile_allocs=span.allocs(span.heads) + span.stats_allocs(),
        head_state=_state("h", "h == 0", low.scalar_share),
    )  # fmt: skip
    head = dataclasses.replace(shared, epi_columns=span.allocs("1"), head_math=True,
                               head_state=_state("0", "False", low.scalar_share))  # fmt: skip
    return head, tile


def _state(column: str, share: str, scalar_share: bool) -> tuple[str, ...]:
    """The lines that end a head's passes: its column of the chain's tiles, and the Scalar share's flag."""
    return (f"{COLUMN_OF_HEAD} = {column}",) + ((f"{SHARE} = {share}",) if scalar_share else ())
