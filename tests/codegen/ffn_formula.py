"""The FFN kernel tests' shared ground truth: the seed op's inputs and its formula, written independently of
the spec, and the max-error check against it."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

GENERATED = Path(__file__).resolve().parents[2] / "generated"


def inputs(r: int, k: int, i: int, seed: int) -> list[torch.Tensor]:
    """x, W1^T, b1, Wg^T, bg, W2^T, b2 and a residual of the seed op, seeded."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale

    return [
        randn(r, k).bfloat16(),
        randn(k, i, scale=k**-0.5).bfloat16(),
        randn(i),
        randn(k, i, scale=k**-0.5).bfloat16(),
        randn(i),
        randn(i, k, scale=i**-0.5).bfloat16(),
        randn(k),
        randn(r, k),
    ]


def swiglu(x, w1t, b1, wgt, bg, w2t, b2):  # type: ignore[no-untyped-def]
    """The seed op, written independently of the spec: silu(x W1 + b1) * (x Wg + bg) -> bf16 -> @ W2 + b2."""
    h = F.silu(x.float() @ w1t.float() + b1) * (x.float() @ wgt.float() + bg)
    return h.bfloat16().float() @ w2t.float() + b2


def close(got: torch.Tensor, want: torch.Tensor, rtol: float) -> None:
    """Max error within 1e-5 + rtol * max|want| (the nki-library 'max' comparator)."""
    err = (got.float() - want.float()).abs().max().item()
    bound = 1e-5 + rtol * want.float().abs().max().item()
    assert err <= bound, f"max error {err:.3e} > {bound:.3e}"
