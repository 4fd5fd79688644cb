"""What a column-blocked FFN super-block's program order puts in series (cost model II), and the fill every
super-block starts with.

Standard library only, copied with the FFN planner into every generated FFN kernel. The trace model
(`fusegen/perf/schedule.py`) runs each engine's instructions in program order and gives a DMA the queues
from when its data is ready, so a transfer waiting on compute holds back every transfer after it. Each
term takes only documented figures already in the model (`Machine`: DMA fixed cost, PE ramp, clocks; the
DMA packet rule through `dma_time`).
"""

from __future__ import annotations

from fusegen.codegen.budget_base import (
    F_MOV,
    MIN_CYCLES,
    Machine,
    P,
    cdiv,
    cycles,
    dma_time,
    runs,
    stage_cost,
)
from fusegen.codegen.ffn.sbuf import FfnModel, Plan, down_group, group, h_group, x_staged
from fusegen.codegen.ffn.serial import PSUM_BANKS, pipelined, streamed


def column_chain(
    m: FfnModel,
    mach: Machine,
    s_rows: int,
    inter: int,
    k: int,
    plan: Plan,
    lead: tuple[float, float] = (0.0, 0.0),
) -> float:
    """Time of one column-blocked super-block. x's loads and transposes come first (`super_block_fill`).
    Each chunk's h^T writes issue behind all of the next chunk's loads, so they are ready when the queues
    reach them: the chunks' weight loads and h^T writes pipeline with their matmuls (`pipelined`), and the
    last combine and its h^T writes are in series before the column blocks read h^T back. Each column
    block's eviction loads are issued with that block's own loads (`ffn_column_blocks.py.jinja`), and each
    block is evicted after the next block's loads and matmuls are issued, so its eviction writes queue
    behind those loads: the blocks' weight tiles, h^T reads, eviction loads and eviction writes (all but
    the last block's writes) pipeline with their matmuls, the evictions beside them on the Vector engine,
    after one fixed cost and a fresh PE ramp; the last block's eviction and its writes (its loads long
    landed) follow the last matmul, then an epilogue with row statistics runs its passes over the fp32
    scratch, streamed (`streamed`): the next super-block's x loads queue behind its writes. With h^T held
    (HT) nothing is written or read back: the first block's loads queue right behind the last chunk's and
    its matmuls follow the up-projection's on the PE, so chunks and blocks are one pipelined stream, unless
    the combines run behind it (`_combine_lag`). `lead`: how long the [I] columns, loaded once, hold back
    the first super-block's PE stream (`_col_loads` in `budget`) and its first combine (`col_lead`); where
    the combines bound the chain, the PE's wait for the columns is beside them."""
    n_k, n_it = cdiv(k, P), cdiv(inter, P)
    stall = mach.dma_fixed_ns + mach.pe_ramp_ns  # the first load's fixed cost, then a cold PE
    width = max(MIN_CYCLES, min(s_rows, F_MOV))
    combine = m.mid_act * width / mach.act_ghz + m.mid_dve * width / mach.dve_ghz  # the last I-tile's
    loads = mm = writes = 0.0
    for chunk, n_chunks in runs(inter, plan.ci):  # the last run holds the last chunk
        units = m.n_up * cdiv(chunk, P)  # one projection's weights of one I-tile per step
        weights = dma_time(mach, units * n_k * P * P * m.up_bytes, units * cdiv(n_k, group(k, plan.g)))
        h_t = dma_time(mach, chunk * s_rows * m.x_bytes, cdiv(chunk, P) * cdiv(s_rows, F_MOV))
        writes = (1 - plan.ht) * h_t
        loads += n_chunks * (weights + writes)
        mm += sum(n * n_chunks * units * n_k * max(MIN_CYCLES, rw) for rw, n in runs(s_rows, F_MOV))
    mm /= mach.pe_ghz
    b_loads, b_mm, evicts, evict = _blocks(m, mach, s_rows, inter, k, plan)
    steps = m.n_up * n_it + n_it * cdiv(k, plan.kc)
    lag = _combine_lag(m, mach, s_rows, inter, k, plan, b_mm) + lead[1]
    if plan.ht:
        body = max(pipelined(loads + b_loads, mm + b_mm, steps) + lead[0], evicts, lag)
    else:
        chunks = max(pipelined(loads, mm, m.n_up * n_it) + lead[0] + combine, lag) + stall + writes
        body = chunks + max(pipelined(b_loads, b_mm, n_it * cdiv(k, plan.kc)), evicts)
    tail = streamed(m.epi_cols, mach, cdiv(s_rows, P), k) if m.epi_cols.sweeps else 0.0  # after the blocks
    return super_block_fill(m, mach, s_rows, k, plan.ht) + body + stall + evict + tail


