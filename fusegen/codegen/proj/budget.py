"""SBUF budget and modelled time of a generated projection kernel, and its choice of tiles and core split.

Standard library only: `fusegen build` copies this module (after the shared pieces of
fusegen/codegen/budget_base.py) into every generated projection kernel, so the host function plans for
runtime shapes with exactly the model the compiler used. Costs follow the FFN model's closed forms.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from fusegen.codegen.budget_base import (
    F_MOV,
    MIN_CYCLES,
    Buffer,
    Cost,
    Machine,
    P,
    Stage,
    cdiv,
    cycles,
    dma_time,
    row_tiles,
    rows_per_core,
    runs,
    stage_cost,
)

#: column blocks the search tries: PSUM holds NB / F_MOV accumulators per row tile
BLOCKS = (F_MOV, 2 * F_MOV)
#: PSUM banks of the targets (2 KiB per partition each); accumulators and a transpose tile, double-buffered
PSUM_BANKS = 8


class ProjModel(NamedTuple):
    """What a generated projection kernel holds in SBUF and computes, counted by its lowering."""

    x_bytes: int  # bytes per element of x
    pro: Stage  # the prologue, per row tile (NO_STAGE without one)
    epi: tuple[Stage, ...]  # each projection's epilogue, per row tile, over its N columns
    block_rows: tuple[int, ...]  # each projection's [N] inputs, broadcast once per column block
    w_bytes: tuple[int, ...]  # bytes per element of each projection's weight (1: fp8)


class Plan(NamedTuple):
    """S rows per super-block (x^T resident), NB weight columns per block, split over columns (1) or rows
    (0), and stream (1: every row tile's accumulators live at once, so each K-tile's weight piece is loaded
    just before its matmuls; 0: a block's K-tiles held while the row tiles take turns)."""

    s: int
    nb: int
    split: int
    stream: int


def columns_per_core(n: int, lnc: int, split: int) -> int:
    """Output columns of one projection the busiest core computes."""
    return min(n, cdiv(cdiv(n, F_MOV), lnc) * F_MOV) if split else n


def buffers(m: ProjModel, p: Plan, k: int) -> list[Buffer]:
    """The kernel's SBUF buffers for plan `p`."""
    n_k = cdiv(k, P)
    epi_bytes = max((st.block_bytes for st in m.epi), default=0)
    w_bytes = max(m.w_bytes)  # one weight buffer serves every projection in turn
    weights = (
        Buffer("weight K-tile piece (streamed)", p.nb * w_bytes, 3)
        if p.stream
        else Buffer("weight block (all K-tiles, NB columns)", n_k * p.nb * w_bytes, 2)
    )
    return [
        Buffer("x^T, K on partitions", n_k * p.s * m.x_bytes, 1),
        Buffer("x row block, staged for the PE transpose", F_MOV * m.x_bytes, 2),
        Buffer("prologue block (one K-block's loads and temporaries)", m.pro.block_bytes * F_MOV, 2),
        weights,
        Buffer("epilogue block (one column block's loads and temporaries)", epi_bytes * F_MOV, 2),
        Buffer("[N] inputs broadcast over the partitions, one column block", max(m.block_rows) * p.nb * 4, 2),
        Buffer("row columns", (m.pro.cols + max((st.cols for st in m.epi), default=0)) * 4, 2),
    ]


def sbuf_bytes(m: ProjModel, p: Plan, k: int) -> int:
    """SBUF bytes per partition of plan `p`, copies included."""
    return sum(b.bytes * b.copies for b in buffers(m, p, k))


def accumulators(p: Plan) -> int:
    """PSUM accumulators live at once: NB / F_MOV per row tile, for every row tile of a streamed plan."""
    return (cdiv(p.s, P) if p.stream else 1) * (p.nb // F_MOV)


def psum_banks(p: Plan) -> int:
    """PSUM banks in flight: the accumulators and a transpose tile, double-buffered."""
    return 2 * (accumulators(p) + 1)


def cost(m: ProjModel, mach: Machine, rows: int, k: int, widths: tuple[int, ...], lnc: int, p: Plan) -> Cost:
    """Modelled time of the busiest core for `p`."""
    comp_rows = rows if p.split else rows_per_core(rows, lnc)
    n_k = cdiv(k, P)
    pe = act = dve = 0.0
    hbm = transfers = 0
    for s_rows, n_sb in runs(comp_rows, p.s):
        tiles = cdiv(s_rows, P)
        a, d, moved, moves = stage_cost(m.pro, tiles, k)
        act, dve = act + n_sb * a, dve + n_sb * d
        hbm += n_sb * (moved + s_rows * k * m.x_bytes)
        transfers += n_sb * (moves + tiles * cdiv(k, F_MOV))
        for rows_t, n_t in runs(s_rows, P):  # x^T: each K-tile transposed on the PE, copied out of PSUM
            pe += n_sb * n_t * n_k * max(MIN_CYCLES, rows_t)
            dve += n_sb * n_t * n_k * max(MIN_CYCLES, rows_t)
        for n, epi, rows_in, w_bytes in zip(widths, m.epi, m.block_rows, m.w_bytes, strict=True):
            cols = columns_per_core(n, lnc, p.split)
            hbm += n_sb * (k * cols * w_bytes + rows_in * P * cols * 4)  # [N] inputs: P copies land in SBUF
            transfers += n_sb * (n_k + rows_in) * cdiv(cols, p.nb)  # the weights, once per super-block
            pe += n_sb * tiles * n_k * cycles(cols)
            a, d, moved, moves = stage_cost(epi, tiles, cols)
            act, dve, hbm, transfers = (
                act + n_sb * a,
                dve + n_sb * d,
                hbm + n_sb * moved,
                transfers + n_sb * moves,
            )
    dma = dma_time(mach, hbm, transfers)
    return Cost(pe / mach.pe_ghz, act / mach.act_ghz, dve / mach.dve_ghz, dma, hbm)


def candidates(m: ProjModel, rows: int, k: int, widths: tuple[int, ...], lnc: int, budget: int) -> list[Plan]:
    """Legal plans: super-blocks of whole row tiles, each column block, held or streamed weights."""
    plans = []
    widest = max(widths)
    for split in (0, 1) if lnc > 1 else (0,):
        comp_rows = rows if split else rows_per_core(rows, lnc)
        for s in row_tiles(comp_rows):
            for nb in [b for b in BLOCKS if b == F_MOV or b <= cdiv(widest, F_MOV) * F_MOV]:
                for stream in (0, 1):
                    plan = Plan(s, nb, split, stream)
                    if psum_banks(plan) <= PSUM_BANKS and sbuf_bytes(m, plan, k) <= budget:
                        plans.append(plan)
    return plans


def rank_key(
    m: ProjModel, mach: Machine, rows: int, k: int, widths: tuple[int, ...], lnc: int, p: Plan
) -> tuple[float, float, int, int]:
    """Order of preference: modelled time, total engine work, HBM bytes, SBUF."""
    c = cost(m, mach, rows, k, widths, lnc, p)
    return (round(c.total, 1), round(c.pe + c.act + c.dve + c.dma, 1), c.hbm_bytes, sbuf_bytes(m, p, k))


def smallest_need(m: ProjModel, k: int) -> int:
    """SBUF bytes of the smallest plan: one row tile, streamed weights, 512 columns."""
    return sbuf_bytes(m, Plan(P, F_MOV, 0, 1), k)


# the host function plans at every call: the same launch shapes are planned once
@functools.lru_cache(maxsize=256)
def choose(m: ProjModel, mach: Machine, rows: int, k: int, widths: tuple[int, ...], lnc: int) -> Plan:
    """The best modelled legal plan; ValueError with the numbers when none fits."""
    if lnc > mach.max_lnc:
        raise ValueError(f"LNC={lnc} is not available on this target: at most {mach.max_lnc}")
    plans = candidates(m, rows, k, widths, lnc, mach.sbuf_budget)
    if not plans:
        need = smallest_need(m, k)
        raise ValueError(f"no tile plan fits: the smallest (S=128, NB=512, streamed) needs {need} "
                         f"B/partition of SBUF for K={k}; the budget is {mach.sbuf_budget} B")  # fmt: skip
    return min(plans, key=lambda p: rank_key(m, mach, rows, k, widths, lnc, p))
