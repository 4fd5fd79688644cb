"""Generated projection kernels (the proj family) on the interpreter against independent hand-written torch
formulas: bf16 inputs, ragged rows and widths, wide K, views and slices as inputs, both targets."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fusegen.cli import main
from fusegen.sim import load_module

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "generated"
LAUNCHES = [("trn2", 2), ("trn2", 1), ("trn1", 1)]


def _randn(gen: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) * scale


def _close(got: torch.Tensor, want: torch.Tensor, rtol: float) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    err = (got.float() - want.float()).abs().max().item()
    bound = 1e-5 + rtol * want.float().abs().max().item()
    assert err <= bound, f"max error {err:.3e} > {bound:.3e}"


def _rmsnorm_bf16(x: torch.Tensor, gamma: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * gamma in fp32, rounded to bf16 (the projected operand)."""
    xf = x.float()
    return (xf / xf.pow(2).mean(dim=1, keepdim=True).add(eps).sqrt() * gamma).bfloat16()


@pytest.mark.parametrize(("r", "k", "nq", "nkv"), [(1, 256, 512, 128), (130, 384, 640, 160)])
@pytest.mark.parametrize(("target", "lnc"), LAUNCHES)
def test_rmsnorm_qkv_matches_formula(r: int, k: int, nq: int, nkv: int, target: str, lnc: int) -> None:
    """q, k, v of one RMSNorm'd x; x a row-strided view and the weights column slices of one packed
    tensor (views: the door makes them dense, the kernel never sees the strides)."""
    gen = torch.Generator().manual_seed(r + k + nq)
    x = _randn(gen, 2 * r, k).bfloat16()[::2]  # every other row: a strided view
    gamma = _randn(gen, k)
    packed = _randn(gen, k, nq + 2 * nkv, scale=k**-0.5).bfloat16()
    wq, wk, wv = packed[:, :nq], packed[:, nq : nq + nkv], packed[:, nq + nkv :]
    module = load_module(GENERATED / "rmsnorm_qkv" / "kernel.py", target=target)
    q, kk, v = module.rmsnorm_qkv(x, gamma, wq, wk, wv, eps=1e-5, lnc=lnc, target=target)
    xn = _rmsnorm_bf16(x, gamma, 1e-5).float()
    for got, w in ((q, wq), (kk, wk), (v, wv)):
        _close(got, (xn @ w.float()).bfloat16(), rtol=1e-2)


@pytest.mark.parametrize(("r", "h", "k"), [(3, 4096, 256), (200, 384, 640)])
@pytest.mark.parametrize(("target", "lnc"), LAUNCHES)
def test_out_proj_residual_matches_formula(r: int, h: int, k: int, target: str, lnc: int) -> None:
    """bf16(attn @ wo + resid): wide K (32 K-tiles accumulated in PSUM) and ragged rows/width; wo given
    as the transpose of an [K, H] weight (nn.Linear's layout), a view."""
    gen = torch.Generator().manual_seed(r * h + k)
    attn, resid = _randn(gen, r, h).bfloat16(), _randn(gen, r, k).bfloat16()
    wo = _randn(gen, k, h, scale=h**-0.5).bfloat16().t()
    module = load_module(GENERATED / "out_proj_residual" / "kernel.py", target=target)
    out = module.out_proj_residual(attn, wo, resid, lnc=lnc, target=target)
    _close(out, (attn.float() @ wo.float() + resid.float()).bfloat16(), rtol=1e-2)


@pytest.mark.parametrize(("r", "k", "n"), [(33, 256, 700), (129, 128, 1100)])
@pytest.mark.parametrize(("target", "lnc"), LAUNCHES)
def test_linear_gelu_bias_matches_formula(r: int, k: int, n: int, target: str, lnc: int) -> None:
    """bf16(gelu(x @ w + b)) with the exact (erf) GELU; a bias that is a slice of a longer vector."""
    gen = torch.Generator().manual_seed(r + n)
    x = _randn(gen, r, k).bfloat16()
    w = _randn(gen, k, n, scale=k**-0.5).bfloat16()
    b = _randn(gen, n + 7)[3 : n + 3]
    module = load_module(GENERATED / "linear_gelu_bias" / "kernel.py", target=target)
    y = module.linear_gelu_bias(x, w, b, lnc=lnc, target=target)
    _close(y, F.gelu(x.float() @ w.float() + b).bfloat16(), rtol=1e-2)


def test_explicit_plans_agree_and_stay_within_the_budget_model() -> None:
    """Every plan shape the kernel takes (held or streamed weights, NB of one or two PSUM banks, rows or
    columns over the cores, two or three row tiles' accumulators live at once) gives the same answer, and
    the interpreter's peak SBUF stays within the budget model of that plan."""
    r, k, n = 200, 384, 1100
    gen = torch.Generator().manual_seed(5)
    x, w, b = _randn(gen, r, k).bfloat16(), _randn(gen, k, n, scale=k**-0.5).bfloat16(), _randn(gen, n)
    module = load_module(GENERATED / "linear_gelu_bias" / "kernel.py", target="trn2")
    want = F.gelu(x.float() @ w.float() + b).bfloat16()
    plans = [(256, 1024, 0, 0), (128, 512, 1, 1), (128, 1024, 0, 1), (384, 512, 1, 0), (256, 512, 0, 1)]
    for s, nb, split, stream in [*plans, (384, 512, 1, 1)]:
        y = module.linear_gelu_bias_kernel[2](x, w, b, s, nb, split, stream)
        _close(y, want, rtol=1e-2)
        model = module._sbuf_bytes(module._MODEL, module._Plan(s, nb, split, stream), k)
        peak = max(core["sbuf_peak_bytes"] for core in module.linear_gelu_bias_kernel.last_run.stats["cores"])
        assert peak <= model, (s, nb, split, stream, peak, model)


