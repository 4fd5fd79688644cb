"""Generated FFN kernels at wide K (8192, 16384) on the interpreter against independent torch formulas:
the epilogue's and prologue's row statistics over many K-blocks, and streamed up-projection weights."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fusegen import testing
from fusegen.cli import main
from fusegen.sim import load_module

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "generated"


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


def _swiglu_inputs(gen: torch.Generator, r: int, k: int, i: int) -> tuple[torch.Tensor, ...]:
    """x, w1t, b1, wgt, bg, w2t, b2: a gated FFN's inputs at unit scale."""
    x = _randn(gen, r, k).bfloat16()
    w1t, wgt = (_randn(gen, k, i, scale=k**-0.5).bfloat16() for _ in range(2))
    b1, bg = _randn(gen, i), _randn(gen, i)
    return x, w1t, b1, wgt, bg, _randn(gen, i, k, scale=i**-0.5).bfloat16(), _randn(gen, k)


def _swiglu(x, w1t, b1, wgt, bg, w2t, b2):  # type: ignore[no-untyped-def]
    """bf16(silu(x W1 + b1) * (x Wg + bg)) W2 + b2 in fp32."""
    h = F.silu(x.float() @ w1t.float() + b1) * (x.float() @ wgt.float() + bg)
    return h.bfloat16().float() @ w2t.float() + b2


def test_column_blocks_where_the_sbuf_accumulator_cannot_fit() -> None:
    """trn1 at K=16384: an [S, K] fp32 accumulator does not fit, so the planner itself picks column blocks
    (h^T through HBM, each block of the down-projection accumulating all of I in PSUM); LayerScale's
    `a + ls * y` is computed on the way out of PSUM, the LayerNorm's statistics after it."""
    r, k, i = 130, 16384, 128
    gen = torch.Generator().manual_seed(16)
    ffn = _swiglu_inputs(gen, r, k, i)
    ls, a = _randn(gen, k), _randn(gen, r, k) + 2.0
    module = load_module(GENERATED / "swiglu_layerscale" / "kernel.py", target="trn1")
    plan = module._choose(module._MODEL, module._MACHINES["trn1"], r, k, i, 1)
    assert plan.kc > 0 and plan.s >= 256  # both row tiles in one super-block: several PSUM banks per block
    z = module.swiglu_layerscale(*ffn, ls, a, lnc=1, target="trn1")
    want = F.layer_norm(a + ls * _swiglu(*ffn), (k,), eps=1e-6)
    _close(z, want.bfloat16(), rtol=1e-2)


