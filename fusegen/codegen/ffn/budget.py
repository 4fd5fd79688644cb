"""SBUF budget and modelled time of a generated FFN kernel, and its choice of tiles and core split.

Standard library only: `fusegen build` copies this module's code into every generated FFN kernel, so
the host function plans for runtime shapes with exactly the model the compiler used. The time model
is closed-form over this kernel's loop nest; per-instruction costs follow shared/reference/nki.md §6
([SDK@2.26] ISA cost tables, the v2/v3 architecture guides); fusegen/perf checks it against a
schedule of the interpreter's trace.
"""

from __future__ import annotations

import functools

from fusegen.codegen.budget_base import (
    F_MOV,
    MIN_CYCLES,
    Cost,
    Machine,
    P,
    cdiv,
    cycles,
    dma_time,
    row_tiles,
    rows_per_core,
    runs,
    stage_cost,
)
from fusegen.codegen.ffn.column_time import (
    ahead_tiles,
    col_lead,
    col_load,
    column_chain,
    super_block_fill,
    up_tile,
)
from fusegen.codegen.ffn.sbuf import (
    ACC_BANKS,
    DOWN_PAIRS,
    SBUF_HEADROOM,
    FfnModel,
    Plan,
    column_block,
    down_group,
    group,
    h_group,
    k_halves,
    min_group,
    plan_bytes,
    sbuf_bytes,
    smallest_need,
    solo_tile,
    streams_up,
    work_per_core,
    x_staged,
)
from fusegen.codegen.ffn.serial import drain, exchange, pipelined, slice_period


