"""SBUF budget of a generated row-reduction kernel and its choice of reduction chunk width HB.

Standard library only: `fusegen build` copies this module's code into every generated row-reduction
kernel, so the host function plans for runtime shapes with exactly the model the compiler used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

P = 128  # partitions: tokens per tile
F_MOV = 512  # one fp32 PSUM bank: the prep step broadcasts weights in chunks this wide


class RowModel(NamedTuple):
    """What a generated row-reduction kernel holds in SBUF, in bytes per partition per width column."""

    resident_per_head: int  # prepared fp32 weights kept for the whole launch, per head
    prep_scratch: int  # weight rows of the prep step per width column (0: it reads them in 512-column chunks)
    row_inputs: int  # [T, G, H] loads of one token tile and head (kept for the epilogue)
    epilogue: int  # full-width temporaries of the epilogue
    chunk: int  # temporaries of the widest reduction pass, per chunk column
    columns: int  # bytes of [P, 1] columns and per-head staging, per head
    row_copies: int = 1  # row inputs in flight: 2 when the next head's loads overlap this head's epilogue
    stream_epilogue: int = 0  # temporaries of the chunked epilogue of a streamed plan, per chunk column
    launch_tiles: int = 0  # bytes of launch-wide tiles independent of width and heads (the PE identity)
    diagonals: int = 0  # bytes of [P, P] PE stationaries per head, built with the per-row math (whole rows)
    tile_heads: int = 0  # 1: per-row math once per token tile, its heads holding their rows until then


class Buffer(NamedTuple):
    """One SBUF buffer of the kernel: bytes per partition per copy, and copies in flight."""

    name: str
    bytes: int
    copies: int


def cdiv(n: int, d: int) -> int:
    """Ceiling division."""
    return -(-n // d)


def rows_per_core(rows: int, lnc: int) -> int:
    """Rows one core handles: whole 128-row tiles are dealt out, the ragged tile goes last."""
    return min(rows, cdiv(cdiv(rows, P), lnc) * P)


def held_heads(heads: int, resident: bool) -> int:
    """Heads whose prepared weights are in SBUF at once: all of them, or the current one when streaming."""
    return heads if resident else 1


#: `overlap` levels: each head's epilogue at once; after the next head's passes; a token tile's heads
#: pending until the per-row math after its last head (RowModel.tile_heads), their epilogues two heads later
SERIAL = 0
HEADS = 1
TILE = 2


def buffers(m: RowModel, width: int, heads: int, hb: int, resident: bool = True, overlap: int = HEADS,
            streamed: bool = False) -> list[Buffer]:  # fmt: skip
    """The kernel's SBUF buffers at width `width`, `heads` heads and reduction chunk `hb` columns (overlap:
    a level above; streamed: rows are read from HBM chunk by chunk in every pass and the epilogue; only the
    weights stay width-long)."""
    kept = "resident for the launch" if resident else "rebuilt per token tile and head"
    tiled = m.tile_heads if overlap == TILE else 0
    # rebuilt weights overlapped: each pending head keeps its own until its epilogue has run
    rebuilt = 2 + tiled * heads if overlap and not resident and not streamed else 1
    weights = Buffer(
        f"prepared weights (fp32, {kept})", m.resident_per_head * held_heads(heads, resident) * width, rebuilt
    )
    identity = Buffer("launch-wide tiles (the Tensor engine's identity)", m.launch_tiles, 1)
    fixed = [identity] if m.launch_tiles else []
    if streamed:
        return [
            *fixed,
            weights,
            Buffer("row input chunks (streamed from HBM)", m.row_inputs * hb, 1),
            Buffer("epilogue chunk temporaries", m.stream_epilogue * hb, 1),
            Buffer("reduction chunk temporaries", m.chunk * hb, 1),
            Buffer("per-row columns and output staging", m.columns * heads, 1),
        ]
    return [
        *fixed,
        weights,
        # per-tile math: a tile's heads keep their rows until the chain after its last head, and two tiles'
        # diagonals are alive (the next tile's are built before this tile's last epilogue)
        Buffer("row inputs of one token tile and head", m.row_inputs * width,
               m.row_copies + tiled * heads if overlap else 1),
        # overlapped: a head's output tiles wait for their stores until the next-but-one head's loads queue
        Buffer("epilogue tiles", m.epilogue * width, 2 if overlap else 1),
        Buffer("reduction chunk temporaries", m.chunk * hb, 1),
        Buffer("per-row columns and output staging", (m.columns + m.diagonals * (1 + tiled)) * heads, 1),
    ]


def sbuf_bytes(m: RowModel, width: int, heads: int, hb: int, resident: bool = True, overlap: int = HEADS,
               streamed: bool = False) -> int:  # fmt: skip
    """Peak SBUF bytes per partition: the main loop, or the prep step if that is larger."""
    main = sum(b.bytes * b.copies for b in buffers(m, width, heads, hb, resident, overlap, streamed))
    prep = (m.resident_per_head * held_heads(heads, resident) + m.prep_scratch) * width
    return max(main, prep)


def overlaps(m: RowModel, width: int, heads: int, hb: int, resident: bool, budget: int) -> int:
    """The deepest overlap level whose row inputs the plan (hb, resident) leaves room for."""
    levels = (TILE, HEADS) if m.tile_heads else (HEADS,)
    return next((lv for lv in levels if sbuf_bytes(m, width, heads, hb, resident, lv) <= budget), SERIAL)


def choose(m: RowModel, width: int, heads: int, budget: int) -> tuple[int, bool]:
    """(HB, resident): prepared weights resident if they fit, else rebuilt per token tile and head (their
    weights re-read once per 128 tokens), with heads overlapped if that fits too; then the fewest reduction
    chunks, each the narrowest multiple of 128 for that count."""
    plan = _kept_plan(m, width, heads, budget)
    if plan is None:
        least = "128-column chunks and one head's weights at a time"
        raise _refusal(m, width, heads, budget, _kept_plan, False, least)
    return plan


def _refusal(m: RowModel, width: int, heads: int, budget: int, plan: Callable[..., object], streamed: bool,
             least: str) -> ValueError:  # fmt: skip
    """No `plan` fits: what its least SBUF-hungry form (`least`) needs, and the widest width it fits."""
    need = sbuf_bytes(m, width, heads, P, False, SERIAL, streamed)
    widest = _widest(lambda w: plan(m, w, heads, budget) is not None, width)
    return ValueError(
        f"no tile plan fits: width {width} with {heads} head(s) needs {need} B/partition of SBUF even with "
        f"{least}; the budget is {budget} B, {_fitting(widest, heads)}"
    )


def _kept_plan(m: RowModel, width: int, heads: int, budget: int) -> tuple[int, bool] | None:
    """`choose`'s (HB, resident) with whole rows kept in SBUF, or None when none fits."""
    for resident in (True, False):
        for overlap in (HEADS, SERIAL):
            fixed = sbuf_bytes(m, width, heads, 0, resident, overlap)
            room = (budget - fixed) // m.chunk if m.chunk else width
            widest = min(cdiv(width, P) * P, room // P * P)
            if widest >= P and sbuf_bytes(m, width, heads, P, resident, overlap) <= budget:
                return cdiv(cdiv(width, cdiv(width, widest)), P) * P, resident
    return None


def choose_rows(m: RowModel, width: int, heads: int, budget: int) -> tuple[int, bool, int, bool]:
    """(HB, resident, overlap, streamed): whole rows kept in SBUF (`choose`) when they fit, as their inputs
    then cross HBM once; else rows streamed from HBM in the widest chunks that fit, once per reduction pass
    and once more for the epilogue."""
    plan = _rows_plan(m, width, heads, budget)
    if plan is None:
        least = ("rows streamed from HBM in 128-column chunks and one head's weights at a time (the prepared "
                 "weights stay width-long)")  # fmt: skip
        raise _refusal(m, width, heads, budget, _rows_plan, True, least)
    return plan


def _rows_plan(m: RowModel, width: int, heads: int, budget: int) -> tuple[int, bool, int, bool] | None:
    """`choose_rows`'s plan, or None when none fits."""
    kept = _kept_plan(m, width, heads, budget)
    if kept is not None:
        hb, resident = kept
        return hb, resident, overlaps(m, width, heads, hb, resident, budget), False
    per_column = m.row_inputs + m.stream_epilogue + m.chunk
    for resident in (True, False):
        room = budget - sbuf_bytes(m, width, heads, 0, resident, SERIAL, True)
        widest = min(cdiv(width, P) * P, room // per_column // P * P)
        if widest >= P and sbuf_bytes(m, width, heads, P, resident, SERIAL, True) <= budget:
            return cdiv(cdiv(width, cdiv(width, widest)), P) * P, resident, SERIAL, True
    return None


def _widest(fits: Callable[[int], bool], width: int) -> int:
    """The widest width below `width` that `fits` (0: none); a refusal names it, so the caller knows how
    far to shrink (or where to split the row). Every buffer grows with the width, so fitting is monotone."""
    low, high = 0, width  # fits(low) or low == 0; not fits(high)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def _fitting(widest: int, heads: int) -> str:
    """The limit in words, after the budget."""
    return f"which fits {f'width <= {widest}' if widest else 'no width'} at {heads} head(s)"
