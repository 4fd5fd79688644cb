"""Generated FFN kernels at wide K (8192, 16384) on the interpreter against independent torch formulas:
the epilogue's and prologue's row statistics over many K-blocks, and streamed up-projection weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fusegen.sim import load_module

GENERATED = Path(__file__).resolve().parents[2] / "generated"


def _randn(gen: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) * scale


def _close(got: torch.Tensor, want: torch.Tensor, rtol: float) -> None:
    err = (got.float() - want.float()).abs().max().item()
    bound = 1e-5 + rtol * want.float().abs().max().item()
    assert err <= bound, f"max error {err:.3e} > {bound:.3e}"


@pytest.mark.parametrize(
    ("r", "k", "i", "lnc"), [(130, 8192, 256, 2), (5, 16384, 128, 1), (3, 16384, 200, 2)]
)
def test_swiglu_rmsnorm_at_wide_k(r: int, k: int, i: int, lnc: int) -> None:
    """x_new = swiglu(x) + b2 + a; z = x_new / rms(x_new) * gamma, written out here independently."""
    gen = torch.Generator().manual_seed(k + r)
    x = _randn(gen, r, k).bfloat16()
    w1t, wgt = (_randn(gen, k, i, scale=k**-0.5).bfloat16() for _ in range(2))
    b1, bg = _randn(gen, i), _randn(gen, i)
    w2t = _randn(gen, i, k, scale=i**-0.5).bfloat16()
    b2, a, gamma = _randn(gen, k), _randn(gen, r, k), _randn(gen, k)
    module = load_module(GENERATED / "swiglu_rmsnorm" / "kernel.py", target="trn2")
    x_new, z = module.swiglu_rmsnorm(x, w1t, b1, wgt, bg, w2t, b2, a, gamma, lnc=lnc, target="trn2")
    h = F.silu(x.float() @ w1t.float() + b1) * (x.float() @ wgt.float() + bg)
    want = h.bfloat16().float() @ w2t.float() + b2 + a
    _close(x_new, want, rtol=1e-2)
    rms = want.pow(2).mean(dim=1, keepdim=True).add(1e-6).sqrt()
    _close(z, (want / rms * gamma).bfloat16(), rtol=2e-2)


@pytest.mark.parametrize(("r", "k", "i"), [(4, 8192, 128), (3, 16384, 256)])
def test_prenorm_swiglu_at_wide_k(r: int, k: int, i: int) -> None:
    """out = x + (silu(xn Wg) * (xn Wu)) Wd with xn = bf16(rmsnorm(x) * gamma): the prologue's statistics."""
    gen = torch.Generator().manual_seed(k - r)
    x, gamma = _randn(gen, r, k).bfloat16(), _randn(gen, k)
    wgt, wut = (_randn(gen, k, i, scale=k**-0.5).bfloat16() for _ in range(2))
    wdt = _randn(gen, i, k, scale=i**-0.5).bfloat16()
    module = load_module(GENERATED / "prenorm_swiglu" / "kernel.py", target="trn2")
    out = module.prenorm_swiglu(x, gamma, wgt, wut, wdt, lnc=2, target="trn2")
    xf = x.float()
    xn = (xf / xf.pow(2).mean(dim=1, keepdim=True).add(1e-6).sqrt() * gamma).bfloat16().float()
    h = F.silu(xn @ wgt.float()) * (xn @ wut.float())
    _close(out, (h.bfloat16().float() @ wdt.float() + xf).bfloat16(), rtol=2e-2)


def test_swiglu_ffn_ln_at_k_16384() -> None:
    """LayerNorm's two nested statistics (mean, then the centred variance) over 32 K-blocks."""
    r, k, i = 3, 16384, 128
    gen = torch.Generator().manual_seed(3)
    x = _randn(gen, r, k).bfloat16()
    w1t, wgt = (_randn(gen, k, i, scale=k**-0.5).bfloat16() for _ in range(2))
    b1, bg = _randn(gen, i), _randn(gen, i)
    w2t = _randn(gen, i, k, scale=i**-0.5).bfloat16()
    b2, a = _randn(gen, k), _randn(gen, r, k) + 3.0  # an offset mean: the centring must be right
    module = load_module(GENERATED / "swiglu_ffn_ln" / "kernel.py", target="trn2")
    x_new, z = module.swiglu_ffn_ln(x, w1t, b1, wgt, bg, w2t, b2, a, eps=1e-6, lnc=2)
    h = F.silu(x.float() @ w1t.float() + b1) * (x.float() @ wgt.float() + bg)
    want = h.bfloat16().float() @ w2t.float() + b2 + a
    _close(x_new, want, rtol=1e-3)
    _close(z, F.layer_norm(want, (k,), eps=1e-6).bfloat16(), rtol=2e-2)
