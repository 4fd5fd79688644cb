"""The cost rules against hand-computed values (trn2 clocks: PE 2.4, ACT 1.2, DVE 0.96, Pool 1.2 GHz)."""

from __future__ import annotations

import itertools

import pytest

from fusegen.codegen.ffn import budget as ffn_budget
from fusegen.codegen.files.render import vendored
from fusegen.codegen.plan import machine
from fusegen.perf.cost import assume, instruction_cost, instruction_ns, record_cost
from fusegen.perf.dmarule import DMA_ROW_BYTES, dma_engine_bytes
from fusegen.sim import get_target
from fusegen.sim.targets import Target

from .records import hbm, matmul, psum, record, sbuf

TRN2, TRN1 = get_target("trn2"), get_target("trn1")


@pytest.mark.parametrize(
    ("engine", "op", "elems", "details", "cycles"),
    [
        ("tensor", "nc_matmul", 512, {"stationary": 128}, 512),  # max(min(64, 128), 512)
        ("tensor", "nc_matmul", 16, {"stationary": 32}, 64),  # max(min(64, 32), 16) = 32, floored at the II
        ("tensor", "nc_matmul", 200, {"stationary": 128}, 200),
        ("scalar", "activation", 512, {}, 512),
        ("scalar", "activation", 512, {"reduce": True}, 576),  # +64 for the accumulator
        ("scalar", "activation", 10, {}, 64),  # max(64, N)
        ("vector", "tensor_tensor", 512, {}, 1024),  # 2N
        ("vector", "tensor_tensor", 512, {"psum_input": True}, 512),  # N with a PSUM input
        ("vector", "tensor_tensor", 512, {"perf_mode": True}, 512),  # trn2 bf16 perf mode 2x
        ("vector", "tensor_copy", 512, {"perf_mode": True}, 128),  # trn2 perf mode 4x
        ("vector", "tensor_scalar", 300, {}, 300),
        ("vector", "scalar_tensor_tensor", 512, {}, 1024),
        ("vector", "reciprocal", 100, {}, 800),
        ("vector", "memset", 8, {}, 64),
        ("gpsimd", "iota", 100, {}, 250),  # ~150 + N
    ],
)  # fmt: skip
def test_compute_rules(engine: str, op: str, elems: int, details: dict[str, object], cycles: int) -> None:
    clock = {"tensor": 2.4, "scalar": 1.2, "vector": 0.96, "gpsimd": 1.2}[engine]
    dtype = "bfloat16" if details.get("perf_mode") else "float32"
    got = instruction_ns(TRN2, engine, op, 128, elems, "bfloat16" if op == "nc_matmul" else dtype, **details)
    assert got == pytest.approx(cycles / clock)


def test_fp32_matmul_takes_four_passes() -> None:
    bf16 = instruction_ns(TRN2, "tensor", "nc_matmul", 128, 512, "bfloat16", stationary=128)
    fp32 = instruction_ns(TRN2, "tensor", "nc_matmul", 128, 512, "float32", stationary=128)
    assert fp32 == pytest.approx(4 * bf16) == pytest.approx(4 * 512 / 2.4)


def test_trn1_has_no_vector_perf_mode_and_its_own_clock() -> None:
    assert instruction_ns(TRN1, "vector", "tensor_tensor", 128, 512, perf_mode=True) == pytest.approx(
        1024 / 1.12
    )


def test_dma_spreads_over_queues_and_adds_fixed_latency() -> None:
    wide = instruction_cost(TRN2, "dma", "dma_copy", 128, 0, nbytes=128 * 4096)
    assert wide.busy_ns == pytest.approx(128 * 4096 / 368)  # 16 queues x 23 B/ns
    assert wide.latency_ns == pytest.approx(128 * 4096 / 368 + 1300)
    narrow = instruction_ns(TRN2, "dma", "dma_copy", 8, 0, nbytes=32768)
    assert narrow == pytest.approx(32768 / 23)  # 8 partitions: one queue
    assert instruction_ns(TRN1, "dma", "dma_copy", 8, 0, nbytes=34000) == pytest.approx(2000)


def test_dma_transpose_is_slower_from_sbuf_than_from_hbm() -> None:
    from_hbm = instruction_ns(TRN2, "dma", "dma_transpose", 128, 0, nbytes=368_000)
    from_sbuf = instruction_ns(TRN2, "dma", "dma_transpose", 128, 0, nbytes=368_000, from_hbm=False)
    assert from_hbm == pytest.approx(1000 / 0.9) and from_sbuf == pytest.approx(2000)


def dma_ns_per_byte(per_partition: int, partitions: int = 128, target: Target = TRN2) -> float:
    """Queue time per byte of one transfer moving `per_partition` bytes on each of `partitions`."""
    nbytes = per_partition * partitions
    return instruction_ns(target, "dma", "dma_copy", partitions, 0, nbytes=nbytes) / nbytes


