"""FFN specs whose outputs share structure (an output that later math reads, a residual read twice, a
bias added after an output is taken) build and match independent torch formulas on the interpreter."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fusegen.cli import main
from fusegen.sim import load_module

HEAD = """kernel {name}
dim R, K, I
require K % 128 == 0
input x: bf16[R, K]
input w1t: bf16[K, I]
input wgt: bf16[K, I]
input w2t: bf16[I, K]
input r: f32[R, K]
input g: f32[K]
param eps = 1e-5
"""
R, K, I = 5, 256, 200


def _build(tmp_path: Path, name: str, body: str) -> object:
    spec = tmp_path / f"{name}.spec"
    spec.write_text(HEAD.format(name=name) + body + f"check R={R} K={K} I={I}\n")
    assert main(["build", "--out", str(tmp_path / "out"), str(spec)]) == 0
    return load_module(tmp_path / "out" / name / "kernel.py", target="trn2")


def _inputs() -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(17)
    x = torch.randn(R, K, generator=gen).bfloat16()
    w1t, wgt = ((torch.randn(K, I, generator=gen) * K**-0.5).bfloat16() for _ in range(2))
    w2t = (torch.randn(I, K, generator=gen) * I**-0.5).bfloat16()
    r = torch.randn(R, K, generator=gen) + 2.0  # an offset mean: norms must centre what they read
    g = torch.randn(K, generator=gen)
    return x, w1t, wgt, w2t, r, g


def _down(x: torch.Tensor, w1t: torch.Tensor, wgt: torch.Tensor, w2t: torch.Tensor) -> torch.Tensor:
    """bf16(silu(x W1) * (x Wg)) W2, written out here."""
    h = F.silu(x.float() @ w1t.float()) * (x.float() @ wgt.float())
    return h.bfloat16().float() @ w2t.float()


def _close(got: torch.Tensor, want: torch.Tensor, rtol: float = 1e-3) -> None:
    err = (got.float() - want.float()).abs().max().item()
    bound = 1e-5 + rtol * want.float().abs().max().item()
    assert err <= bound, f"max error {err:.3e} > {bound:.3e}"


def _rms(v: torch.Tensor) -> torch.Tensor:
    return v / v.pow(2).mean(dim=1, keepdim=True).add(1e-5).sqrt()


CASES = {
    # the MLP output and the residual sum both returned (f is an output and an operand)
    "mlp_and_residual": (
        "output f: f32[R, K]\noutput s: f32[R, K]\nh = silu(x @ w1t) * (x @ wgt)\n"
        "f = bf16(h) @ w2t\ns = r + f\n",
        lambda d, r, g: (d, r + d),
    ),
    # the down-projection is an output while another output adds a bias to it
    "bias_after_output": (
        "output d: f32[R, K]\noutput y: f32[R, K]\nh = silu(x @ w1t) * (x @ wgt)\n"
        "d = bf16(h) @ w2t\ny = d + g\n",
        lambda d, r, g: (d, d + g),
    ),
    # a residual read twice: once in the sum, once more inside the norm's input
    "residual_twice": (
        "output y: f32[R, K]\nh = silu(x @ w1t) * (x @ wgt)\nffn = bf16(h) @ w2t\ns = ffn + r\n"
        "y = rmsnorm(s + r, eps)\n",
        lambda d, r, g: (_rms(d + r + r),),
    ),
    # an output that is a norm's input, and a LayerNorm spelled out in the epilogue
    "layernorm_chain": (
        "output s: f32[R, K]\noutput y: f32[R, K]\nh = silu(x @ w1t) * (x @ wgt)\n"
        "s = bf16(h) @ w2t + r\nm = mean(s, axis=-1, keepdim=true)\nc = s - m\n"
        "v = mean(square(c), axis=-1, keepdim=true)\ny = c * rsqrt(v + eps) * g + s\n",
        lambda d, r, g: (d + r, F.layer_norm(d + r, (K,), eps=1e-5) * g + d + r),
    ),
    # the down-projection returned after an output that reads it once (it was computed over in place)
    "down_returned_after_its_user": (
        "output y: f32[R, K]\noutput d: f32[R, K]\nh = silu(x @ w1t) * (x @ wgt)\nd = bf16(h) @ w2t\n"
        "y = rmsnorm(d + r + r, eps)\n",
        lambda d, r, g: (_rms(d + r + r), d),
    ),
    # the bare down-projection read by two later values
    "down_read_twice": (
        "output y: f32[R, K]\noutput z: f32[R, K]\nh = silu(x @ w1t) * (x @ wgt)\n"
        "d = bf16(h) @ w2t\ny = d + r\nz = layernorm(d, eps, g) + r\n",
        lambda d, r, g: (d + r, F.layer_norm(d, (K,), eps=1e-5) * g + r),
    ),
    # the down-projection added to itself: no partner to fold into the accumulator (it was an internal error)
    "down_added_to_itself": (
        "output y: f32[R, K]\nh = silu(x @ w1t) * (x @ wgt)\nd = bf16(h) @ w2t\ny = d + d\n",
        lambda d, r, g: (d + d,),
    ),
    # a statistic of a function of the bare down-projection: the first pass must not square d in place and
    # then fuse the square into its sum again (it gave mean(d**4))
    "statistic_of_a_square": (
        "output m: f32[R, 1]\nh = silu(x @ w1t) * (x @ wgt)\nd = bf16(h) @ w2t\n"
        "m = rsqrt(mean(square(d), axis=-1, keepdim=true) + eps)\n",
        lambda d, r, g: (d.square().mean(dim=1, keepdim=True).add(1e-5).rsqrt(),),
    ),
    # the same through a scale the Scalar engine folds (exp(0.5 d) read back as exp(0.5 exp(0.5 d)))
    "statistic_of_a_scaled_exp": (
        "output m: f32[R, 1]\nh = silu(x @ w1t) * (x @ wgt)\nd = bf16(h) @ w2t\n"
        "m = sum(exp(d * 0.5), axis=-1, keepdim=true)\n",
        lambda d, r, g: ((d * 0.5).exp().sum(dim=1, keepdim=True),),
    ),
    # the function of d also read by a later pass, and by a statistic before the fused one
    "statistics_of_a_shared_square": (
        "output m: f32[R, 1]\noutput y: f32[R, K]\nh = silu(x @ w1t) * (x @ wgt)\nd = bf16(h) @ w2t\n"
        "q = square(d)\nm = max(q, axis=-1, keepdim=true) + sum(q, axis=-1, keepdim=true)\ny = q + r\n",
        lambda d, r, g: (
            d.square().amax(dim=1, keepdim=True) + d.square().sum(dim=1, keepdim=True),
            d.square() + r,
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_shared_outputs_build_and_match_the_formula(name: str, tmp_path: Path) -> None:
    body, formula = CASES[name]
    module = _build(tmp_path, name, body)
    x, w1t, wgt, w2t, r, g = _inputs()
    got = getattr(module, name)(x, w1t, wgt, w2t, r, g, lnc=1, target="trn2")
    got = got if isinstance(got, tuple) else (got,)
    want = formula(_down(x, w1t, wgt, w2t), r, g)
    assert len(got) == len(want)
    for out, expected in zip(got, want, strict=True):
        _close(out, expected)


def test_a_statistic_cast_for_a_per_token_output_is_the_whole_row(tmp_path: Path) -> None:
    # bf16(sum(d)) was recomputed in the last pass from its one (last) K-block: K spans several blocks here
    spec = tmp_path / "stat_cast.spec"
    body = "output m: bf16[R, 1]\nh = silu(x @ w1t) * (x @ wgt)\nd = bf16(h) @ w2t\n"
    body += "m = bf16(sum(d, axis=-1, keepdim=true))\n"
    spec.write_text(HEAD.format(name="stat_cast") + body + "check R=7 K=1280 I=384\n")
    assert main(["build", "--out", str(tmp_path / "out"), str(spec)]) == 0
    module = load_module(tmp_path / "out" / "stat_cast" / "kernel.py", target="trn2")
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(7, 1280, generator=gen).bfloat16()
    w1t, wgt = ((torch.randn(1280, 384, generator=gen) * 1280**-0.5).bfloat16() for _ in range(2))
    w2t = (torch.randn(384, 1280, generator=gen) * 384**-0.5).bfloat16()
    r, g = torch.randn(7, 1280, generator=gen), torch.randn(1280, generator=gen)
    got = module.stat_cast(x, w1t, wgt, w2t, r, g, lnc=1, target="trn2")
    _close(got, _down(x, w1t, wgt, w2t).sum(dim=1, keepdim=True), rtol=2e-2)  # one bf16 rounding
