"""Specs written the way users write them (issue 18, item 4), built into a temporary folder and run on the
interpreter against hand-written torch: `where` in every family's elementwise stages, width slices with a
reduction and with heads, keepdim=false statistics broadcast back with `[:, None]`; and the specs of the
issue that no family carries yet get one diagnostic at the line that leaves them, naming every family."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fusegen.cli import main
from fusegen.codegen.build import BuildOptions, build_spec
from fusegen.dsl.diagnostics import SpecError
from fusegen.sim import load_module

EPS = 1e-6


def _build(tmp_path: Path, name: str, body: str) -> object:
    """`body` as spec `name`, built into tmp_path; its kernel module on the trn2 interpreter."""
    spec = tmp_path / f"{name}.spec"
    spec.write_text(f"kernel {name}\n{body}")
    assert main(["build", "--out", str(tmp_path / "out"), str(spec)]) == 0
    return load_module(tmp_path / "out" / name / "kernel.py", target="trn2")


def _close(got: torch.Tensor, want: torch.Tensor, rtol: float) -> None:
    err = (got.float() - want.float()).abs().max().item()
    assert got.shape == want.shape and err <= 1e-5 + rtol * want.float().abs().max().item(), err


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


WHERE_FFN = """dim R, K, I
require K % 128 == 0
input x: bf16[R, K]
input w1t: bf16[K, I]
input wgt: bf16[K, I]
input w2t: bf16[I, K]
input a: f32[R, K]
output y: f32[R, K]
xn = bf16(where(x > 0, x, 0.5 * x))
h = where(xn @ w1t > 0, xn @ w1t, 0) * (xn @ wgt)
d = bf16(h) @ w2t
y = where(d > a, d, a - d)
check R=3 K=128 I=64
"""


def test_where_in_the_ffn_prologue_combine_and_epilogue(tmp_path: Path) -> None:
    module = _build(tmp_path, "where_ffn", WHERE_FFN)
    gen = _gen(1)
    x = torch.randn(130, 256, generator=gen).bfloat16()
    w1t, wgt = (torch.randn(256, 200, generator=gen).mul(1 / 16).bfloat16() for _ in range(2))
    w2t = torch.randn(200, 256, generator=gen).mul(200**-0.5).bfloat16()
    a = torch.randn(130, 256, generator=gen)
    got = module.where_ffn(x, w1t, wgt, w2t, a, lnc=2)  # type: ignore[attr-defined]
    xn = F.leaky_relu(x.float(), 0.5).bfloat16().float()
    h = torch.relu(xn @ w1t.float()) * (xn @ wgt.float())
    d = h.bfloat16().float() @ w2t.float()
    _close(got, torch.where(d > a, d, a - d), rtol=1e-3)


WHERE_ROWS = """dim T, H
input x: bf16[T, H]
input w: f32[H]
param eps = 1e-6
output y: f32[T, H]
optional output s: f32[T]
rstd = rsqrt(mean(square(x), axis=-1) + eps)
wp = where(w > 0, w, 0)
s = where(rstd > 1, rstd, 1.0)
y = where(x > 0, x, 0.25 * x) * s[:, None] * wp
check T=3 H=64
"""


def test_where_in_the_row_prep_per_row_math_and_epilogue(tmp_path: Path) -> None:
    module = _build(tmp_path, "where_rows", WHERE_ROWS)
    gen = _gen(2)
    x = (torch.randn(131, 300, generator=gen) * torch.rand(131, 1, generator=gen) * 2).bfloat16()
    w = torch.randn(300, generator=gen)
    y, s = module.where_rows(x, w, save=True, lnc=2)  # type: ignore[attr-defined]
    rstd = torch.rsqrt(x.float().pow(2).mean(-1) + EPS)
    want_s = torch.clamp(rstd, min=1.0)
    assert (rstd > 1).any() and (rstd < 1).any()  # both branches taken
    _close(s, want_s, rtol=1e-5)
    _close(y, F.leaky_relu(x.float(), 0.25) * want_s[:, None] * torch.relu(w), rtol=1e-5)


GEGLU_NORM = """dim T, G, D
input x: bf16[T, G, 2*D]
input w: bf16[D]
param eps = 1e-6
output y: bf16[T, G, D]
g = gelu_tanh(x[:, :, 0:D]) * x[:, :, D:2*D]
y = rmsnorm(g, eps, w)
check T=3 G=2 D=40
"""


@pytest.mark.parametrize("lnc", [1, 2])
def test_width_slices_per_head_feed_a_reduction(tmp_path: Path, lnc: int) -> None:
    module = _build(tmp_path, "geglu_norm", GEGLU_NORM)
    gen = _gen(3)
    x = torch.randn(130, 3, 2 * 77, generator=gen).bfloat16()  # odd D = 77, three heads
    w = (1 + 0.1 * torch.randn(77, generator=gen)).bfloat16()
    got = module.geglu_norm(x, w, lnc=lnc)  # type: ignore[attr-defined]
    g = F.gelu(x[..., :77].float(), approximate="tanh") * x[..., 77:].float()
    _close(got, F.rms_norm(g, (77,), w.float(), EPS).bfloat16(), rtol=2e-2)


KEEPDIM_FFN = """dim R, K, I
require K % 128 == 0
input x: bf16[R, K]
input w1t: bf16[K, I]
input w2t: bf16[I, K]
param eps = 1e-6
output y: bf16[R, K]
d = bf16(relu(x @ w1t)) @ w2t
ms = mean(square(d), axis=-1)
y = d * rsqrt(ms + eps)[:, None]
check R=3 K=128 I=64
"""


def test_a_keepdim_false_statistic_in_the_ffn_epilogue(tmp_path: Path) -> None:
    module = _build(tmp_path, "keepdim_ffn", KEEPDIM_FFN)
    gen = _gen(4)
    x = torch.randn(130, 256, generator=gen).bfloat16()
    w1t = torch.randn(256, 200, generator=gen).mul(1 / 16).bfloat16()
    w2t = torch.randn(200, 256, generator=gen).mul(200**-0.5).bfloat16()
    got = module.keepdim_ffn(x, w1t, w2t, lnc=1)  # type: ignore[attr-defined]
    d = torch.relu(x.float() @ w1t.float()).bfloat16().float() @ w2t.float()
    _close(got, F.rms_norm(d, (256,), eps=EPS).bfloat16(), rtol=2e-2)


def _diagnostic(tmp_path: Path, name: str, body: str) -> str:
    spec = tmp_path / f"{name}.spec"
    spec.write_text(f"kernel {name}\n{body}")
    with pytest.raises(SpecError) as caught:
        build_spec(str(spec), BuildOptions(out_dir=tmp_path))
    return str(caught.value)


RMSNORM_QKV = """dim T, H, NQ, NKV
input x: bf16[T, H]
input g: bf16[H]
input wq: bf16[H, NQ]
input wk: bf16[H, NKV]
input wv: bf16[H, NKV]
param eps = 1e-6
output q: bf16[T, NQ]
output k: bf16[T, NKV]
output v: bf16[T, NKV]
xn = bf16(rmsnorm(x, eps, g))
q = xn @ wq
k = xn @ wk
v = xn @ wv
check T=7 H=128 NQ=128 NKV=64
"""


def test_the_issues_qkv_projection_spec_matches_torch(tmp_path: Path) -> None:
    """Issue 18's "Why": the pre-attention QKV projection with a fused RMSNorm prologue, as first written."""
    module = _build(tmp_path, "rmsnorm_qkv", RMSNORM_QKV)
    gen = _gen(6)
    x = torch.randn(130, 256, generator=gen).bfloat16()
    g = (1 + 0.1 * torch.randn(256, generator=gen)).bfloat16()
    wq, wk, wv = (torch.randn(256, n, generator=gen).mul(1 / 16).bfloat16() for n in (256, 128, 128))
    got = module.rmsnorm_qkv(x, g, wq, wk, wv, lnc=1)  # type: ignore[attr-defined]
    xn = F.rms_norm(x.float(), (256,), g.float(), eps=EPS).bfloat16().float()
    for out, w in zip(got, (wq, wk, wv), strict=True):
        _close(out, (xn @ w.float()).bfloat16(), rtol=1e-2)


