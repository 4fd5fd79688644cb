"""Dependency-aware list schedule of an instruction trace: engines in parallel, dependencies respected.

Each core runs one in-order queue per compute engine and DMA_QUEUES DMA queues. Records are placed in
program order (per barrier epoch, per core); an instruction starts when its queue is free and when:

* RAW: every allocation it reads has been written by its last writer;
* WAR/WAW: an on-chip tile it writes is no longer read by earlier instructions, and its previous
  write is done, so a buffer is never overwritten early (the interpreter gives each `nl.ndarray`
  fresh storage, so this orders reuse of one tile, e.g. an accumulator). Not ordered: DMA writes
  after DMA writes to one tile, and any writes to HBM tensors (kernels fill disjoint slices of them;
  ordering them would serialise every output DMA);
* PSUM banks: a new PSUM tile takes one of the target's 8 banks whose previous tile is dead (in
  program order), the one that frees up first (the allocator rotates banks rather than reusing the
  lowest, as the interpreter's capacity check does), and waits until that tile's last access is done;
* barriers: nothing of epoch e+1 starts before every core has finished epoch e (core_barrier);
* exchanges (sendrecv, sendrecv_compute): the n-th of each core is a rendezvous: both start together,
  when both cores' operands and DMA queues are ready, each on its own core's queues.

On NeuronCore-v3+ the Tensor engine runs at its dI/dt utilisation limit: ~50% after an idle window,
ramping to full over ~3 us (`cost.pe_utilisation_limit`).

A result reaches an instruction on another engine after the producer's latency (static sync overhead,
or the DMA fixed cost); on the same engine, in-order issue suffices. SBUF reuse between different
allocations is not modelled (ideal prefetch within the dependencies): see docs/performance.md.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from fusegen.perf.cost import (
    DMA_QUEUES,
    EXCHANGE_OPS,
    HWDGE_INSTANCES,
    PE_COLD_UTILISATION,
    PE_RAMP_NS,
    dge_issue_ns,
    dma_queues_used,
    pe_utilisation_limit,
    record_cost,
)
from fusegen.sim.targets import Target
from fusegen.sim.trace import Record

ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma")
ON_CHIP = frozenset({"sbuf", "psum"})
DMA_LANES = tuple(f"dma{q}" for q in range(DMA_QUEUES))
DGE_LANES = tuple(f"dge{d}" for d in range(HWDGE_INSTANCES))


@dataclass(frozen=True, slots=True)
class Span:
    """Where and when one record runs in the model."""

    record: Record
    lanes: tuple[str, ...]  # the engine's name, or the DMA queues (dma<q>) the transfer spread over
    start_ns: float
    end_ns: float


@dataclass
class Schedule:
    """The modelled timeline of one launch and its per-engine utilisation."""

    time_ns: float
    cores: int
    spans: list[Span]
    busy_ns: dict[str, float] = field(default_factory=dict)  # per engine, summed over cores (and DMA queues)

    def lane_count(self, engine: str) -> int:
        """Parallel lanes of `engine` over all cores."""
        return self.cores * (DMA_QUEUES if engine == "dma" else 1)

    def busy_pct(self, engine: str) -> float:
        """Share of the modelled time `engine`'s lanes were busy, in percent."""
        if self.time_ns <= 0:
            return 0.0
        return 100 * self.busy_ns.get(engine, 0.0) / (self.time_ns * self.lane_count(engine))

    def engine_busy_ns(self, engine: str) -> float:
        """Busy time of one lane of `engine`, averaged over its lanes."""
        return self.busy_ns.get(engine, 0.0) / self.lane_count(engine)

    @property
    def bound(self) -> str:
        """The engine with the highest utilisation: what bounds the kernel."""
        return max(ENGINES, key=self.busy_pct)


@dataclass
class _Tile:
    """Timing state of one allocation on one core."""

    written: float = 0.0  # when the last write is visible to another engine
    written_end: float = 0.0  # when the last write left its engine (same-engine readers)
    writer: str = ""
    read_done: float = 0.0  # when every earlier read is done (WAR)


