"""What the generated FFN kernel's program order puts in series, per piece (cost model II).

Standard library only, copied with the FFN planner into every generated FFN kernel. The trace model
(`fusegen/perf/schedule.py`) runs each engine's instructions in program order and gives a DMA the queues
from when its data is ready, so a transfer waiting on compute holds back every transfer after it; and a
PSUM tile takes a bank only once that bank's previous tile is evicted. `ffn_budget` adds these pieces to
the engines' busy times where the kernel's order keeps them from overlapping; each takes only documented
figures already in the model (`Machine`: DMA fixed cost, PE ramp, clocks; the DMA packet rule).
"""

from __future__ import annotations

from fusegen.codegen.budget_base import F_MOV, Machine, P, Stage, cdiv, dma_time, stage_cost

#: PSUM banks a core has (the target's 8, 2 KiB per partition each: nki.md §5)
PSUM_BANKS = 8


def pipelined(load: float, compute: float, units: int) -> float:
    """Time of `units` equal steps whose loads (`load` ns in all) feed their compute (`compute` ns): the
    slower side, plus the faster side's first step, which nothing overlaps."""
    return max(load, compute) + min(load, compute) / max(1, units)


def slice_period(up: float, combine: float, down: float, evict: float, n_evict: int, n_up: int) -> float:
    """Time of one chunk's row slice with the SBUF accumulator, its matmuls `up` then `down` on the PE:
    the down-projection waits `combine` ns after the last up-projection for the combines, and each of its
    `n_evict` PSUM tiles takes a bank freed by an eviction into the accumulator (`evict` ns in all, Vector
    engine). The next slice's up-projection tiles need `n_up` banks, so the PE starts it once all but
    PSUM_BANKS - n_up evictions are done: where the evictions are the slower side, they bound the slice."""
    waited = evict * max(0, n_evict - (PSUM_BANKS - n_up)) / max(1, n_evict)
    return up + combine + max(down, waited)


def drain(epi: Stage, mach: Machine, tiles: int, k: int, overlap: float = 0.0, width: int = F_MOV) -> float:
    """The epilogue of `tiles` row tiles after their last matmul. Its last pass runs in series: each
    K-block's output writes wait for its compute and hold back the next block's loads, so per block its
    loads (one fixed cost, when it reads any), its compute and its writes follow one another. The passes
    before it write nothing, so their loads stream beside their compute. Less `overlap` ns of matmuls that
    run beside it, but never less than one row tile's. Its blocks are `width` columns wide (K halves: one
    block of half of K)."""
    act, dve, moved, transfers = stage_cost(epi, tiles, k)
    transfers = transfers * cdiv(k, width) // cdiv(k, F_MOV)
    compute, dma = act / mach.act_ghz + dve / mach.dve_ghz, dma_time(mach, moved, transfers)
    sweeps = max(1, epi.sweeps)
    reads = tiles * cdiv(k, width) * mach.dma_fixed_ns if epi.read_bytes or epi.bcast else 0.0
    total = (compute + dma) / sweeps + reads + max(compute, dma) * (sweeps - 1) / sweeps
    return max(total / max(1, tiles), total - overlap)


def streamed(epi: Stage, mach: Machine, tiles: int, k: int) -> float:
    """The column-blocked kernel's statistics passes over the fp32 scratch of `tiles` row tiles, after their
    last matmul: no load waits for compute (the last pass issues each block's output writes after the next
    block's loads, `deferred_writes`), so every pass's loads stream beside their compute: the slower side
    plus the faster side's first block, after one fixed cost."""
    act, dve, moved, transfers = stage_cost(epi, tiles, k)
    compute, dma = act / mach.act_ghz + dve / mach.dve_ghz, dma_time(mach, moved, transfers)
    return pipelined(dma, compute, tiles * max(1, epi.sweeps) * cdiv(k, F_MOV)) + mach.dma_fixed_ns


def exchange(mach: Machine, own: int, k: int) -> float:
    """The SPLIT plans' partial-sum exchange after the last chunk, in series: the other core's rows out,
    the core barrier, this core's rows in, each direction with one fixed cost (the adds ride the epilogue)."""
    tiles = cdiv(own, P)
    out = dma_time(mach, own * k * 4, tiles)
    back = dma_time(mach, own * k * 4, tiles * cdiv(k, F_MOV))
    return out + back + 2 * mach.dma_fixed_ns