def _combine_lag(
    m: FfnModel, mach: Machine, s_rows: int, inter: int, k: int, plan: Plan, b_mm: float
) -> float:
    """When a super-block's combines have run, ns after its fill: each I-tile's combine waits for that
    I-tile's up-projection and the Vector engine runs them in I-tile order, so where a combine is slower
    than an I-tile's up-projection they run back to back from the first one's start (after the first
    I-tile's up-projection) and the PE's matmuls get ahead of them. Without HT: the last combine's end (its
    h^T writes follow). With HT, the blocks' matmuls, all `b_mm` ns of them, follow on the PE: the first
    block's PSUM tiles take the banks whose up-projection tiles are released first (the trace model's
    allocator, `perf/schedule.py`; 8 banks, nki.md §4), so they wait for the combines of the oldest I-tiles
    the banks hold; and the last I-tile's matmuls of the first block, with every later block's, wait for
    the last combine. Where the combines are the faster side this is below the pipelined stream and
    changes nothing."""
    n_it = cdiv(inter, P)
    pass_ns = m.mid_act / mach.act_ghz + m.mid_dve / mach.dve_ghz  # one I-tile's combine, per column
    combine = sum(n * pass_ns * max(MIN_CYCLES, rw) for rw, n in runs(s_rows, F_MOV))  # over every slice
    start = up_tile(m, mach, s_rows, k, plan.g)[0]  # the first row slice's of the first I-tile
    if not plan.ht:
        return start + n_it * combine
    tiles = m.n_up * n_it  # the up-projection's PSUM tiles in program order; the banks hold the last `held`
    held = min(PSUM_BANKS, tiles)
    needed = max(0, cdiv(s_rows, P) * cdiv(min(plan.kc, k), F_MOV) - (PSUM_BANKS - held))
    freed = (tiles - held + needed - 1) // m.n_up + 1 if needed else 0  # combines that release them
    last = b_mm - (n_it - 1) * cdiv(s_rows, P) * cycles(min(plan.kc, k)) / mach.pe_ghz
    return start + max(freed * combine + b_mm, n_it * combine + last)


def up_tile(m: FfnModel, mach: Machine, s_rows: int, k: int, g: int) -> tuple[float, float]:
    """(matmuls, weight loads) of one I-tile's up-projection over a super-block's first row slice, ns."""
    n_k = cdiv(k, P)
    up = m.n_up * n_k * max(MIN_CYCLES, min(s_rows, F_MOV)) / mach.pe_ghz
    return up, dma_time(mach, m.n_up * n_k * P * P * m.up_bytes, m.n_up * cdiv(n_k, group(k, g)))


def col_load(m: FfnModel, mach: Machine, i: int) -> float:
    """Transfer time of the [I] columns (one packed input), ns; 0 without any."""
    return dma_time(mach, m.col_vectors * P * cdiv(i, P) * 4, min(1, m.col_vectors))


