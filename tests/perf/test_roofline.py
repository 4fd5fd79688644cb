"""Roofline arithmetic: PE peak per core x LNC, HBM share per physical core."""

from __future__ import annotations

import pytest

from fusegen.perf.roofline import (
    hbm_bytes_moved,
    hbm_bytes_per_ns,
    matmul_flops,
    pe_peak_flops_per_ns,
    roofline,
    spec_flops,
)
from fusegen.sim import get_target

from .records import dma_in, matmul

TRN2, TRN1 = get_target("trn2"), get_target("trn1")


def test_peaks_per_core() -> None:
    assert pe_peak_flops_per_ns(TRN2) == pytest.approx(78_643.2)  # 78.6 TFLOPS bf16
    assert pe_peak_flops_per_ns(TRN1) == pytest.approx(91_750.4)
    assert pe_peak_flops_per_ns(TRN2, fp32=True) == pytest.approx(78_643.2 / 4)
    assert hbm_bytes_per_ns(TRN2) == pytest.approx(2900 / 8)
    assert hbm_bytes_per_ns(TRN1) == pytest.approx(820 / 2)


def test_compute_bound_and_memory_bound() -> None:
    flops = 2 * 1024 * 1280 * 3456 * 3
    compute = roofline(TRN2, 2, flops, min_hbm_bytes=10**6)
    assert compute.bound == "PE"
    assert compute.time_ns == pytest.approx(flops / (2 * 78_643.2))
    memory = roofline(TRN2, 1, 1e6, min_hbm_bytes=36_250_000)
    assert memory.bound == "HBM" and memory.time_ns == pytest.approx(100_000)
    assert memory.efficiency(200_000) == pytest.approx(0.5)


def test_flops_and_bytes_from_a_trace() -> None:
    recs = [matmul(3, 1, 2, n=512), matmul(3, 1, 2, n=100), dma_in(4, 5, nbytes=4096)]
    flops, fp32 = matmul_flops(recs)
    assert flops == 2 * 128 * 128 * (512 + 100) and not fp32
    assert matmul_flops([matmul(3, 1, 2, dtype="float32")])[1]
    assert hbm_bytes_moved(recs) == 4096


def test_spec_flops_count_the_math_not_the_kernels_identity_matmuls() -> None:
    from pathlib import Path

    from fusegen.dsl import load_spec

    examples = Path(__file__).parents[2] / "examples"
    ffn = load_spec(str(examples / "swiglu_ffn.spec"))[0]
    assert spec_flops(ffn, {"R": 256, "K": 1280, "I": 3416}) == 2 * 256 * 1280 * 3416 * 3
    rows = load_spec(str(examples / "add_rmsnorm.spec"))[0]  # its kernel stages rows on the PE: no math
    assert spec_flops(rows, {"T": 4096, "H": 4096}) == 0
