"""The scheduler on small synthetic traces."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from fusegen.perf.cost import PE_RAMP_NS, assume
from fusegen.perf.schedule import schedule
from fusegen.sim import get_target

from .records import dma_in, matmul, psum, record, sbuf

TRN2 = get_target("trn2")
MM_NS = 512 / 2.4  # a [128,128] x [128,512] bf16 matmul
ACT_NS = 512 / 1.2  # activation over 512 elements
PE_SYNC_NS = 100 / 2.4  # the producer's static overhead before another engine sees its result


@pytest.fixture(autouse=True)
def no_throttle(request: pytest.FixtureRequest) -> Iterator[None]:
    """The PE at full rate, except in the throttling tests (their names say so)."""
    with assume(pe_throttle="throttl" in request.node.name):
        yield


def starts(recs: list) -> list[float]:  # type: ignore[type-arg]
    return [span.start_ns for span in schedule(recs, TRN2).spans]


def test_independent_engines_overlap() -> None:
    recs = [matmul(10, 1, 2, index=0), record("scalar", "activation", (sbuf("r", 3), sbuf("w", 4)), index=1)]
    sched = schedule(recs, TRN2)
    assert starts(recs) == [0, 0]
    assert sched.time_ns == pytest.approx(ACT_NS)
    assert sched.bound == "scalar"
    assert sched.busy_pct("tensor") == pytest.approx(100 * MM_NS / ACT_NS)


def test_raw_dependency_serialises_across_engines() -> None:
    recs = [matmul(10, 1, 2, index=0), record("scalar", "activation", (psum("r", 10), sbuf("w", 4)), index=1)]
    assert starts(recs) == pytest.approx([0, MM_NS + PE_SYNC_NS])
    assert schedule(recs, TRN2).time_ns == pytest.approx(MM_NS + PE_SYNC_NS + ACT_NS)


def test_same_engine_runs_in_order_without_sync_overhead() -> None:
    recs = [matmul(10, 1, 2, index=0), matmul(10, 1, 2, index=1)]  # accumulating into one PSUM tile
    assert starts(recs) == pytest.approx([0, MM_NS])


def test_war_waits_for_the_reader() -> None:
    read = record("scalar", "activation", (sbuf("r", 5), sbuf("w", 6)), index=0)
    overwrite = record("vector", "memset", (sbuf("w", 5),), index=1)
    assert starts([read, overwrite]) == pytest.approx([0, ACT_NS])


def test_dma_queues_run_in_parallel() -> None:
    narrow = [dma_in(100 + q, 1, partitions=8, nbytes=23_000, index=q) for q in range(17)]
    got = starts(narrow)
    assert got[:16] == [0] * 16  # one queue each, 16 queues per core
    assert got[16] == pytest.approx(1000)  # 23,000 B at 23 B/ns on the first queue to free up
    wide = [dma_in(200 + q, 1, partitions=128, nbytes=368_000, index=q) for q in range(2)]
    assert starts(wide) == pytest.approx([0, 1000])  # each spreads over all 16 queues


def test_dma_result_arrives_after_the_fixed_latency() -> None:
    recs = [
        dma_in(7, 1, nbytes=368_000, index=0),
        record("vector", "tensor_copy", (sbuf("r", 7), sbuf("w", 8)), index=1),
    ]
    assert starts(recs) == pytest.approx([0, 1000 + 1300])


def test_barrier_synchronises_cores() -> None:
    slow = record(
        "scalar", "activation", (sbuf("r", 1), sbuf("w", 2)), elems=12_000, core=0, index=0, epoch=0
    )
    fast = record("scalar", "activation", (sbuf("r", 1), sbuf("w", 2)), core=1, index=0, epoch=0)
    after = record("vector", "tensor_copy", (sbuf("r", 3), sbuf("w", 4)), core=1, index=1, epoch=1)
    got = starts([slow, fast, after])
    assert got[:2] == [0, 0]  # cores run in parallel
    assert got[2] == pytest.approx(12_000 / 1.2)  # core 1 waits for core 0 at the barrier


def test_psum_bank_reuse_waits_for_the_evicting_reader() -> None:
    recs = []
    for t in range(9):  # nine PSUM tiles, eight banks: the ninth reuses the first tile's bank
        recs.append(matmul(100 + t, 1, 2, n=64, index=2 * t))  # short matmuls, long evictions
        evict = (psum("r", 100 + t), sbuf("w", 200 + t))
        recs.append(record("scalar", "activation", evict, elems=12_000, index=2 * t + 1))
    spans = schedule(recs, TRN2).spans
    assert spans[14].start_ns == pytest.approx(7 * 64 / 2.4)  # the first eight tiles need not wait
    assert spans[16].start_ns == pytest.approx(spans[1].end_ns)  # the ninth waits for the first eviction


def test_pe_throttling_halves_the_rate_of_a_cold_start_then_ramps() -> None:
    """trn2 dI/dt throttling: ~50% utilisation after idle, full after ~3 us of work (glossary.rst)."""
    recs = [matmul(10 + i % 2, 1, 2, index=i) for i in range(40)]  # back to back, 213 ns each at full rate
    spans = schedule(recs, TRN2).spans
    assert spans[0].end_ns - spans[0].start_ns == pytest.approx(2 * MM_NS)
    widths = [s.end_ns - s.start_ns for s in spans]
    assert all(a >= b - 1e-9 for a, b in itertools.pairwise(widths))  # the ramp only speeds up
    late = [s for s in spans if s.start_ns >= PE_RAMP_NS]
    assert late and all(s.end_ns - s.start_ns == pytest.approx(MM_NS) for s in late)


def test_pe_throttling_restarts_after_an_idle_gap() -> None:
    warm = [matmul(10 + i % 2, 1, 2, index=i) for i in range(30)]
    wait = record("scalar", "activation", (psum("r", 11), sbuf("w", 4)), elems=3000, index=30)  # 2.5 us
    after = matmul(12, 4, 2, index=31)  # reads the activation's output: starts after an idle gap
    spans = schedule([*warm, wait, after], TRN2).spans
    assert spans[29].end_ns - spans[29].start_ns == pytest.approx(MM_NS)
    assert spans[31].end_ns - spans[31].start_ns == pytest.approx(2 * MM_NS)


def test_trn1_is_not_throttled() -> None:
    spans = schedule([matmul(10, 1, 2, index=0)], get_target("trn1")).spans
    assert spans[0].end_ns - spans[0].start_ns == pytest.approx(512 / 2.8)


def test_assumed_dge_issue_delays_transfers_on_two_instances() -> None:
    """With a hardware-DGE issue cost (nki-dge.rst: ~600 ns, two DGEs per NeuronCore-v3), the third of
    three independent narrow transfers waits for a DGE; without it (the default) none waits."""
    narrow = [dma_in(100 + q, 1, partitions=8, nbytes=23_000, index=q) for q in range(3)]
    assert starts(narrow) == [0, 0, 0]
    with assume(dge_issue_ns=600.0):
        assert starts(narrow) == pytest.approx([600, 600, 1200])
        # trn1 has no hardware DGE (hwdge needs NeuronCore-v3+, nki.md §3)
        assert [s.start_ns for s in schedule(narrow, get_target("trn1")).spans] == [0, 0, 0]