OUT_PROJ_RESIDUAL = """dim T, H, A
input a: bf16[T, A]
input wo: bf16[A, H]
input r: bf16[T, H]
output y: bf16[T, H]
y = a @ wo + r
check T=7 H=128 A=128
"""


def test_the_issues_output_projection_with_residual_matches_torch(tmp_path: Path) -> None:
    """Issue 18's "Why": an output projection with its residual add, as first written."""
    module = _build(tmp_path, "out_proj_residual", OUT_PROJ_RESIDUAL)
    gen = _gen(7)
    a = torch.randn(130, 384, generator=gen).bfloat16()
    wo = torch.randn(384, 256, generator=gen).mul(384**-0.5).bfloat16()
    r = torch.randn(130, 256, generator=gen).bfloat16()
    got = module.out_proj_residual(a, wo, r, lnc=1)  # type: ignore[attr-defined]
    _close(got, (a.float() @ wo.float() + r.float()).bfloat16(), rtol=1e-2)


FFN_AMAX = """dim R, K, I
require K % 128 == 0
input x: bf16[R, K]
input w1t: bf16[K, I]
input w2t: bf16[I, K]
output y: bf16[R, K]
output s: f32[R, 1]
y = bf16(relu(x @ w1t)) @ w2t
s = max(abs(y), axis=-1, keepdim=true) / 448
check R=7 K=128 I=64
"""