def _build(tmp_path: Path, text: str) -> Path:
    spec = tmp_path / "spec.spec"
    spec.write_text(text, encoding="utf-8")
    assert main(["build", str(spec), "--out", str(tmp_path / "out")]) == 0
    return tmp_path / "out"


PACKED = """kernel packed_qkv_ln
dim R, K, NQ, NKV
require K % 128 == 0
input x: bf16[R, K]
input gamma: f32[K]
input beta: f32[K]
input wqkv: bf16[K, NQ + 2 * NKV]
input bq: f32[NQ]
input scale: f32[R, 1]
param eps = 1e-5
output q: bf16[R, NQ]
output q32: f32[R, NQ]
output k: bf16[R, NKV]
output v: bf16[R, NKV]
xn = bf16(layernorm(x, eps, gamma, beta) * 0.5)
qkv = xn @ wqkv
q32 = (qkv[:, 0:NQ] + bq) * scale
q = bf16(q32)
k = bf16(silu(qkv[:, NQ:NQ + NKV]))
v = bf16(qkv[:, NQ + NKV:NQ + 2 * NKV])
check R=5 K=256 NQ=256 NKV=128
"""


def test_packed_weight_layernorm_prologue_and_row_scale(tmp_path: Path) -> None:
    """One packed [K, NQ + 2 NKV] weight sliced after the matmul (the rewrite moves the slices onto the
    weight: three projections of its columns), a LayerNorm-with-affine-and-scaling prologue, an epilogue
    with an [N] bias, an [R, 1] row scale, an activation and two outputs of one projection."""
    out = _build(tmp_path, PACKED)
    r, k, nq, nkv = 70, 256, 384, 160
    gen = torch.Generator().manual_seed(11)
    x, gamma, beta = _randn(gen, r, k).bfloat16() + 2.0, _randn(gen, k), _randn(gen, k)
    wqkv = _randn(gen, k, nq + 2 * nkv, scale=k**-0.5).bfloat16()
    bq, scale = _randn(gen, nq), _randn(gen, r, 1)
    module = load_module(out / "packed_qkv_ln" / "kernel.py", target="trn2")
    q, q32, kk, v = module.packed_qkv_ln(x, gamma, beta, wqkv, bq, scale, lnc=2, target="trn2")
    xn = (F.layer_norm(x.float(), (k,), gamma, beta, eps=1e-5) * 0.5).bfloat16().float()
    h = xn @ wqkv.float()
    want32 = (h[:, :nq] + bq) * scale
    _close(q32, want32, rtol=1e-3)
    _close(q, want32.bfloat16(), rtol=1e-2)
    _close(kk, F.silu(h[:, nq : nq + nkv]).bfloat16(), rtol=1e-2)
    _close(v, h[:, nq + nkv :].bfloat16(), rtol=1e-2)


def test_a_vocabulary_wide_projection_streams_every_column(tmp_path: Path) -> None:
    """An LM head at Llama-3's vocabulary width (128,256 columns): N streams in blocks, no buffer grows
    with it; few rows on two cores split the columns, so each core reads half the weight."""
    out = _build(tmp_path, LM_HEAD)
    r, k, n = 2, 128, 128256
    gen = torch.Generator().manual_seed(3)
    x, gamma = _randn(gen, r, k).bfloat16(), _randn(gen, k)
    w = _randn(gen, k, n, scale=k**-0.5).bfloat16()
    module = load_module(out / "lm_head" / "kernel.py", target="trn2")
    plan = module._choose(module._MODEL, module._MACHINES["trn2"], r, k, (n,), 2)
    assert plan.split == 1
    logits = module.lm_head(x, gamma, w, lnc=2, target="trn2")
    _close(logits, _rmsnorm_bf16(x, gamma, 1e-5).float() @ w.float(), rtol=1e-3)


LM_HEAD = """kernel lm_head
dim R, K, V
require K % 128 == 0
input x: bf16[R, K]
input gamma: f32[K]
input w: bf16[K, V]
output logits: f32[R, V]
logits = bf16(rmsnorm(x, 1e-5, gamma)) @ w
check R=2 K=128 V=1000
"""


@pytest.mark.parametrize(
    ("body", "line", "message"),
    [
        ("y = rmsnorm(x @ w, 1e-6)", "y = rmsnorm", "a row statistic of a projection's output"),
        ("y = bf16(x @ w) @ w2", "y = bf16(x @ w) @ w2", "every matmul must multiply the same operand"),
    ],
)
def test_a_spec_the_family_cannot_take_gets_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, line: str, message: str
) -> None:
    """The error names the proj family's reason at the user's line, and no traceback."""
    spec = tmp_path / "bad.spec"
    spec.write_text(
        "kernel bad\ndim R, K, N\ninput x: bf16[R, K]\ninput w: bf16[K, N]\ninput w2: bf16[N, N]\n"
        f"output y: f32[R, N]\n{body}\ncheck R=4 K=128 N=128\n",
        encoding="utf-8",
    )
    assert main(["build", str(spec), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "leaves the proj family here" in err and message in err and line in err, err
    assert "Traceback" not in err
