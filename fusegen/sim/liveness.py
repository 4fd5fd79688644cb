"""Capacity check by interval liveness, and PSUM bank assignment.

An allocation is live from its first to its last access in the instance's program order (like a
compiler allocator without double buffering). Peak SBUF bytes per partition must fit the target's
usable budget; concurrently live PSUM tiles must fit the 8 banks.
"""

from __future__ import annotations

import math
from typing import Any

from .context import Context
from .errors import CapacityError
from .memory import MemoryRegion, Span
from .trace import OPERANDS, PSUM_BANK


def _peak(spans: list[Span], size: dict[int, int]) -> tuple[int, int]:
    """(peak total size, first instruction index where it occurs) over live intervals."""
    deltas: dict[int, int] = {}
    for a in spans:
        assert a.first_use is not None and a.last_use is not None
        deltas[a.first_use] = deltas.get(a.first_use, 0) + size[a.id]
        deltas[a.last_use + 1] = deltas.get(a.last_use + 1, 0) - size[a.id]
    peak, at, running = 0, 0, 0
    for pos in sorted(deltas):
        running += deltas[pos]
        if running > peak:
            peak, at = running, pos
    return peak, at


def _live_at(spans: list[Span], pos: int) -> list[Span]:
    """Allocations live at instruction `pos`, biggest first."""
    live = [a for a in spans if a.first_use is not None and a.first_use <= pos <= (a.last_use or 0)]
    return sorted(live, key=lambda a: -a.bytes_per_partition)


def _overflow(ctx: Context, what: str, used: str, limit: str, pos: int, live: list[Span]) -> CapacityError:
    """A CapacityError located at the peak instruction, listing the biggest live buffers."""
    file, line = ctx.sites[pos]
    biggest = "; ".join(
        f"{a.label()} {a.bytes_per_partition} B/partition allocated at {a.site[0]}:{a.site[1]}"
        for a in live[:5]
    )
    return CapacityError(
        f"{file}:{line}: core {ctx.core} {what} peak {used} exceeds {limit} "
        f"(interval liveness, at instruction #{pos}); biggest live: {biggest}"
    )


def _assign_banks(ctx: Context, psum: list[Span], banks: dict[int, int]) -> None:
    """Greedy first-fit of contiguous banks in first-use order (optimal for interval graphs)."""
    total = ctx.target.psum_banks
    active: list[Span] = []
    for a in sorted(psum, key=lambda a: a.first_use or 0):
        active = [b for b in active if (b.last_use or 0) >= (a.first_use or 0)]
        taken = {b.bank_base + i for b in active if b.bank_base is not None for i in range(banks[b.id])}
        base = next(
            (s for s in range(total - banks[a.id] + 1) if not taken & set(range(s, s + banks[a.id]))), None
        )
        if base is None:
            raise _overflow(
                ctx,
                "PSUM",
                f"{len(taken) + banks[a.id]} banks",
                f"{total} banks (fragmented)",
                a.first_use or 0,
                _live_at(psum, a.first_use or 0),
            )
        a.bank_base = base
        active.append(a)


def check_instance(ctx: Context) -> dict[str, Any]:
    """Verify SBUF/PSUM capacity for one finished instance; return its usage statistics."""
    used = [a for a in ctx.spans if a.first_use is not None]
    sbuf = [a for a in used if a.region is MemoryRegion.sbuf]
    psum = [a for a in used if a.region is MemoryRegion.psum]
    tgt = ctx.target
    sbuf_peak, sbuf_at = _peak(sbuf, {a.id: a.bytes_per_partition for a in sbuf})
    if sbuf_peak > tgt.sbuf_usable_bytes:
        budget = f"the {tgt.name} budget {tgt.sbuf_usable_bytes}"
        raise _overflow(ctx, "SBUF", f"{sbuf_peak} B/partition", budget, sbuf_at, _live_at(sbuf, sbuf_at))
    banks = {a.id: max(1, math.ceil(a.bytes_per_partition / tgt.psum_bank_bytes)) for a in psum}
    psum_peak, psum_at = _peak(psum, banks)
    if psum_peak > tgt.psum_banks:
        raise _overflow(
            ctx, "PSUM", f"{psum_peak} banks", f"{tgt.psum_banks} banks", psum_at, _live_at(psum, psum_at)
        )
    _assign_banks(ctx, psum, banks)
    _resolve_bank_numbers(ctx, {a.id: a.bank_base or 0 for a in psum})
    return {
        "sbuf_peak_bytes": sbuf_peak,
        "sbuf_peak_site": ctx.sites[sbuf_at] if sbuf else None,
        "psum_peak_banks": psum_peak,
        "instructions": len(ctx.records),
    }


def _resolve_bank_numbers(ctx: Context, base: dict[int, int]) -> None:
    """Turn tile-relative PSUM bank numbers in the records into absolute ones."""
    records = ctx.records
    for i, row in enumerate(records):
        if row[PSUM_BANK] is None:
            continue
        dst = next((op[1] for op in row[OPERANDS] if op[0] == "w" and op[2] == "psum"), None)
        if dst is not None and base.get(dst, 0):
            records[i] = (*row[:PSUM_BANK], row[PSUM_BANK] + base[dst], *row[PSUM_BANK + 1 :])