def col_lead(m: FfnModel, mach: Machine, s_rows: int, k: int, i: int, inter: int, plan: Plan) -> float:
    """How long the [I] columns hold back the first combine beyond the first I-tile's up-projection: the
    kernel loads them once, behind the up weights of the first I-tiles whose PSUM tiles the banks hold
    (`ffn_kernel.py.jinja`), and the combine reads them."""
    cols = col_load(m, mach, i)
    if not cols:
        return 0.0
    up, weights = up_tile(m, mach, s_rows, k, plan.g)
    return max(0.0, ahead_tiles(m, inter, plan) * weights + cols - weights - up)


def ahead_tiles(m: FfnModel, i: int, plan: Plan) -> int:
    """I-tiles whose up weights the kernel loads before the [I] columns: the first chunk's, at most as many
    as the PSUM banks hold up-projection tiles of."""
    return min(cdiv(min(plan.ci, i), P), PSUM_BANKS // m.n_up)


def _blocks(m: FfnModel, mach: Machine, s_rows: int, inter: int, k: int, plan: Plan) -> tuple[float, ...]:
    """(loads, matmuls, evictions beside them, what follows the last matmul) of a super-block's column
    blocks, ns: per block its weights (a group of I-tiles per DMA, whole padded tiles), its h^T reads (none
    with HT) and its eviction's loads, issued with the block's own; the evictions and their writes of every
    block but the last; the last block's eviction, piece by piece with each piece's writes behind it,
    after the last matmul (the next super-block's x loads queue behind those writes)."""
    n_rs, n_it = cdiv(s_rows, P), cdiv(inter, P)
    gh = h_group(plan.s, inter, m.x_bytes)
    loads = mm = evicts = 0.0
    for kw, n_blocks in runs(k, plan.kc):
        evict_act, evict_dve, moved, transfers = stage_cost(m.evict, n_rs, kw, shared=n_rs)
        evict = evict_act / mach.act_ghz + evict_dve / mach.dve_ghz
        written, n_writes = _evict_writes(m, n_rs, kw)
        writes = dma_time(mach, written, n_writes)
        h_bytes, h_reads = (0, 0) if plan.ht else (inter * s_rows * m.x_bytes, cdiv(n_it, gh))
        weights = n_it * P * kw * m.down_bytes
        w_reads = cdiv(n_it, down_group(plan.kc, inter, m.down_bytes, plan.ht))
        loads += n_blocks * (dma_time(mach, weights + h_bytes, w_reads + h_reads) + writes)
        loads += n_blocks * dma_time(mach, moved, transfers - n_writes)  # `moved`: the eviction's loads
        mm += n_blocks * n_it * n_rs * cycles(kw) / mach.pe_ghz
        evicts += n_blocks * evict
    pieces = n_rs * cdiv(kw, F_MOV)  # the last run's: the last block's, each piece's writes behind it
    return loads - writes, mm, evicts - evict, pipelined(writes, evict, pieces)


def _evict_writes(m: FfnModel, n_rs: int, kw: int) -> tuple[int, int]:
    """(bytes, transfers) of one column block's eviction writes: each [P, F_MOV] piece of each row tile to
    the fp32 scratch when an epilogue with row statistics follows, else to the outputs (`lower_eviction`)."""
    per_piece = m.evict.loads - m.evict.bcast - m.evict_rows  # the eviction's transfers besides its loads
    nbytes = 4 if m.epi_cols.sweeps else m.out_bytes
    return n_rs * P * kw * nbytes, n_rs * cdiv(kw, F_MOV) * per_piece


def super_block_fill(m: FfnModel, mach: Machine, s_rows: int, k: int, ht: int = 0) -> float:
    """Time before a super-block's first matmul: x's loads (the previous super-block's output writes held
    the queues until they were done) with one fixed cost, then the PE's transposes into x^T."""
    n_rs = cdiv(s_rows, P)
    loads = dma_time(mach, s_rows * k * m.x_bytes, n_rs * cdiv(k, x_staged(m, k, ht))) + mach.dma_fixed_ns
    return loads + n_rs * cdiv(k, P) * P / mach.pe_ghz