class _Core:
    """Timing state of one core: queue availability, tiles, PSUM banks."""

    def __init__(self, banks: int, last_use: dict[int, int]) -> None:
        self.free: dict[str, float] = defaultdict(float)  # lane -> free at
        self.tiles: dict[int, _Tile] = defaultdict(_Tile)  # by allocation id
        self.last_use = last_use  # allocation id -> index of its last access (program order)
        self.bank_of: dict[int, int] = {}  # PSUM allocation id -> bank
        self.banks: list[tuple[int, float]] = [(-1, 0.0)] * banks  # (owning allocation or -1, free at)
        self.pe_end = float("-inf")  # when the Tensor engine's last instruction ended
        self.pe_ramp = 0.0  # when its dI/dt ramp last began


class _Scheduler:
    """Mutable state of one scheduling pass."""

    def __init__(self, target: Target, last_use: dict[int, dict[int, int]]) -> None:
        self.target = target
        self.cores = {core: _Core(target.psum_banks, uses) for core, uses in last_use.items()}
        self.busy: dict[str, float] = defaultdict(float)
        self.end = 0.0

    def place(self, rec: Record, floor: float) -> Span:
        """Schedule one record no earlier than `floor`."""
        return self._run(rec, self._earliest(rec, floor))

    def place_together(self, recs: list[Record], floor: float) -> list[Span]:
        """Schedule an exchange's calls (one per core), all starting when the last of them could."""
        start = max(self._earliest(rec, floor) for rec in recs)
        return [self._run(rec, start) for rec in recs]

    def _earliest(self, rec: Record, floor: float) -> float:
        """When `rec` could start: its dependencies, its DGE issue and its queues."""
        core = self.cores[rec.core]
        ready = max(floor, _ready(core, rec))
        issue = dge_issue_ns(self.target) if rec.engine == "dma" else 0.0
        if issue:  # the transfer's descriptors come from the DGE that frees up first
            dge = min(DGE_LANES, key=core.free.__getitem__)
            ready = core.free[dge] = max(ready, core.free[dge]) + issue
        return max(ready, max(core.free[lane] for lane in _lanes(core, rec)))

    def _run(self, rec: Record, start: float) -> Span:
        """Occupy `rec`'s lanes from `start` and record when its results are visible."""
        core = self.cores[rec.core]
        cost = record_cost(self.target, rec)
        lanes = _lanes(core, rec)
        busy = _throttled(self.target, core, start, cost.busy_ns) if rec.engine == "tensor" else cost.busy_ns
        end = start + busy
        for lane in lanes:
            core.free[lane] = end
        self.busy[rec.engine] += busy * len(lanes)
        done = start + busy + (cost.latency_ns - cost.busy_ns)
        _commit(core, rec, end, done)
        self.end = max(self.end, done if rec.engine == "dma" else end)  # a DMA is over when its data lands
        return Span(rec, tuple(lanes), start, end)


def _throttled(target: Target, core: _Core, start: float, busy: float) -> float:
    """A Tensor-engine instruction's busy time under the dI/dt limit. An idle gap of half the ~3 us window
    leaves that window below 50% utilisation, which restarts the ramp (busy windows of many short gaps are
    not detected: optimistic)."""
    if start - core.pe_end >= PE_RAMP_NS * (1 - PE_COLD_UTILISATION):
        core.pe_ramp = start
    busy /= pe_utilisation_limit(target, start - core.pe_ramp)
    core.pe_end = start + busy
    return busy


def _ready(core: _Core, rec: Record) -> float:
    """Earliest start allowed by data dependencies and PSUM bank reuse."""
    ready = 0.0
    for role, alloc, region, _, _ in rec.operands:
        tile = core.tiles[alloc]
        if role == "r":
            ready = max(ready, tile.written_end if tile.writer == rec.engine else tile.written)
        elif region in ON_CHIP:
            ready = max(ready, tile.read_done, _waw(tile, rec.engine))
            if region == "psum":
                ready = max(ready, _bank_wait(core, rec, alloc))
    return ready