def test_small_dma_rows_cost_more_per_byte_than_large_ones() -> None:
    # nki-dma-overview.rst: throughput rises with bytes per partition and nearly saturates at 4 KiB
    assert dma_ns_per_byte(1024) > dma_ns_per_byte(2048) > dma_ns_per_byte(4096)
    assert dma_ns_per_byte(1024) == pytest.approx(DMA_ROW_BYTES / 1024 / 368)  # packet-bound: one row
    assert dma_ns_per_byte(8192) == pytest.approx(dma_ns_per_byte(32768)) == pytest.approx(1 / 368)
    assert dma_ns_per_byte(1024, 4, TRN1) > dma_ns_per_byte(8192, 4, TRN1)


def test_dma_throughput_follows_the_documented_curve() -> None:
    """Below ~1 KiB per partition throughput is about proportional to the bytes (the figure's linear part);
    2 KiB reaches 75-90% of the peak, 4 KiB >= 95% (the figure: 81%, 97%)."""
    peak = 1 / dma_ns_per_byte(32768)
    share = {b: 1 / dma_ns_per_byte(b) / peak for b in (32, 256, 1024, 2048, 4096)}
    assert share[256] == pytest.approx(8 * share[32]) and share[1024] == pytest.approx(4 * share[256])
    assert 0.35 < share[1024] < 0.5 and 0.75 < share[2048] < 0.9 and share[4096] >= 0.95


def test_hbm_to_hbm_copies_pay_bytes_only() -> None:
    """The packet rule is per SBUF partition row (the figure's p_dim); a DRAM-to-DRAM copy pays its bytes."""
    ops = (hbm("r", 1, (4096, 128)), hbm("w", 2, (4096, 128)))
    copy = record("dma", "dma_copy", ops, 4096, 128, hbm_read=4096 * 256)
    assert record_cost(TRN2, copy).busy_ns == pytest.approx(4096 * 256 / 368)
    load = record("dma", "dma_copy", (hbm("r", 1), sbuf("w", 3, (128, 128), "bfloat16")), 128, 128,
                  hbm_read=128 * 256, sbuf_write=128 * 256)  # fmt: skip
    assert record_cost(TRN2, load).busy_ns == pytest.approx(128 * DMA_ROW_BYTES / 368)


def test_dma_time_is_monotone_in_bytes() -> None:
    times = [instruction_ns(TRN2, "dma", "dma_copy", 128, 0, nbytes=128 * b) for b in range(64, 16384, 64)]
    assert all(a <= b for a, b in itertools.pairwise(times))


def test_planner_rule_is_the_trace_rule_for_uniform_transfers() -> None:
    """The FFN planner's DMA term (over totals) equals the trace model's for equal transfers."""
    mach = machine(TRN2)
    for per_partition in (512, 1792, 4096):
        one = instruction_ns(TRN2, "dma", "dma_copy", 128, 0, nbytes=128 * per_partition)
        planner = dma_engine_bytes(10 * 128 * per_partition, 10 * 128, 16, mach.dma_row_bytes) * 16 / 368
        assert planner == pytest.approx(10 * one)


def test_assumed_row_bytes_moves_the_dma_cost() -> None:
    base = dma_ns_per_byte(1024)
    with assume(dma_row_bytes=DMA_ROW_BYTES * 3 // 2):
        assert dma_ns_per_byte(1024) == pytest.approx(1.5 * base, rel=1e-3)
    assert dma_ns_per_byte(1024) == base
    with pytest.raises(ValueError, match="no model assumption"):
        with assume(dma_knee=1):
            pass


def test_record_cost_reads_operands() -> None:
    assert record_cost(TRN2, matmul(3, 1, 2, n=256)).busy_ns == pytest.approx(256 / 2.4)
    evict = record("vector", "tensor_tensor", (sbuf("r", 1), psum("r", 2), sbuf("w", 1)))
    assert record_cost(TRN2, evict).busy_ns == pytest.approx(512 / 0.96)
    reduce = record("scalar", "activation", (sbuf("r", 1), sbuf("w", 2), sbuf("w", 3, (128, 1))))
    assert record_cost(TRN2, reduce).busy_ns == pytest.approx(576 / 1.2)
    barrier = record("gpsimd", "core_barrier", (), 0, 0)
    assert record_cost(TRN2, barrier).busy_ns == 0


def test_targets_without_figures_are_refused() -> None:
    with pytest.raises(ValueError, match="trn3"):
        instruction_ns(get_target("trn3"), "tensor", "nc_matmul", 128, 512, stationary=128)


def test_generated_planners_carry_the_shared_rule() -> None:
    """render.vendored copies dmarule along with the FFN planner, renamed private like the planner's names."""
    source = vendored(ffn_budget)
    assert "def _dma_engine_bytes(" in source and "_dma_engine_bytes(hbm, transfers * _P" in source
    space: dict[str, object] = {}
    exec(compile("import functools\nfrom typing import NamedTuple\n" + source, "vendored", "exec"), space)
    assert space["_dma_engine_bytes"](128 * 1024, 128, 16) == dma_engine_bytes(128 * 1024, 128, 16)  # type: ignore[operator]
