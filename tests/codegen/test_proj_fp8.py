"""fp8 weights in the projection family: the QKV kernel with e5m2 weights against an independent dequantised
formula at ragged rows and widths on LNC 1 and 2, e4m3 weights refused on trn1 and trn2 (a Tensor-engine
input from NeuronCore-v4 only), e5m2 built and run on trn1, bad scales and weights refused at the door, and
the halved weight stream in the planner's model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fusegen.cli import main
from fusegen.sim import load_module

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "generated"
SPEC = ROOT / "examples" / "qkv_fp8.spec"
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
NAMES = ("x", "gamma", "wq", "sq", "wk", "sk", "wv", "sv")


def _quantised(w: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-column fp8 weights and their scales: w ~ w_q * s."""
    top = 448.0 if dtype == E4M3 else 57344.0
    scale = w.abs().amax(dim=0).clamp(min=1e-12) / top
    return (w / scale).to(dtype), scale


def _inputs(r: int, k: int, nq: int, nkv: int, dtype: torch.dtype = E5M2) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(r * 5 + k + nq + nkv)
    d = {"x": torch.randn(r, k, generator=gen).bfloat16(), "gamma": 1 + 0.1 * torch.randn(k, generator=gen)}
    for w, s, n in (("wq", "sq", nq), ("wk", "sk", nkv), ("wv", "sv", nkv)):
        d[w], d[s] = _quantised(torch.randn(k, n, generator=gen) / k**0.5, dtype)
    return d


def _qkv(d: dict[str, torch.Tensor], eps: float = 1e-5) -> tuple[torch.Tensor, ...]:
    """RMSNorm with gamma, cast to bf16, then each dequantised projection: (xn @ w_q) * s per column."""
    x = d["x"].float()
    xn = (x * torch.rsqrt(x.square().mean(dim=1, keepdim=True) + eps) * d["gamma"]).bfloat16().float()
    return tuple((xn @ d[w].float()) * d[s] for w, s in (("wq", "sq"), ("wk", "sk"), ("wv", "sv")))


def _close(got: torch.Tensor, want: torch.Tensor, rtol: float) -> None:
    err = (got.float() - want.float()).abs().max().item()
    bound = 1e-5 + rtol * want.float().abs().max().item()
    assert err <= bound, f"max error {err:.3e} > {bound:.3e}"


@pytest.mark.parametrize(("r", "k", "nq", "nkv", "lnc"), [(77, 384, 640, 160, 2), (5, 256, 200, 72, 1)])
def test_qkv_fp8_matches_dequantised_formula(r: int, k: int, nq: int, nkv: int, lnc: int) -> None:
    d = _inputs(r, k, nq, nkv)
    module = load_module(GENERATED / "qkv_fp8" / "kernel.py", target="trn2")
    outs = module.qkv_fp8(*(d[n] for n in NAMES), lnc=lnc, target="trn2")
    for got, want, n in zip(outs, _qkv(d), (nq, nkv, nkv), strict=True):
        assert (got.dtype, got.shape) == (torch.bfloat16, (r, n))
        _close(got, want, rtol=2e-2)


