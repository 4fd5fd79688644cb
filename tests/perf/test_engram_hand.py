"""The hand-scheduled engram_gate experiment (bench/engram_hand_kernel.py) computes the Engram gate: checked
on the interpreter against a float64 formula written from the spec's math, with a ragged token tile."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fusegen import sim

ROOT = Path(__file__).resolve().parents[2]


def _formula(x: torch.Tensor, kv: torch.Tensor, w_h: torch.Tensor, w_e: torch.Tensor) -> torch.Tensor:
    """out = x + sigmoid(sign(s) sqrt(max(|s|, 1e-6))) v, s the RMS-normalised dot / sqrt(H), in float64."""
    heads, width = x.shape[1], x.shape[2]
    xd, k, v = x.double(), kv[:, :heads].double(), kv[:, heads:].double()
    rx = torch.rsqrt((xd * xd).mean(-1, keepdim=True) + 1e-20)
    rk = torch.rsqrt((k * k).mean(-1, keepdim=True) + 1e-20)
    s = (xd * rx * w_h.double() * k * rk * w_e.double()).sum(-1, keepdim=True) / width**0.5
    return xd + torch.sigmoid(torch.sign(s) * torch.sqrt(s.abs().clamp_min(1e-6))) * v


@pytest.mark.parametrize(("rows", "heads", "lnc"), [(300, 2, 2), (128, 3, 1)])
def test_hand_kernel_matches_the_formula(rows: int, heads: int, lnc: int) -> None:
    """Every output within one bf16 ulp of the exact value, plus 2^-14 |v| where x + g*v cancels (the PE's
    g_hi + g_lo carries 16 bits of g; the generated kernel's fp32 g*v + x also errs there)."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn((rows, heads, 1024), generator=gen).bfloat16()
    kv = torch.randn((rows, heads + 1, 1024), generator=gen).bfloat16()
    w_h, w_e = ((1 + 0.1 * torch.randn((heads, 1024), generator=gen)).bfloat16() for _ in range(2))
    hand = sim.load_module(ROOT / "bench" / "engram_hand_kernel.py", target="trn2")
    out = hand.engram_gate_hand[lnc](x, kv, w_h, w_e, 1e-20, 1e-6, 1, 512).double()
    want = _formula(x, kv, w_h, w_e)
    ulp = torch.exp2(torch.floor(torch.log2(want.abs().clamp_min(2.0**-100))) - 7)
    v = kv[:, heads:].double()
    assert ((out - want).abs() <= ulp + 2.0**-14 * v.abs()).all()