def test_a_per_token_amax_output_of_the_ffn_matches_torch(tmp_path: Path) -> None:
    """Issue 18's "Why": a per-token `[R, 1]` scale beside the FFN's output (activation quantisation)."""
    module = _build(tmp_path, "ffn_amax", FFN_AMAX)
    gen = _gen(5)
    x = torch.randn(130, 256, generator=gen).bfloat16()
    w1t = torch.randn(256, 200, generator=gen).mul(1 / 16).bfloat16()
    w2t = torch.randn(200, 256, generator=gen).mul(200**-0.5).bfloat16()
    y, s = module.ffn_amax(x, w1t, w2t, lnc=1)  # type: ignore[attr-defined]
    d = torch.relu(x.float() @ w1t.float()).bfloat16().float() @ w2t.float()
    _close(y, d.bfloat16(), rtol=1e-2)
    _close(s, d.abs().amax(dim=-1, keepdim=True) / 448, rtol=1e-5)


def test_a_row_statistic_times_the_rows_without_none_says_how(tmp_path: Path) -> None:
    body = ("dim T, H\ninput x: bf16[T, H]\noutput y: bf16[T, H]\nrstd = rsqrt(mean(square(x), axis=-1))\n"
            "y = x * rstd\ncheck T=7 H=64\n")  # fmt: skip
    text = _diagnostic(tmp_path, "no_none", body)
    assert ":6:5: error: shapes [T, H] and [T] do not broadcast in `*`" in text, text
    hint = "[T] does not run along the rows of [T, H]: write `rstd[:, None]`, or reduce with keepdim=true"
    assert hint in text, text


def test_a_negative_number_raised_to_a_power_keeps_its_sign_rule(tmp_path: Path) -> None:
    """`square(-2.0)`, `(-2.0) ** 2` and `rsqrt(square(-0.5))` are 4, 4 and 2: the kernel forms them in
    Python, where `-2.0 ** 2` unparenthesised is -4.0 (the kernel gave -4 x)."""
    body = """dim R, K
input x: bf16[R, K]
output y: f32[R, K]
y = x * square(-2.0) + x * (-2.0) ** 2 + x * rsqrt(square(-0.5))
check R=3 K=128
"""
    kernel = _build(tmp_path, "neg_base", body)
    x = torch.randn(3, 128, generator=_gen(4)).bfloat16()
    _close(kernel.neg_base(x), 10 * x.float(), 1e-6)
