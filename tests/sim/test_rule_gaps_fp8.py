"""nc_matmul's fp8 formats (ISA nc_matmul, Data types): float8_e4m3fn (OCP) is a Tensor-engine input from
NeuronCore-v4 only and never meets legacy float8_e4m3 in one matmul; legacy e4m3 and e5m2 work everywhere.
The interpreter stored both e4m3 formats as torch's e4m3fn and let an OCP fp8 matmul through on trn2."""

from __future__ import annotations

import pytest
import torch

import fusegen.sim as sim

from .conftest import assert_located

with sim.installed():
    import nki.isa as nisa
    import nki.language as nl


def _matmul(st_dtype, mv_dtype):
    """A kernel: out = w.T @ x for fp8 / bf16 SBUF copies of its [128, 64] arguments (the DMA casts)."""

    def kernel(w, x):
        ws = nl.ndarray((128, 64), dtype=st_dtype, buffer=nl.sbuf)
        xs = nl.ndarray((128, 64), dtype=mv_dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=ws, src=w)
        nisa.dma_copy(dst=xs, src=x)
        ps = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=ws, moving=xs)  # <-fp8-matmul
        out = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        sb = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=sb, src=ps)
        nisa.dma_copy(dst=out, src=sb)
        return out

    return kernel


def _args():
    """Weights and activations exactly representable in every fp8 format used here (multiples of 1/4)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randint(-8, 9, (128, 64), generator=g).float() / 4
    x = torch.randint(-8, 9, (128, 64), generator=g).float() / 4
    return w, x


@pytest.mark.parametrize("target", ["trn1", "trn2"])
@pytest.mark.parametrize("pair", ["stationary", "moving"])
def test_ocp_e4m3_matmul_before_neuroncore_v4_is_refused(target, pair):
    fn, bf = nl.float8_e4m3fn, nl.bfloat16
    kernel = _matmul(fn, bf) if pair == "stationary" else _matmul(bf, fn)
    with pytest.raises(
        sim.DtypeError, match=rf"\[matmul-fp8-e4m3fn\] {pair} is float8_e4m3fn on {target}"
    ) as e:
        sim.run(kernel, *_args(), target=target, rules="error")
    assert_located(e.value, __file__, "<-fp8-matmul")


def test_legacy_and_ocp_e4m3_never_share_a_matmul():
    with pytest.raises(
        sim.DtypeError, match=r"\[matmul-fp8-e4m3fn\] float8_e4m3 \(legacy\) and float8_e4m3fn"
    ):
        sim.run(_matmul(nl.float8_e4m3, nl.float8_e4m3fn), *_args(), target="trn3", rules="error")


@pytest.mark.parametrize(
    ("target", "st_dtype", "mv_dtype"),
    [
        ("trn3", "float8_e4m3fn", "bfloat16"),
        ("trn3", "float8_e4m3fn", "float8_e5m2"),
        ("trn2", "float8_e4m3", "bfloat16"),
        ("trn1", "float8_e4m3", "float8_e5m2"),
        ("trn2", "float8_e5m2", "bfloat16"),
    ],
)
def test_documented_fp8_matmuls_run_and_multiply(target, st_dtype, mv_dtype):
    w, x = _args()
    out = sim.run(_matmul(getattr(nl, st_dtype), getattr(nl, mv_dtype)), w, x, target=target, rules="error")
    assert torch.equal(out.outputs, w.T @ x)  # exact: every value and product sum is representable


def test_the_two_e4m3_formats_are_distinct_dtypes():
    assert nl.float8_e4m3 != nl.float8_e4m3fn
    assert torch.finfo(nl.float8_e4m3).max == 240.0 and torch.finfo(nl.float8_e4m3fn).max == 448.0
