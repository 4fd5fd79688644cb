"""The cost rules against hand-computed values (trn2 clocks: PE 2.4, ACT 1.2, DVE 0.96, Pool 1.2 GHz)."""

from __future__ import annotations

import pytest

from fusegen.perf.cost import instruction_cost, instruction_ns, record_cost
from fusegen.sim import get_target

from .records import matmul, psum, record, sbuf

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
    wide = instruction_cost(TRN2, "dma", "dma_copy", 128, 0, nbytes=32768)
    assert wide.busy_ns == pytest.approx(32768 / 368)  # 16 queues x 23 B/ns
    assert wide.latency_ns == pytest.approx(32768 / 368 + 1300)
    narrow = instruction_ns(TRN2, "dma", "dma_copy", 8, 0, nbytes=32768)
    assert narrow == pytest.approx(32768 / 23)  # 8 partitions: one queue
    assert instruction_ns(TRN1, "dma", "dma_copy", 8, 0, nbytes=17000) == pytest.approx(1000)


def test_dma_transpose_is_slower_from_sbuf_than_from_hbm() -> None:
    from_hbm = instruction_ns(TRN2, "dma", "dma_transpose", 128, 0, nbytes=36800)
    from_sbuf = instruction_ns(TRN2, "dma", "dma_transpose", 128, 0, nbytes=36800, from_hbm=False)
    assert from_hbm == pytest.approx(100 / 0.9) and from_sbuf == pytest.approx(200)


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
