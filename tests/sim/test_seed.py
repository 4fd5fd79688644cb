"""The user's seed SwiGLU kernels, unmodified, against an fp32 torch reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fusegen.sim as sim

from .conftest import SEED_KERNEL, close

pytestmark = pytest.mark.skipif(not SEED_KERNEL.exists(), reason="seed kernel not present")


def _load(monkeypatch: pytest.MonkeyPatch, lnc: int):
    """The seed reads its LNC from the environment at import time."""
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", str(lnc))
    module = sim.load_module(SEED_KERNEL, rules="error")  # the seed conforms to every documented rule
    assert module.LNC == lnc
    return module


def _pack(b: torch.Tensor) -> torch.Tensor:
    return b.reshape(-1, 128).t().contiguous()


def _inputs(R: int, K: int, I: int):
    x = torch.randn(R, K).bfloat16()
    w1t = (torch.randn(K, I) / K**0.5).bfloat16()
    wgt = (torch.randn(K, I) / K**0.5).bfloat16()
    w2t = (torch.randn(I, K) / I**0.5).bfloat16()
    b1, bg, b2 = torch.randn(I) * 0.1, torch.randn(I) * 0.1, torch.randn(K) * 0.1
    return x, w1t, b1, wgt, bg, w2t, b2


def _reference(x, w1t, b1, wgt, bg, w2t, b2):
    xf = x.float()
    return (F.silu(xf @ w1t.float() + b1) * (xf @ wgt.float() + bg)) @ w2t.float() + b2


CASES = [  # (LNC, R, K, I, S, CI); S/CI None = the seed's own plan()
    (2, 512, 256, 384, None, None),
    (2, 512, 256, 384, 128, 256),
    (1, 256, 320, 256, 128, 128),
    (1, 384, 256, 512, 256, 512),
]


@pytest.mark.parametrize(("lnc", "R", "K", "I", "S", "CI"), CASES)
def test_swiglu_stream_kernel(monkeypatch, lnc, R, K, I, S, CI):
    seed = _load(monkeypatch, lnc)
    if S is None:
        S, CI, _ = seed.plan(K, I, R // lnc)
    args = _inputs(R, K, I)
    x, w1t, b1, wgt, bg, w2t, b2 = args
    out = seed.swiglu_stream_kernel[lnc](x, w1t, _pack(b1), wgt, _pack(bg), w2t, b2, S, CI)
    assert out.dtype == torch.bfloat16 and out.shape == (R, K)
    assert close(out, _reference(*args))
    stats = seed.swiglu_stream_kernel.last_run.stats
    assert len(stats["cores"]) == lnc
    assert all(c["sbuf_peak_bytes"] <= sim.TARGETS["trn2"].sbuf_usable_bytes for c in stats["cores"])


@pytest.mark.parametrize(("lnc", "R", "K", "I", "S", "CI"), [CASES[1], CASES[2]])
def test_swiglu_stream_ln_kernel(monkeypatch, lnc, R, K, I, S, CI):
    seed = _load(monkeypatch, lnc)
    args = _inputs(R, K, I)
    x, w1t, b1, wgt, bg, w2t, b2 = args
    a = torch.randn(R, K)
    eps = 1e-5
    x_new, z = seed.swiglu_stream_ln_kernel[lnc](x, w1t, _pack(b1), wgt, _pack(bg), w2t, b2, a, eps, S, CI)
    ref_x = _reference(*args) + a
    ref_z = F.layer_norm(ref_x, (K,), eps=eps)
    assert x_new.dtype == torch.float32 and z.dtype == torch.bfloat16
    assert close(x_new, ref_x) and close(z, ref_z)


def test_seed_trace_and_psum_banks(monkeypatch):
    seed = _load(monkeypatch, 2)
    x, w1t, b1, wgt, bg, w2t, b2 = _inputs(512, 256, 256)
    run = sim.run(seed.swiglu_stream_kernel, x, w1t, _pack(b1), wgt, _pack(bg), w2t, b2, 256, 256, grid=2)
    mm = [r for r in run.trace if r.op == "nc_matmul"]
    assert {r.psum_bank for r in mm} == {0, 1}  # y1 and yg are live together; ps reuses a freed bank
    assert all(r.file == str(SEED_KERNEL.resolve()) or r.file.endswith("swiglu_stream_kernel.py") for r in mm)
    assert max(c["psum_peak_banks"] for c in run.stats["cores"]) == 2
