"""The language gaps of issue 18, item 4, on the interpreter against hand-written torch: `where` in the FFN
combine, a [T, 2D] activation sliced along its width (silu_and_mul, resident and streamed), and a
keepdim=false statistic broadcast back over the row with `[:, None]` (t5_rmsnorm), on both targets."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fusegen.sim import load_module

GENERATED = Path(__file__).resolve().parents[2] / "generated"
#: (target, LNC) launches: trn1 has no LNC 2
LAUNCHES = [("trn2", 1), ("trn2", 2), ("trn1", 1)]


def _randn(gen: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) * scale


def _close(got: torch.Tensor, want: torch.Tensor, rtol: float) -> None:
    """|got - want| <= 1e-5 + rtol * max|want| (the generated tests' bound), in got's dtype."""
    assert got.shape == want.shape and got.dtype == want.dtype
    err = (got.float() - want.float()).abs().max().item()
    assert err <= 1e-5 + rtol * want.float().abs().max().item(), err


@pytest.mark.parametrize(("target", "lnc"), LAUNCHES)
def test_silu_and_mul_at_an_odd_width_matches_torch(target: str, lnc: int) -> None:
    tokens, width = 131, 333  # two token tiles, the second partial; an odd D
    x = _randn(torch.Generator().manual_seed(3), tokens, 2 * width).bfloat16()
    module = load_module(GENERATED / "silu_and_mul" / "kernel.py", target=target)
    got = module.silu_and_mul(x, lnc=lnc, target=target)
    want = (F.silu(x[:, :width].float()) * x[:, width:].float()).bfloat16()  # vLLM's silu_and_mul
    _close(got, want, rtol=2e-2)


def test_silu_and_mul_streams_rows_too_wide_for_sbuf() -> None:
    module = load_module(GENERATED / "silu_and_mul" / "kernel.py", target="trn2")
    width = 49152  # two halves of 48k columns: whole rows do not fit the SBUF budget
    _, _, _, streamed = module._choose_rows(module._MODEL, width, 1, module._SBUF_BUDGET["trn2"])
    assert streamed
    x = _randn(torch.Generator().manual_seed(4), 2, 2 * width).bfloat16()
    got = module.silu_and_mul(x, lnc=1, target="trn2")
    _close(got, (F.silu(x[:, :width].float()) * x[:, width:].float()).bfloat16(), rtol=2e-2)


@pytest.mark.parametrize(("target", "lnc"), LAUNCHES)
@pytest.mark.parametrize("slope", [0.01, 0.2])
def test_leaky_glu_ffn_matches_torch_leaky_relu(target: str, lnc: int, slope: float) -> None:
    rows, hidden, inter = 130, 256, 300
    gen = torch.Generator().manual_seed(5)
    x = _randn(gen, rows, hidden).bfloat16()
    w1t, wgt = (_randn(gen, hidden, inter, scale=hidden**-0.5).bfloat16() for _ in range(2))
    b1 = _randn(gen, inter)
    w2t = _randn(gen, inter, hidden, scale=inter**-0.5).bfloat16()
    module = load_module(GENERATED / "leaky_glu_ffn" / "kernel.py", target=target)
    got = module.leaky_glu_ffn(x, w1t, b1, wgt, w2t, slope=slope, lnc=lnc, target=target)
    gate = F.leaky_relu(x.float() @ w1t.float() + b1, slope)
    want = ((gate * (x.float() @ wgt.float())).bfloat16().float() @ w2t.float()).bfloat16()
    _close(got, want, rtol=2e-2)


@pytest.mark.parametrize(("target", "lnc"), LAUNCHES)
def test_t5_rmsnorm_matches_the_hugging_face_formula(target: str, lnc: int) -> None:
    tokens, width, eps = 131, 384, 1e-6
    gen = torch.Generator().manual_seed(6)
    x, w = _randn(gen, tokens, width).bfloat16(), (1 + _randn(gen, width, scale=0.1)).bfloat16()
    module = load_module(GENERATED / "t5_rmsnorm" / "kernel.py", target=target)
    y, rstd = module.t5_rmsnorm(x, w, save=True, lnc=lnc, target=target)
    # LlamaRMSNorm.forward: variance in fp32, the normalised row rounded to the input dtype, then the weight
    want_rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    want = (w.float() * (x.float() * want_rstd).bfloat16().float()).bfloat16()
    _close(y, want, rtol=2e-2)
    _close(rstd, want_rstd[:, 0], rtol=1e-5)