def _waw(tile: _Tile, engine: str) -> float:
    """A write follows the tile's previous write, except DMA after DMA (they fill disjoint slices)."""
    if engine == "dma" and tile.writer == "dma":
        return 0.0
    return tile.written_end if tile.writer == engine else tile.written


def _bank_wait(core: _Core, rec: Record, alloc: int) -> float:
    """A new PSUM tile takes the bank, among those whose tile is dead, that frees up first."""
    if alloc in core.bank_of:
        return 0.0
    banks = core.banks
    dead = [b for b, (owner, _) in enumerate(banks) if owner < 0 or core.last_use[owner] < rec.index]
    bank = min(dead or range(len(banks)), key=lambda b: banks[b][1])
    core.bank_of[alloc] = bank
    released = banks[bank][1]
    banks[bank] = (alloc, released)
    return released


def _lanes(core: _Core, rec: Record) -> list[str]:
    """The engine's queue; for DMA the queues the transfer spreads over, those that free up first."""
    if rec.engine != "dma":
        return [rec.engine]
    return sorted(DMA_LANES, key=core.free.__getitem__)[: dma_queues_used(rec.partitions)]


def _commit(core: _Core, rec: Record, end: float, done: float) -> None:
    """Record when this instruction's results are visible and its inputs released."""
    release = done if rec.engine == "dma" else end  # a DMA holds its source until the data has landed
    for role, alloc, region, _, _ in rec.operands:
        tile = core.tiles[alloc]
        if role == "w":
            tile.written, tile.written_end, tile.writer = done, end, rec.engine
        else:
            tile.read_done = max(tile.read_done, release)
        bank = core.bank_of.get(alloc) if region == "psum" else None
        if bank is not None:
            owner, released = core.banks[bank]
            core.banks[bank] = (owner, max(released, release))


def schedule(records: Iterable[Record], target: Target) -> Schedule:
    """Model the timeline of `records` (one launch, any number of cores) on `target`."""
    by_epoch: dict[int, list[Record]] = defaultdict(list)
    last_use: dict[int, dict[int, int]] = defaultdict(dict)  # core -> allocation -> last access index
    for rec in records:
        by_epoch[rec.epoch].append(rec)
        uses = last_use[rec.core]
        for op in rec.operands:
            uses[op[1]] = rec.index
    state = _Scheduler(target, last_use)
    spans: list[Span] = []
    floor = 0.0
    for epoch in sorted(by_epoch):
        # cores interleave only through dependencies and exchanges
        for group in _rendezvous_order(by_epoch[epoch]):
            if len(group) == 1:
                spans.append(state.place(group[0], floor))
            else:
                spans += state.place_together(group, floor)
        floor = state.end  # core_barrier: every core has finished the epoch
    return Schedule(time_ns=state.end, cores=max(1, len(last_use)), spans=spans, busy_ns=dict(state.busy))


def _rendezvous_order(records: list[Record]) -> Iterator[list[Record]]:
    """Each core's records in program order, cut at its exchanges: every core's n-th stretch alone, then
    the n-th exchange of every core as one group (unpaired ones alone)."""
    by_core: dict[int, list[list[Record]]] = defaultdict(lambda: [[]])
    for rec in sorted(records, key=lambda r: (r.core, r.index)):
        stretches = by_core[rec.core]
        stretches[-1].append(rec)
        if rec.op in EXCHANGE_OPS:
            stretches.append([])
    for n in range(max((len(s) for s in by_core.values()), default=0)):
        pair = []
        for stretches in by_core.values():
            stretch = stretches[n] if n < len(stretches) else []
            last = stretch[-1] if stretch and stretch[-1].op in EXCHANGE_OPS else None
            yield from ([rec] for rec in stretch if rec is not last)
            pair += [last] if last is not None else []
        if pair:
            yield pair