def _build(spec: Path, out: Path, target: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["build", str(spec), "--out", str(out), "--target", target])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_e4m3_weights_are_refused_at_the_build(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    """The Tensor engine takes float8_e4m3fn from NeuronCore-v4 only (ISA nc_matmul)."""
    spec = tmp_path / "qkv_fp8.spec"
    spec.write_text(SPEC.read_text().replace("fp8_e5m2[", "fp8_e4m3["))
    code, err = _build(spec, tmp_path / "out", target, capsys)
    assert code == 2
    assert f"qkv_fp8.spec:14:1: error: fp8_e4m3 matmul operand is not available on {target}" in err
    assert "use fp8_e5m2 (the OCP float8_e4m3fn is a NeuronCore-v4 (trn3) type" in err
    assert not (tmp_path / "out" / "qkv_fp8").exists()


def test_e5m2_weights_build_and_run_on_trn1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """fp8_e5m2 is a NeuronCore-v2 data type: the example projection builds for trn1 and matches the
    formula at ragged rows and widths."""
    text = SPEC.read_text().replace("kernel qkv_fp8", "kernel qkv_e5m2")
    spec = tmp_path / "qkv_e5m2.spec"
    spec.write_text(text)
    code, err = _build(spec, tmp_path / "out", "trn1", capsys)
    assert code == 0, err
    module = load_module(tmp_path / "out" / "qkv_e5m2" / "kernel.py", target="trn1")
    d = _inputs(130, 256, 300, 96, E5M2)
    outs = module.qkv_e5m2(*(d[n] for n in NAMES), target="trn1")
    for got, want in zip(outs, _qkv(d), strict=True):
        _close(got, want, rtol=2e-2)


def test_mixed_fp8_and_f32_is_refused_at_the_matmul(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """fp8 weights go beside a 16-bit operand only (the PE's mixed mode): an f32 operand is a dtype clash
    at each matmul, with the way out."""
    text = SPEC.read_text().replace("bf16(rmsnorm(x, eps, gamma))", "rmsnorm(f32(x), eps, gamma)")
    spec = tmp_path / "qkv_f32.spec"
    spec.write_text(text.replace("kernel qkv_fp8", "kernel qkv_f32"))
    code, err = _build(spec, tmp_path, "trn2", capsys)
    assert code == 2
    assert "qkv_f32.spec:28:6: error: dtype clash: `@` operands are f32 and fp8_e5m2" in err
    assert "hint: cast one side so both are the same" in err


@pytest.mark.parametrize(
    ("index", "value", "error", "message"),
    [
        (3, torch.ones(129), ValueError, "sq"),  # a scale per output channel: [NQ], not [NQ + 1]
        (3, torch.ones(128, 1), ValueError, "sq"),  # per-channel, not 2-D
        (5, torch.ones(128, dtype=torch.bfloat16), TypeError, "sk: expected dtype torch.float32"),
        (2, torch.ones(128, 128, dtype=torch.bfloat16), TypeError, "wq: expected dtype torch.float8_e5m2"),
        (6, torch.ones(128, 128, dtype=E4M3), TypeError, "wv: expected dtype torch.float8_e5m2"),
    ],
)
def test_bad_scales_and_weights_at_the_door(
    index: int, value: torch.Tensor, error: type, message: str
) -> None:
    module = load_module(GENERATED / "qkv_fp8" / "kernel.py", target="trn2")
    d = _inputs(3, 128, 128, 128)
    args = [d[n] for n in NAMES]
    args[index] = value
    with pytest.raises(error, match=message):
        module.qkv_fp8(*args)


def test_planner_models_the_halved_weight_stream() -> None:
    """Llama-3-8B QKV widths at decode batch (R=64, trn2 LNC 2, columns split: 3072 per core): the fp8
    kernel's planner streams one byte less per weight element than the bf16 kernel's, and 512 B more per
    column for the scales broadcast over the partitions; nothing else differs. (Its modelled time does not
    drop: at NB=1024 both kernels' weight rows are below the DMA packet knee, docs/performance.md.)"""
    fp8 = load_module(GENERATED / "qkv_fp8" / "kernel.py", target="trn2")
    bf16 = load_module(GENERATED / "rmsnorm_qkv" / "kernel.py", target="trn2")
    costs = []
    for module in (fp8, bf16):
        mach = module._MACHINES["trn2"]
        widths = (4096, 1024, 1024)
        plan = module._choose(module._MODEL, mach, 64, 4096, widths, 2)
        costs.append(module._cost(module._MODEL, mach, 64, 4096, widths, 2, plan))
    cols = 4096 // 2 + 1024 // 2 + 1024 // 2
    assert costs[1].hbm_bytes - costs[0].hbm_bytes == 4096 * cols - 128 * cols * 4
    assert costs[0].hbm_bytes < 0.65 * costs[1].hbm_bytes


def test_per_token_quantisation_of_a_projection_names_the_amax(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A per-token amax over N needs whole rows, which the projection never holds (it streams column
    blocks): the build fails at the amax line, saying why and where per-token quantisation is fused."""
    spec = tmp_path / "proj_quant.spec"
    spec.write_text(
        "kernel proj_quant\ndim R, K, N\nrequire K % 128 == 0\ninput x: bf16[R, K]\n"
        "input w: fp8_e5m2[K, N]\ninput sw: f32[N]\noutput y: f32[R, N]\noutput q: fp8_e4m3[R, N]\n"
        "output s: f32[R, 1]\ny = (x @ w) * sw\namax = max(abs(y), 1, keepdim=true)\ns = amax / 448.0\n"
        "q = y / s\ncheck R=64 K=256 N=512\n"
    )
    code, err = _build(spec, tmp_path / "out", "trn2", capsys)
    assert code == 2
    assert "proj_quant.spec:11:8: note: leaves the proj family here: a row statistic" in err
    assert "per-token amax / scale [R, 1]" in err and "examples/swiglu_fp8_quant.spec" in err