@pytest.mark.parametrize("ht", [0, 1], ids=["h-scratch", "h-held"])
@pytest.mark.parametrize("spec", ["swiglu_rmsnorm", "prenorm_swiglu", "relu2_mlp"])
def test_column_blocks_with_ragged_blocks_tiles_and_rows(spec: str, ht: int) -> None:
    """An explicit column-blocked plan, KC=1024 over K=1536 (a full and a half block), I=300 (a ragged
    I-tile), 200 rows on 2 cores (a ragged row tile), h^T through the HBM scratch or held in SBUF (HT):
    three ways out of PSUM (the spine `+ b2 + a` ending at an output, a residual `+ x`, a bare cast that
    writes the output directly); the interpreter's peak SBUF stays within the budget model of that plan."""
    r, k, i, s, kc = 200, 1536, 300, 256, 1024
    gen = torch.Generator().manual_seed(kc + i)
    x, w1t, b1, wgt, bg, w2t, b2 = _swiglu_inputs(gen, r, k, i)
    module = load_module(GENERATED / spec / "kernel.py", target="trn2")
    cols, up = module._columns, (lambda w: module._up_layout(w, (0,), i))
    plan = (module._down_blocks(w2t, kc, i), s, 128, 0, kc, 0, ht)
    if spec == "swiglu_rmsnorm":
        a, gamma = _randn(gen, r, k), _randn(gen, k)
        kernel = module.swiglu_rmsnorm_kernel
        x_new, z = kernel[2](x, up(w1t), cols(b1, bg), up(wgt), w2t, b2, a, gamma, 1e-6, *plan)
        want = _swiglu(x, w1t, b1, wgt, bg, w2t, b2) + a
        _close(x_new, want, rtol=1e-3)
        _close(z, (want * want.pow(2).mean(dim=1, keepdim=True).add(1e-6).rsqrt() * gamma).bfloat16(), 2e-2)
    elif spec == "prenorm_swiglu":
        gamma = _randn(gen, k)
        kernel = module.prenorm_swiglu_kernel
        out = kernel[2](x, gamma, up(wgt), up(w1t), w2t, 1e-6, *plan)
        xf = x.float()
        xn = (xf * xf.pow(2).mean(dim=1, keepdim=True).add(1e-6).rsqrt() * gamma).bfloat16().float()
        h = F.silu(xn @ wgt.float()) * (xn @ w1t.float())
        _close(out, (h.bfloat16().float() @ w2t.float() + xf).bfloat16(), rtol=2e-2)
    else:
        kernel = module.relu2_mlp_kernel
        out = kernel[2](x, up(w1t), w2t, *plan)
        h = torch.relu(x.float() @ w1t.float()).square()
        _close(out, (h.bfloat16().float() @ w2t.float()).bfloat16(), rtol=2e-2)
    model_bytes = module._sbuf_bytes(module._MODEL, s, 128, k, i, kc, 0, 0, ht)
    assert max(core["sbuf_peak_bytes"] for core in kernel.last_run.stats["cores"]) <= model_bytes


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_past_the_limit_check_explain_and_host_give_the_planners_numbers(
    target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """K=131072: x^T alone (K * 2 bytes per partition at 128 rows) passes the SBUF budget, so nothing fits;
    every door says so with the numbers and the widest K that fits, no traceback."""
    spec, shape = str(ROOT / "examples" / "swiglu_rmsnorm.spec"), ["R=3", "K=131072", "I=128"]
    budget = {"trn1": 180224, "trn2": 212984}[target] - 8192  # the headroom every plan keeps free
    numbers = (rf"needs \d+ B/partition of SBUF for K=131072, I=128; the budget is {budget} B "
               r"with 8192 B kept free")
    for command in ("check", "explain"):
        assert main([command, spec, "--shape", *shape, "--target", target, "--lnc", "1"]) == 2
        err = capsys.readouterr().err
        assert re.search(rf"error: --shape I=128 K=131072 R=3: no tile plan fits on {target}: .*{numbers} "
                         r"\(this kernel fits K <= \d+ at I=128 here\)", err), err  # fmt: skip
        assert "Traceback" not in err and "fusegen bug" not in err
    gen = torch.Generator().manual_seed(0)
    r, k, i = 3, 131072, 128
    args = (*_swiglu_inputs(gen, r, k, i), _randn(gen, r, k), _randn(gen, k))
    module = load_module(GENERATED / "swiglu_rmsnorm" / "kernel.py", target=target)
    with pytest.raises(ValueError, match=rf"no tile plan fits: the smallest \(S=128, CI=128\) {numbers}"):
        module.swiglu_rmsnorm(*args, lnc=1, target=target)


def _layer_norm(v: torch.Tensor, eps: float) -> torch.Tensor:
    """(v - mean) / sqrt(var + eps) over the last axis, the biased variance."""
    centred = v - v.mean(dim=1, keepdim=True)
    return centred / centred.pow(2).mean(dim=1, keepdim=True).add(eps).sqrt()


def _rms_norm(v: torch.Tensor, eps: float) -> torch.Tensor:
    """v / sqrt(mean(v^2) + eps) over the last axis."""
    return v / v.pow(2).mean(dim=1, keepdim=True).add(eps).sqrt()


def _ffn_ln(x, w1t, b1, wgt, bg, w2t, b2, a):  # type: ignore[no-untyped-def]
    """x_new = swiglu + b2 + a; z = bf16(layernorm(x_new)), no affine."""
    x_new = _swiglu(x, w1t, b1, wgt, bg, w2t, b2) + a
    return x_new, _layer_norm(x_new, 1e-6).bfloat16()


def _layernorm_affine(x, w1t, b1, wgt, bg, w2t, b2, a, gamma, beta):  # type: ignore[no-untyped-def]
    """x_new = swiglu + b2 + a; z = bf16(layernorm(x_new) * gamma + beta), eps 1e-5."""
    x_new = _swiglu(x, w1t, b1, wgt, bg, w2t, b2) + a
    return x_new, (_layer_norm(x_new, 1e-5) * gamma + beta).bfloat16()


def _rmsnorm(x, w1t, b1, wgt, bg, w2t, b2, a, gamma):  # type: ignore[no-untyped-def]
    """x_new = swiglu + b2 + a; z = bf16(rmsnorm(x_new) * gamma)."""
    x_new = _swiglu(x, w1t, b1, wgt, bg, w2t, b2) + a
    return x_new, (_rms_norm(x_new, 1e-6) * gamma).bfloat16()


def _gemma_norm(x, w1t, wgt, w2t, a, gamma):  # type: ignore[no-untyped-def]
    """x_new = bf16(silu(x W1) * (x Wg)) W2 + a; z = bf16(rmsnorm(x_new) * (1 + gamma))."""
    h = F.silu(x.float() @ w1t.float()) * (x.float() @ wgt.float())
    x_new = h.bfloat16().float() @ w2t.float() + a
    return x_new, (_rms_norm(x_new, 1e-6) * (1 + gamma)).bfloat16()


def _fp8_quant(x, w1t, s1, wgt, sg, w2t, s2, a):  # type: ignore[no-untyped-def]
    """fp8 weights scaled per output channel; x_new, its row amax, s = amax / 57344, q = e5m2(x_new / s)."""
    h = F.silu(x.float() @ w1t.float() * s1) * (x.float() @ wgt.float() * sg)
    x_new = h.bfloat16().float() @ w2t.float() * s2 + a
    amax = x_new.abs().amax(dim=1, keepdim=True)
    s = amax.clamp(min=1e-12) / 57344
    return x_new, (x_new / s).to(torch.float8_e5m2), s, amax


def _layerscale(x, w1t, b1, wgt, bg, w2t, b2, ls, a):  # type: ignore[no-untyped-def]
    """z = bf16(layernorm(a + ls * (swiglu + b2))), no x_new."""
    return (_layer_norm(a + ls * _swiglu(x, w1t, b1, wgt, bg, w2t, b2), 1e-6).bfloat16(),)


#: each example with row statistics after the column blocks, and its math written out by hand
STATISTICS = {
    "swiglu_ffn_ln": _ffn_ln,
    "swiglu_layernorm_affine": _layernorm_affine,
    "swiglu_rmsnorm": _rmsnorm,
    "swiglu_gemma_norm": _gemma_norm,
    "swiglu_fp8_quant": _fp8_quant,
    "swiglu_layerscale": _layerscale,  # no x_new: a scratch of its own
}
#: (S, KC, HT, LNC): two row tiles per super-block (the second ragged) under every plan; KC=1024 evicts two
#: pieces per block (n_kp=2, so a piece's row tile and column index cannot swap unseen), KC=512 three blocks
COLUMN_PLANS = [(256, 1024, 0, 2), (256, 512, 1, 1), (256, 512, 0, 1)]
PLAN_IDS = [f"S{s}-KC{kc}-HT{ht}-LNC{n}" for s, kc, ht, n in COLUMN_PLANS]


@pytest.mark.parametrize(("s", "kc", "ht", "lnc"), COLUMN_PLANS, ids=PLAN_IDS)
@pytest.mark.parametrize("spec", list(STATISTICS))
def test_row_statistics_after_column_blocks(
    monkeypatch: pytest.MonkeyPatch, spec: str, s: int, kc: int, ht: int, lnc: int
) -> None:
    """Forced column-blocked plans against the math written out here, within the example's generated test's
    tolerances: the first statistics pass accumulated by the evictions per row tile, the scratch being the
    f32 output where there is one, the eviction loads issued with their block and the last pass's writes a
    block late (docs/performance.md, "Row statistics after column blocks")."""
    dims = {"R": 400, "K": 1280, "I": 300}  # per super-block 256 rows, then 144: a ragged second row tile
    directory = GENERATED / spec
    generated_test = testing.load_generated(directory / f"test_{spec}.py")
    args = testing.make_inputs(generated_test.INPUTS, generated_test.input_shapes(dims))
    names = [name for name, _, _ in generated_test.INPUTS]
    args[names.index("a")] += 2.0  # an offset mean: LayerNorm's centring must be right
    module = load_module(directory / "kernel.py", target="trn2")
    monkeypatch.setattr(module, "_choose", lambda *_: module._Plan(s, 256, 0, kc, 0, ht))
    got = getattr(module, spec)(*args, lnc=lnc, target="trn2")
    report = testing.compare(got, STATISTICS[spec](*args), generated_test.OUTPUTS, spec)
    assert report.ok, report.text()
