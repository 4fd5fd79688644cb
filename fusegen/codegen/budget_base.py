"""Budget-model pieces every matmul family's planner shares: the constants, a blocked rows-on-partitions
stage's figures, the machine's, SBUF buffers, modelled cost, and the closed-form cycle counts.

Standard library only: `files/render.vendored` copies this module into every generated kernel whose
budget module imports from it, ahead of that module's own code.
"""

from __future__ import annotations

from typing import NamedTuple

from fusegen.perf.dmarule import dma_engine_bytes

P = 128  # partitions
F_MOV = 512  # matmul moving free size, one fp32 PSUM bank
MIN_CYCLES = 64  # minimum instruction initiation interval, cycles (nki.md §6 overheads)


class Stage(NamedTuple):
    """A rows-on-partitions stage (the epilogue, or the prologue) swept over K in F_MOV-wide blocks.

    Row statistics need the whole row, so a stage runs as passes over the blocks: each pass finishes
    the [P, 1] statistics the next one needs (a LayerNorm: the mean, then the variance), the last pass
    computes and writes the outputs. Only one block's temporaries are live at a time.
    """

    block_bytes: int  # bytes per block column: temporaries and block loads, the largest pass
    cols: int  # f32 [P, 1] columns per row tile
    sweeps: int  # passes over the K blocks
    act: int  # Scalar-engine instructions per block, over all passes (weighted by cost)
    dve: int  # Vector-engine instructions per block, over all passes (weighted by cost)
    col_ops: int  # [P, 1] Vector-engine instructions per block (partial statistics accumulated)
    read_bytes: int  # bytes read per row element from [R, K] inputs, over all passes
    bcast: int  # [K] inputs loaded broadcast to [P, block] per block, over all passes
    loads: int  # DMA transfers per block, over all passes (reads and output writes)


NO_STAGE = Stage(0, 0, 0, 0, 0, 0, 0, 0, 0)


class Machine(NamedTuple):
    """The figures of one target the time model needs (per physical core)."""

    pe_ghz: float  # tensor engine clock
    act_ghz: float  # scalar engine clock
    dve_ghz: float  # vector engine clock
    dma_gbps: float  # min(DMA bandwidth, the core's share of HBM bandwidth), bytes/ns
    dma_fixed_ns: float  # fixed cost of one DMA transfer
    dma_queues: int  # transfers in flight
    dma_row_bytes: int  # DMA packet-rate rule: each partition row costs at least this many bytes (dmarule)
    sbuf_budget: int  # usable SBUF bytes per partition
    max_lnc: int  # logical cores one launch may span (trn2 pairs cores; trn1 has no LNC=2)
    pe_ramp_ns: float = 0.0  # PE time a burst started after an idle window loses to the dI/dt ramp


class Buffer(NamedTuple):
    """One SBUF buffer of the kernel: bytes per partition per copy, and copies in flight."""

    name: str
    bytes: int
    copies: int


class Cost(NamedTuple):
    """Modelled busy time per engine of the busiest core, ns; the kernel takes the largest."""

    pe: float
    act: float
    dve: float
    dma: float
    hbm_bytes: int
    chain: float = 0.0  # work the kernel's order keeps from overlapping, in series (column-blocked FFN)

    @property
    def total(self) -> float:
        """Modelled kernel time: engines overlap, so the busiest one bounds it, or the series they must
        run in where the kernel's order keeps them from overlapping."""
        return max(self.pe, self.act, self.dve, self.dma, self.chain)


def cdiv(n: int, d: int) -> int:
    """Ceiling division."""
    return -(-n // d)


def rows_per_core(rows: int, lnc: int) -> int:
    """Rows one core owns: whole 128-row tiles are dealt out, the ragged tile goes last."""
    return min(rows, cdiv(cdiv(rows, P), lnc) * P)


def stage_cost(st: Stage, tiles: int, k: int, shared: int = 0) -> tuple[float, float, int, int]:
    """(ACT cycles, DVE cycles, DMA bytes, DMA transfers) of a stage over `tiles` row tiles of P rows;
    `shared`: its [K] rows are broadcast once for that many row tiles (0: once per row tile)."""
    n_kb = cdiv(k, F_MOV)
    k_cycles = cycles(k)
    act = tiles * st.act * k_cycles
    dve = tiles * (st.dve * k_cycles + st.col_ops * n_kb * MIN_CYCLES)
    bcast_tiles = cdiv(tiles, shared) if shared else tiles
    moved = P * k * (tiles * st.read_bytes + bcast_tiles * 4 * st.bcast)  # broadcast: P copies land in SBUF
    return act, dve, moved, n_kb * (tiles * (st.loads - st.bcast) + bcast_tiles * st.bcast)


def runs(total: int, size: int) -> list[tuple[int, int]]:
    """`total` cut into pieces of `size` (the last one ragged), as (piece, how many) runs."""
    runs = [(size, total // size)] if total >= size else []
    return runs + ([(total % size, 1)] if total % size else [])


def cycles(k: int) -> int:
    """Cycles of one instruction per F_MOV-wide piece over K, the last one ragged."""
    return sum(max(MIN_CYCLES, nk) * n for nk, n in runs(k, F_MOV))


def row_tiles(rows: int) -> list[int]:
    """Super-block sizes the search tries: rows/1 .. rows/8 rounded up to whole tiles, and 128 .. 2048 rows
    (a wide shape fits only small super-blocks, however many rows there are)."""
    most = cdiv(rows, P) * P
    even = {cdiv(cdiv(rows, n), P) * P for n in range(1, 9)}
    return sorted(even | {s for s in (P, 2 * P, 4 * P, 8 * P, 16 * P) if s <= most})


def dma_time(mach: Machine, hbm: int, transfers: int) -> float:
    """Modelled DMA time of `hbm` bytes in `transfers` [P, *] transfers: the packet-rate rule over the
    average transfer (a lower bound of the per-transfer sum the trace model charges: transfers below
    DMA_ROW_BYTES per partition row cost more than their bytes), or the transfers' fixed costs."""
    engine_bytes = dma_engine_bytes(hbm, transfers * P, mach.dma_queues, mach.dma_row_bytes)
    return max(
        engine_bytes * mach.dma_queues / mach.dma_gbps, transfers * mach.dma_fixed_ns / mach.dma_queues
    )
