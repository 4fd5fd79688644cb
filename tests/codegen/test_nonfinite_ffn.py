"""Non-finite rows of an FFN or projection input. Their kernels transpose x's row tiles on the Tensor engine:
exact from trn2 on, an identity matmul on trn1, where 0 x inf = nan would carry one token's inf or nan to
the other tokens of its 128-token tile. So on trn1 the host refuses inf and nan in x; on trn2 a nan token
spoils only its own output row."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fusegen.sim import load_module

ROOT = Path(__file__).resolve().parents[2]
R, K, I = 130, 256, 256  # two row tiles, the second ragged


def _module(target: str) -> object:
    """generated/swiglu_ffn/kernel.py on the interpreter as `target`."""
    return load_module(ROOT / "generated" / "swiglu_ffn" / "kernel.py", target=target, force=True)


def _inputs() -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    x = torch.randn(R, K).bfloat16()
    w1t, wgt, w2t = (torch.randn(a, b).div(a**0.5).bfloat16() for a, b in ((K, I), (K, I), (I, K)))
    b1, bg, b2 = torch.randn(I), torch.randn(I), torch.randn(K)
    x[3, 7] = float("inf")  # one token's activation overflowed
    return x, w1t, b1, wgt, bg, w2t, b2


def _formula(x, w1t, b1, wgt, bg, w2t, b2) -> torch.Tensor:
    """out = (silu(x @ w1t + b1) * (x @ wgt + bg)) @ w2t + b2 in float64 (the kernel rounds h to bf16)."""
    x, w1t, wgt, w2t = (t.double() for t in (x, w1t, wgt, w2t))
    h = (F.silu(x @ w1t + b1.double()) * (x @ wgt + bg.double())).bfloat16().double()
    return h @ w2t + b2.double()


def test_trn1_refuses_inf_or_nan_in_x() -> None:
    args = _inputs()
    with pytest.raises(ValueError, match=r"swiglu_ffn: x holds 1 inf or nan element\(s\), but on trn1 the"):
        _module("trn1").swiglu_ffn(*args, target="trn1")


def test_trn1_takes_finite_x() -> None:
    args = list(_inputs())
    args[0][3, 7] = 1.0
    got = _module("trn1").swiglu_ffn(*args, target="trn1").double()
    torch.testing.assert_close(got, _formula(*args), rtol=2**-8, atol=2**-8)  # bf16 output: half an ulp


def test_trn2_keeps_a_nan_token_to_itself() -> None:
    args = _inputs()
    got = _module("trn2").swiglu_ffn(*args, target="trn2", lnc=1).double()
    others = [r for r in range(R) if r != 3]
    assert not bool(got[3].isfinite().all())
    torch.testing.assert_close(got[others], _formula(*args)[others], rtol=2**-8, atol=2**-8)


def test_the_refusal_is_needed_on_trn1() -> None:
    """The kernel itself on trn1 (the host's check bypassed): the other tokens of token 3's tile spoil."""
    module = _module("trn1")
    args = _inputs()
    module._SIGNATURE = module._SIGNATURE._replace(inexact_transpose=())
    got = module.swiglu_ffn(*args, target="trn1").float()
    spoilt = (~got.isfinite()).any(dim=1).nonzero().flatten().tolist()
    assert spoilt == list(range(128))  # token 3's whole tile, not the ragged second one