def _super_block(
    m: FfnModel,
    s_rows: int,
    inter: int,
    ci: int,
    k: int,
    kc: int = 0,
    g: int = 0,
    s: int = 0,
    solo: tuple[int, int] = (0, 0),
    ht: int = 0,
) -> tuple[float, float, float, int, int]:
    """(PE, ACT, DVE cycles, DMA bytes, transfers) of one super-block of `s_rows` rows, `inter` columns, and
    split 3's odd I-tile (`solo`: the rows this core owns, the tile's columns) over those rows only; `ht`:
    the column blocks read h^T held in SBUF."""
    n_k = cdiv(k, P)
    k_cycles = cycles(k)  # one row tile's K, 512 wide
    act, dve, hbm, transfers = stage_cost(m.pro, cdiv(s_rows, P), k)
    pe = 0.0
    # x's rows read a staged block per transfer; each K-tile transposed on the PE into PSUM and copied
    # out, even K-tiles on DVE, odd ones on ACT
    hbm, transfers = hbm + s_rows * k * m.x_bytes, transfers + cdiv(s_rows, P) * cdiv(k, x_staged(m, k, ht))
    for rows_t, n_t in runs(s_rows, P):
        pe += n_t * n_k * max(MIN_CYCLES, rows_t)
        dve += n_t * (n_k - n_k // 2) * max(MIN_CYCLES, rows_t)
        act += n_t * (n_k // 2) * max(MIN_CYCLES, rows_t)
    if m.fold_bias and not kc:  # one [P, F_MOV] piece of the bias per eviction of the first chunk
        hbm += cdiv(s_rows, P) * P * k * 4
        transfers += cdiv(s_rows, P) * cdiv(k, F_MOV)
    for chunk, n_chunks in runs(inter, ci):
        n_hc = cdiv(chunk, P)
        # up weights: each I-tile's K-tile groups, whole padded tiles (up_layout); down: [ph, K] rows
        hbm += n_chunks * (m.n_up * n_hc * P * n_k * P * m.up_bytes + (0 if kc else k * chunk * m.down_bytes))
        transfers += n_chunks * (m.n_up * n_hc * cdiv(n_k, group(k, g)) + (0 if kc else n_hc))
        for rw, n_rw in runs(s_rows, F_MOV):
            width, times = max(MIN_CYCLES, rw), n_chunks * n_rw * n_hc
            act += times * m.mid_act * width
            dve += times * m.mid_dve * width
            if kc:  # each combine tile [ph, rw] written to the h^T scratch (unless held)
                pe += times * m.n_up * n_k * width
                hbm += (1 - ht) * n_chunks * n_rw * chunk * rw * m.x_bytes
                transfers += (1 - ht) * times
                continue
            pe += times * (m.n_up * n_k * width + cdiv(rw, P) * k_cycles)
            dve += n_chunks * n_rw * cdiv(rw, P) * k_cycles  # PSUM evictions into the accumulator
    if solo[0]:  # its weights, its up-projection over the owned rows, their down-projection (no own eviction)
        width = max(MIN_CYCLES, solo[0])
        pe += m.n_up * n_k * width + cdiv(solo[0], P) * k_cycles
        act, dve = act + m.mid_act * width, dve + m.mid_dve * width
        hbm += m.n_up * P * n_k * P * m.up_bytes + k * solo[1] * m.down_bytes
        transfers += m.n_up * cdiv(n_k, group(k, g)) + 1
    if kc:
        parts = _column_blocks(m, s_rows, inter, k, kc, h_group(s, inter, m.x_bytes), ht)
        pe, act, dve = pe + parts[0], act + parts[1], dve + parts[2]
        hbm, transfers = hbm + parts[3], transfers + parts[4]
    return pe, act, dve, hbm, transfers


def _column_blocks(
    m: FfnModel, s_rows: int, inter: int, k: int, kc: int, gh: int, ht: int
) -> tuple[float, float, float, int, int]:
    """(PE, ACT, DVE cycles, DMA bytes, transfers) of the column-blocked down-projection of one super-block:
    per KC block, its weight tiles in groups of `down_group` I-tiles and h^T in groups of `gh` I-tiles (a
    ragged last I-tile in a group reads on its own; none with h^T held in SBUF, `ht`) and its matmuls
    accumulated in PSUM, then each [P, F_MOV] piece evicted once (the `evict` stage) and written to the
    fp32 scratch, if an epilogue with row statistics follows (else the eviction wrote the outputs)."""
    n_it, n_rs = cdiv(inter, P), cdiv(s_rows, P)
    act, dve, moved, transfers = stage_cost(m.evict, n_rs, k, shared=n_rs)
    blocks = cdiv(k, kc)
    scratch = s_rows * k * 4 if m.epi_cols.sweeps else 0
    hbm = n_it * P * k * m.down_bytes + (1 - ht) * blocks * inter * s_rows * m.x_bytes + moved + scratch
    h_reads = 0 if ht else cdiv(n_it, gh) + int(inter % P != 0 and (n_it - 1) % gh != 0)
    w_reads = cdiv(n_it, down_group(kc, inter, m.down_bytes, ht))  # whole padded I-tiles (block layout)
    return float(n_it * n_rs * cycles(k)), act, dve, hbm, transfers + blocks * (w_reads + h_reads)


def cost(m: FfnModel, mach: Machine, rows: int, k: int, i: int, lnc: int, plan: Plan) -> Cost:
    """Modelled time of the busiest core for `plan`."""
    comp_rows, inter = work_per_core(rows, i, lnc, plan.split)
    own = rows_per_core(rows, lnc)
    k_cycles = cycles(k)
    pe = act = dve = 0.0
    hbm = transfers = 0
    for s_rows, n_sb in runs(comp_rows, plan.s):
        solo = _solo(plan, own, i)
        parts = _super_block(m, s_rows, inter, plan.ci, k, plan.kc, plan.g, plan.s, solo, plan.ht)
        pe, act, dve = pe + n_sb * parts[0], act + n_sb * parts[1], dve + n_sb * parts[2]
        hbm, transfers = hbm + n_sb * parts[3], transfers + n_sb * parts[4]
    tiles = cdiv(own, P)
    e_act, e_dve, e_bytes, e_transfers = stage_cost(m.epi_cols if plan.kc else m.epi, tiles, k)
    act, dve, hbm, transfers = act + e_act, dve + e_dve, hbm + e_bytes, transfers + e_transfers
    if not plan.kc:
        hbm += own * k * 4 * m.acc_init
        transfers += tiles * m.acc_init
    exchanged = 0
    if plan.split == 1 and lnc > 1:  # partial down-projections of the other core's rows out, this core's in
        hbm += 2 * own * k * 4
        transfers += tiles * (1 + cdiv(k, F_MOV))
        dve += tiles * k_cycles
    elif k_halves(m, rows, k, lnc, plan.split):  # K halves: one exchange of the other half's sums; this core
        # (the larger share of I) finishes and stores half of K, and core 0 folds in the whole bias
        exchanged = rows * (k // 2) * 4
        hbm -= e_bytes // 2 + m.fold_bias * P * k * 4
        transfers += 1 - e_transfers // 2 - m.fold_bias * cdiv(k, F_MOV)
        dve += cycles(k // 2)
    elif plan.split >= 2 and lnc > 1:  # the other core's rows' sums to it, a K-block per exchange (zeros in
        rounds = exchange_rounds(rows, plan.s, own)  # rounds where only it has sums to send): DMA queues
        exchanged = rounds * min(P, rows) * k * 4
        transfers += rounds * cdiv(k, F_MOV)
        # the received sums added into the owned rows: the kernel adds them on GpSimd, which the closed
        # form has no column for; charged to DVE, the engine GpSimd shares its SBUF port with
        dve += tiles * k_cycles
    dma = dma_time(mach, hbm + exchanged, transfers)
    cols = _col_loads(m, mach, min(plan.s, comp_rows), k, i, inter, plan)
    chain = 0.0 if plan.kc else cols  # column blocks: in their first super-block's chain (`column_chain`)
    if plan.kc:  # the last column block's writes land a fixed cost after they leave the queues
        chain += mach.dma_fixed_ns
    lead = (cols, col_lead(m, mach, min(plan.s, comp_rows), k, i, inter, plan)) if plan.kc else (0.0, 0.0)
    for s_rows, n_sb in runs(comp_rows, plan.s):
        if plan.kc:  # the [I] columns load once: only the first super-block waits for them
            rest = column_chain(m, mach, s_rows, inter, k, plan)
            chain += column_chain(m, mach, s_rows, inter, k, plan, lead) + (n_sb - 1) * rest
            lead = (0.0, 0.0)
        else:
            chain += n_sb * _filled(m, mach, s_rows, inter, k, plan, lnc, _solo(plan, own, i))
    return Cost(pe / mach.pe_ghz, act / mach.act_ghz, dve / mach.dve_ghz, dma, hbm, chain)


def _col_loads(m: FfnModel, mach: Machine, s_rows: int, k: int, i: int, inter: int, plan: Plan) -> float:
    """What the [I] columns' loads put in series: they queue behind the up weights of the first I-tiles
    whose PSUM tiles the banks hold, ahead of the next ones' weights, so they delay the PE by what the
    up-projections of those first I-tiles do not cover beyond their own weights' loads."""
    cols = col_load(m, mach, i)
    if not cols:
        return 0.0
    up, weights = up_tile(m, mach, s_rows, k, plan.g)
    return max(0.0, cols - ahead_tiles(m, inter, plan) * max(0.0, up - weights))


def _solo(plan: Plan, own: int, i: int) -> tuple[int, int]:
    """Split 3's odd I-tile on the core owning `own` rows of the one super-block: (rows, columns)."""
    return (own, solo_tile(i)) if plan.split == 3 else (0, 0)


def exchange_rounds(rows: int, s: int, own: int) -> int:
    """Row-tile rounds of the split-2 exchange: per super-block, as many as the core with more of its row
    tiles has (the other sends zeros in the rest); core 0 owns rows [0, own), core 1 the others."""
    tiles = sum(n_sb * cdiv(s_rows, P) for s_rows, n_sb in runs(rows, s))
    r0 = own // s * s  # the super-block holding the first row core 1 owns
    if own >= rows or own == r0:
        return tiles
    mine = cdiv(own - r0, P)
    return tiles - min(mine, cdiv(min(rows, r0 + s) - r0, P) - mine)


def _filled(
    m: FfnModel, mach: Machine, s_rows: int, inter: int, k: int, plan: Plan, lnc: int, solo: tuple[int, int]
) -> float:
    """Time of one super-block of a plan with the SBUF accumulator: its fill (`super_block_fill`); its
    chunks, each row slice's up-projection, the combines' lag behind it (each I-tile's combine waits for
    its up-projection, in I-tile order) and down-projection with its evictions in series (`slice_period`),
    or their loads pipelined with their matmuls, or the busiest other engine (one fixed cost and a cold PE
    before the first matmul); then, without SPLIT, the epilogue of its row tiles
    (`drain`), the last chunk's matmuls after its first row tile's beside it; with SPLIT 1, the exchange
    and the owner's share of its row tiles' epilogue after the core barrier (the next super-block's barrier
    waits for them); with SPLIT 2, the last K-block's sendrecv and the owner's epilogue. `solo`: split 3's
    odd I-tile (`_super_block`), in the last chunk."""
    pe, act, dve, hbm, transfers = _super_block(m, s_rows, inter, plan.ci, k, 0, plan.g, plan.s, solo)
    n_rs, n_k = cdiv(s_rows, P), cdiv(k, P)
    x_cycles = sum(n_t * n_k * max(MIN_CYCLES, rows_t) for rows_t, n_t in runs(s_rows, P))  # in the fill
    loads = dma_time(mach, hbm - s_rows * k * m.x_bytes, transfers - n_rs * cdiv(k, x_staged(m, k)))
    pass_ns = m.mid_act / mach.act_ghz + m.mid_dve / mach.dve_ghz  # the combine of one I-tile, per column
    serial = beside = 0.0
    for chunk, n_chunks in runs(inter, plan.ci):  # the last run holds the last chunk
        slices = []  # (up, down, row tiles, how many) of each run of row slices
        for rw, n_rw in runs(s_rows, F_MOV):
            tiles, width = cdiv(rw, P), max(MIN_CYCLES, rw)
            up = m.n_up * cdiv(chunk, P) * n_k * width / mach.pe_ghz
            down = cdiv(chunk, P) * tiles * cycles(k) / mach.pe_ghz
            slices.append((up, down, tiles, n_rw))
            evict = tiles * cycles(k) / mach.dve_ghz
            combine = pass_ns * width  # one I-tile's, over this slice's rows
            # the down-projection reads the last I-tile's combine only after the other I-tiles' matmuls of
            # its first K-block (I-tile inner): those run while the combine finishes
            ahead = (cdiv(chunk, P) - 1) * max(MIN_CYCLES, min(F_MOV, k)) / mach.pe_ghz
            # each I-tile's combine waits for its up-projection, and the Vector engine runs them in I-tile
            # order: where a combine is slower than an I-tile's up-projection, the combines fall behind
            # the matmuls by that much per I-tile and the last one ends that much after the PE's last
            # up-projection (a two-stage pipeline)
            behind = (cdiv(chunk, P) - 1) * max(0.0, combine - up / cdiv(chunk, P))
            waits = behind + max(0.0, combine - ahead)
            serial += n_chunks * n_rw * slice_period(up, waits, down, evict, tiles * cdiv(k, F_MOV), m.n_up)
        # the chunk's matmuls after its first row tile's down-projection: beside that tile's epilogue
        first_up, first_down, first_tiles, _ = slices[0]
        beside = sum(n * (up + down) for up, down, _, n in slices) - first_up - first_down / first_tiles
    if solo[0]:  # the odd I-tile's matmuls join the last chunk's (one row slice: S <= F_MOV)
        serial += (m.n_up * n_k * max(MIN_CYCLES, solo[0]) + cdiv(solo[0], P) * cycles(k)) / mach.pe_ghz
    steps = m.n_up * (cdiv(inter, P) + bool(solo[0]))  # one projection's weights of one I-tile per step
    streamed = pipelined(loads, (pe - x_cycles) / mach.pe_ghz, steps)
    chunks = max(streamed, serial, act / mach.act_ghz, dve / mach.dve_ghz)
    if k_halves(m, s_rows, k, lnc, plan.split):  # the other half's exchange, then this core's half finished;
        # the exchange leaves before the last chunk's paired I-tiles' own-half matmuls (`down_order`): they
        # hide part of it
        paired = min(DOWN_PAIRS, chunk // P // 2) * 2 * cycles(k // 2) / mach.pe_ghz
        sent = dma_time(mach, s_rows * k // 2 * 4, 1) + mach.dma_fixed_ns
        tail = max(0.0, sent - paired) + drain(m.epi, mach, 1, k // 2, width=k // 2)
    elif plan.split >= 2 and lnc > 1:  # sendrecv: each K-block's sums leave as it is evicted, no barrier;
        owned = cdiv(n_rs, lnc)  # only the last block's exchange and the owner's epilogue are after the PE
        last = dma_time(mach, min(s_rows, owned * P) * min(k, F_MOV) * 4, owned) + mach.dma_fixed_ns
        tail = last + drain(m.epi, mach, owned, k)
    elif plan.split:
        owned = cdiv(n_rs, lnc)
        tail = exchange(mach, min(s_rows, owned * P), k) + drain(m.epi, mach, owned, k)
    else:
        tail = drain(m.epi, mach, n_rs, k, beside)
    return super_block_fill(m, mach, s_rows, k) + chunks + mach.dma_fixed_ns + mach.pe_ramp_ns + tail


def plannable(usable: int) -> int:
    """SBUF bytes per partition a plan may take of `usable`: all but SBUF_HEADROOM."""
    return usable - SBUF_HEADROOM


def candidates(
    m: FfnModel, rows: int, k: int, i: int, lnc: int, usable: int, exhaustive: bool = False
) -> list[Plan]:
    """Legal plans within `usable` SBUF bytes less the headroom: every (S, CI) multiple of 128 when
    exhaustive, else a pruned set the search keeps; each with the SBUF accumulator and, where S allows
    (split over rows only), with column blocks, their h^T in the HBM scratch or, where it fits, held."""
    budget = plannable(usable)
    plans = []
    for split in splits(i, lnc):
        comp_rows, inter = work_per_core(rows, i, lnc, split)
        s_all = range(P, cdiv(comp_rows, P) * P + 1, P)
        ci_all = range(P, cdiv(inter, P) * P + 1, P)
        for s in s_all if exhaustive else row_tiles(comp_rows):
            if split >= 2 and s > F_MOV:  # the exchange's rounds assume one row slice per super-block
                continue
            if split == 3 and (s < comp_rows or rows <= rows_per_core(rows, lnc)):  # the odd I-tile: for the
                continue  # rows each core owns of the one super-block (none on core 1: split 2's shares)
            for kc in (0, 0 if split else column_block(s, k)) if s <= ACC_BANKS * P else (0,):
                if exhaustive:
                    fits = [ci for ci in ci_all if sbuf_bytes(m, s, ci, k, i, kc, 0, split) <= budget]
                else:
                    widest = _widest_fit(m, s, ci_all, k, i, budget, kc, split)
                    fits = [ci for ci in ci_all[max(0, widest - 3) : widest + 1]] if widest >= 0 else []
                plans += [Plan(s, ci, split, kc, g) for ci in fits for g in _groups(m, s, ci, k)]
            if streams_up(s, P):  # a streamed K-tile group may fit where a whole chunk does not
                plans += [
                    Plan(s, P, split, kc, g)
                    for kc in ((0, 0 if split else column_block(s, k)) if s <= ACC_BANKS * P else (0,))
                    for g in _groups(m, s, P, k)
                    if sbuf_bytes(m, s, P, k, i, kc, g, split) <= budget
                ]
    held = [p._replace(ht=1) for p in plans if p.kc and plan_bytes(m, p._replace(ht=1), k, i) <= budget]
    return list(dict.fromkeys(plans + held))


def splits(i: int, lnc: int) -> tuple[int, ...]:
    """Work splits worth trying: over rows (0); with at least an I-tile per core, over I, the partial sums
    through shared HBM (1) or, at LNC 2, exchanged core to core (2: sendrecv pairs the two cores of LNC 2;
    3: an odd number of I-tiles, the odd one computed by each core for its own rows, not exchanged)."""
    if lnc < 2 or cdiv(i, P) < lnc:
        return (0,)
    return ((0, 1, 2, 3) if cdiv(i, P) % 2 else (0, 1, 2)) if lnc == 2 else (0, 1)


def _groups(m: FfnModel, s: int, ci: int, k: int) -> list[int]:
    """K-tile groups per up-weight DMA worth trying: all of K (0) and, streamed, the packet rule's knee
    and twice it (less SBUF than all of K)."""
    n_k, knee = cdiv(k, P), min_group(m)
    return [0] + ([g for g in (knee, 2 * knee) if g < n_k] if streams_up(s, ci) else [])


def _widest_fit(m: FfnModel, s: int, ci_all: range, k: int, i: int, budget: int, kc: int, split: int) -> int:
    """Index in `ci_all` of the widest chunk that fits, -1 if none (SBUF grows with CI: bisect)."""
    lo, hi = -1, len(ci_all) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sbuf_bytes(m, s, ci_all[mid], k, i, kc, 0, split) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def rank_key(
    m: FfnModel, mach: Machine, rows: int, k: int, i: int, lnc: int, plan: Plan
) -> tuple[float, float, int, int]:
    """Order of preference: modelled time, then total engine work (so ties at the bound go to the plan
    that leaves the other engines most slack), then HBM bytes, then SBUF."""
    c = cost(m, mach, rows, k, i, lnc, plan)
    work = c.pe + c.act + c.dve + c.dma
    return (round(c.total, 1), round(work, 1), c.hbm_bytes, plan_bytes(m, plan, k, i))


# the host function plans at every call: the same launch shapes are planned once
@functools.lru_cache(maxsize=256)
def choose(m: FfnModel, mach: Machine, rows: int, k: int, i: int, lnc: int) -> Plan:
    """The best modelled legal plan; ValueError with the numbers when none fits."""
    if lnc > mach.max_lnc:
        raise ValueError(f"LNC={lnc} is not available on this target: at most {mach.max_lnc}")
    plans = candidates(m, rows, k, i, lnc, mach.sbuf_budget)
    if not plans:
        # outside the f-string: the generated copy renames these helpers, never inside a string
        need, budget, kept = smallest_need(m, k, i), plannable(mach.sbuf_budget), SBUF_HEADROOM
        raise ValueError(
            f"no tile plan fits: the smallest (S=128, CI=128) needs {need} B/partition of SBUF for K={k}, "
            f"I={i}; the budget is {budget} B with {kept} B kept free"
        )
    return min(plans, key=lambda p: rank_key(m, mach, rows, k, i, lnc, p))
