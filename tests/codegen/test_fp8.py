"""fp8 end to end: the interpreter's fp8 rounding against the OCP definition written out here, the fp8 FFN
kernels (e5m2 weights) against independent torch formulas (the per-token e5m2 quantisation bit for bit),
e4m3 weights and outputs refused on trn1 and trn2 (a NeuronCore-v4 type) with a diagnostic, e5m2 built and
run on trn1, and bad scale arguments refused at the door."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import fusegen.sim as sim
from fusegen.cli import main
from fusegen.sim import load_module

with sim.installed():
    import nki
    import nki.isa as nisa
    import nki.language as nl

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "generated"
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
#: (mantissa bits, smallest normal exponent) of the OCP formats
FORMATS = {E4M3: (3, -6), E5M2: (2, -14)}


def ocp_round(value: float, dtype: torch.dtype) -> float:
    """Round-to-nearest-even onto the OCP fp8 grid, from the definition: below the smallest normal the
    step is that of the subnormals, else 2**(exponent - mantissa bits). Finite in-range values only."""
    mantissa, min_exp = FORMATS[dtype]
    if value == 0.0:
        return value
    exp = max(math.frexp(abs(value))[1] - 1, min_exp)
    step = 2.0 ** (exp - mantissa)
    return math.copysign(round(abs(value) / step) * step, value)  # round(): ties to even, exact here


def _grid_and_ties(dtype: torch.dtype, top: float) -> torch.Tensor:
    """Every finite code up to `top`, every midpoint (a tie) and the fp32 neighbours of each midpoint."""
    codes = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    grid = codes[codes.isfinite() & (codes >= 0) & (codes <= top)].unique().sort().values
    mids = (grid[:-1] + grid[1:]) / 2
    near = torch.cat([mids.nextafter(torch.tensor(math.inf)), mids.nextafter(torch.tensor(0.0))])
    values = torch.cat([grid, mids, near])
    return torch.cat([values, -values])


@nki.jit
def _store_kernel(x, out_dtype):
    """fp32 [P, F] from HBM, copied on the Vector engine into a tile of `out_dtype`, written back."""
    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=src, src=x)
    dst = nl.ndarray(x.shape, dtype=out_dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=dst, src=src)
    out = nl.ndarray(x.shape, dtype=out_dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=dst)
    return out


@pytest.mark.parametrize(
    ("dtype", "nl_name", "top"), [(E4M3, "float8_e4m3fn", 448.0), (E5M2, "float8_e5m2", 57344.0)]
)
def test_interpreter_rounds_fp8_to_nearest_even(dtype: torch.dtype, nl_name: str, top: float) -> None:
    """An engine's fp32 result stored into an fp8 tile is the OCP format's round-to-nearest-even value: at
    every code, every tie and either side of every tie (the torch cast the references use agrees)."""
    values = _grid_and_ties(dtype, top)
    pad = -values.numel() % 128
    x = torch.cat([values, torch.zeros(pad)]).reshape(128, -1).contiguous()
    got = _store_kernel(x, getattr(nl, nl_name)).float().flatten()[: values.numel()]
    want = torch.tensor([ocp_round(v, dtype) for v in values.tolist()])
    assert torch.equal(got, want), (values[got != want][:5], got[got != want][:5], want[got != want][:5])
    assert torch.equal(values.to(dtype).float(), want)


def test_e4m3_overflow_follows_torch() -> None:
    """Beyond 448 the hardware's behaviour is not documented; the interpreter saturates as torch's cast does
    (docs/performance.md, "fp8 weights"): pinned so a change is noticed."""
    x = torch.full((128, 4), 1000.0)
    assert torch.equal(_store_kernel(x, nl.float8_e4m3fn).float(), torch.full((128, 4), 448.0))


def _quantised(w: torch.Tensor, dtype: torch.dtype = E4M3) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-column fp8 weights and their scales: w ~ w_q * s."""
    top = 448.0 if dtype == E4M3 else 57344.0
    scale = w.abs().amax(dim=0).clamp(min=1e-12) / top
    return (w / scale).to(dtype), scale


def _ffn_inputs(r: int, k: int, i: int, dtype: torch.dtype = E5M2) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(r * 7 + k + i)
    w1, wg = (torch.randn(k, i, generator=gen) / k**0.5 for _ in range(2))
    w2 = torch.randn(i, k, generator=gen) / i**0.5
    (w1t, s1), (wgt, sg), (w2t, s2) = (_quantised(w, dtype) for w in (w1, wg, w2))
    return {
        "x": torch.randn(r, k, generator=gen).bfloat16(),
        "w1t": w1t, "s1": s1, "b1": torch.randn(i, generator=gen),
        "wgt": wgt, "sg": sg, "bg": torch.randn(i, generator=gen),
        "w2t": w2t, "s2": s2, "b2": torch.randn(k, generator=gen),
        "a": torch.randn(r, k, generator=gen),
    }  # fmt: skip


def _swiglu_fp8(d: dict[str, torch.Tensor], biases: bool = True) -> torch.Tensor:
    """The dequantised SwiGLU FFN, written out: each fp8 product scaled per output channel."""
    x = d["x"].float()
    up = (x @ d["w1t"].float()) * d["s1"] + (d["b1"] if biases else 0)
    gate = (x @ d["wgt"].float()) * d["sg"] + (d["bg"] if biases else 0)
    h = (F.silu(up) * gate).bfloat16().float()
    return (h @ d["w2t"].float()) * d["s2"] + (d["b2"] if biases else d["a"])


def _close(got: torch.Tensor, want: torch.Tensor, rtol: float) -> None:
    err = (got.float() - want.float()).abs().max().item()
    bound = 1e-5 + rtol * want.float().abs().max().item()
    assert err <= bound, f"max error {err:.3e} > {bound:.3e}"


@pytest.mark.parametrize(("r", "k", "i", "lnc"), [(130, 384, 300, 2), (5, 256, 200, 1)])
def test_swiglu_fp8_matches_dequantised_formula(r: int, k: int, i: int, lnc: int) -> None:
    d = _ffn_inputs(r, k, i)
    module = load_module(GENERATED / "swiglu_fp8" / "kernel.py", target="trn2")
    names = ("x", "w1t", "s1", "b1", "wgt", "sg", "bg", "w2t", "s2", "b2")
    out = module.swiglu_fp8(*(d[n] for n in names), lnc=lnc, target="trn2")
    assert out.dtype == torch.bfloat16
    _close(out, _swiglu_fp8(d), rtol=2e-2)


@pytest.mark.parametrize(("r", "k", "i", "lnc"), [(130, 384, 300, 2), (7, 768, 200, 1)])
def test_per_token_quantisation_is_bit_exact(r: int, k: int, i: int, lnc: int) -> None:
    """x_new against the formula; then amax, s = max(amax, 1e-12) * fp32(1/57344) and q = e5m2(x_new * (1/s))
    (division is a multiplication by the fp32 reciprocal on the hardware) from the kernel's own x_new,
    compared bit for bit: the quantisation rounds exactly as documented."""
    d = _ffn_inputs(r, k, i)
    module = load_module(GENERATED / "swiglu_fp8_quant" / "kernel.py", target="trn2")
    names = ("x", "w1t", "s1", "wgt", "sg", "w2t", "s2", "a")
    x_new, q, s, amax = module.swiglu_fp8_quant(*(d[n] for n in names), lnc=lnc, target="trn2")
    assert (q.dtype, s.shape, amax.shape) == (E5M2, (r, 1), (r, 1))
    _close(x_new, _swiglu_fp8(d, biases=False), rtol=1e-3)
    want_amax = x_new.abs().amax(dim=1, keepdim=True)
    want_s = torch.maximum(want_amax, torch.tensor(1e-12)) * torch.tensor(1.0 / 57344.0)
    want_q = (x_new * (1.0 / want_s)).to(E5M2)
    assert torch.equal(amax, want_amax)
    assert torch.equal(s, want_s)
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert q.float().abs().max().item() == 57344.0  # each row's largest element lands on the top code
    _close(q.float() * s, x_new, rtol=2**-3)  # and q * s is x_new to within half an e5m2 step


def _build(spec: Path, out: Path, target: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["build", str(spec), "--out", str(out), "--target", target])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_e4m3_weights_are_refused_at_the_build(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    """The Tensor engine takes float8_e4m3fn from NeuronCore-v4 only (ISA nc_matmul): e4m3 weights name
    their line and the way out on both build targets, and nothing is written."""
    text = (ROOT / "examples" / "swiglu_fp8.spec").read_text().replace("fp8_e5m2[", "fp8_e4m3[")
    spec = tmp_path / "swiglu_fp8.spec"
    spec.write_text(text)
    code, err = _build(spec, tmp_path / "out", target, capsys)
    assert code == 2
    assert f"swiglu_fp8.spec:12:1: error: fp8_e4m3 matmul operand is not available on {target}" in err
    assert "use fp8_e5m2 (the OCP float8_e4m3fn is a NeuronCore-v4 (trn3) type" in err
    assert not (tmp_path / "out" / "swiglu_fp8").exists()


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_an_e4m3_output_is_refused_at_the_build(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    """The graph compiler rejects any F8E4M3FN operand on trn1 and trn2 (error code EVRF051), which an NKI
    kernel's output is: the quantising FFN with an e4m3 q names its line and the way out."""
    text = (ROOT / "examples" / "swiglu_fp8_quant.spec").read_text()
    spec = tmp_path / "swiglu_fp8_quant.spec"
    spec.write_text(text.replace("output q:     fp8_e5m2[", "output q:     fp8_e4m3["))
    code, err = _build(spec, tmp_path / "out", target, capsys)
    assert code == 2
    assert f"swiglu_fp8_quant.spec:21:1: error: fp8_e4m3 is not available on {target}" in err
    assert "use fp8_e5m2 (the OCP float8_e4m3fn is a NeuronCore-v4 (trn3) type" in err
    assert not (tmp_path / "out" / "swiglu_fp8_quant").exists()


def test_e5m2_weights_build_and_run_on_trn1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """fp8_e5m2 is a NeuronCore-v2 data type: the example FFN with its e5m2 weights builds for trn1 and
    matches the formula at a ragged shape (LNC 1: trn1 has no logical cores)."""
    text = (ROOT / "examples" / "swiglu_fp8.spec").read_text()
    assert text.count("fp8_e5m2[") == 3
    spec = tmp_path / "swiglu_e5m2.spec"
    spec.write_text(text.replace("kernel swiglu_fp8", "kernel swiglu_e5m2"))
    code, err = _build(spec, tmp_path / "out", "trn1", capsys)
    assert code == 0, err
    module = load_module(tmp_path / "out" / "swiglu_e5m2" / "kernel.py", target="trn1")
    d = _ffn_inputs(130, 256, 200, E5M2)
    names = ("x", "w1t", "s1", "b1", "wgt", "sg", "bg", "w2t", "s2", "b2")
    out = module.swiglu_e5m2(*(d[n] for n in names), target="trn1")
    _close(out, _swiglu_fp8(d), rtol=2e-2)


@pytest.mark.parametrize(
    ("index", "value", "error", "message"),
    [
        (2, torch.ones(129), ValueError, "s1"),  # a scale per output channel: [I], not [I + 1]
        (2, torch.ones(128, 1), ValueError, "s1"),  # per-channel, not per-block / 2-D
        (2, torch.ones(128, dtype=torch.bfloat16), TypeError, "s1: expected dtype torch.float32"),
        (8, torch.ones(128, dtype=torch.float16), TypeError, "s2: expected dtype torch.float32"),
        (1, torch.ones(128, 128, dtype=torch.bfloat16), TypeError, "w1t: expected dtype torch.float8_e5m2"),
        (7, torch.ones(128, 128, dtype=E4M3), TypeError, "w2t: expected dtype torch.float8_e5m2"),
    ],
)
def test_bad_scales_and_weights_at_the_door(
    index: int, value: torch.Tensor, error: type, message: str
) -> None:
    module = load_module(GENERATED / "swiglu_fp8" / "kernel.py", target="trn2")
    d = _ffn_inputs(3, 128, 128)
    args = [d[n] for n in ("x", "w1t", "s1", "b1", "wgt", "sg", "bg", "w2t", "s2", "b2")]
    args[index] = value
    with pytest.raises(error, match=message):
        module.swiglu_fp8(*args)


def test_planner_models_the_halved_weight_stream() -> None:
    """Llama-3-8B widths at decode batch (R=64, trn2 LNC 2): the fp8 kernel's own planner streams about
    half the bf16 kernel's HBM bytes and models less time (its rows are 4 KiB, past the DMA packet knee)."""
    fp8 = load_module(GENERATED / "swiglu_fp8" / "kernel.py", target="trn2")
    bf16 = load_module(GENERATED / "swiglu_ffn" / "kernel.py", target="trn2")
    costs = []
    for module in (fp8, bf16):
        mach = module._MACHINES["trn2"]
        plan = module._choose(module._MODEL, mach, 64, 4096, 14336, 2)
        costs.append(module._cost(module._MODEL, mach, 64, 4096, 14336, 2, plan))
    assert costs[0].hbm_bytes < 0.55 * costs[1].hbm_bytes
    assert costs[0].total < 0.75 * costs[1].total


@pytest.mark.parametrize("given", [torch.bfloat16, torch.float32, E4M3])
def test_the_op_takes_fp8_weights_as_declared_and_refuses_to_narrow_others(given: torch.dtype) -> None:
    """The op casts to a bf16 input's dtype, but an fp8 input is a weight quantised with its scales: a bf16
    weight was cast to e5m2 silently (|w| > 57344 overflowed, |w| < 2**-17 flushed to 0) and the op ran
    on it."""
    from fusegen.codegen.files.ops import load_ops

    load_ops("swiglu_fp8", GENERATED)
    d = _ffn_inputs(3, 128, 128)
    args = [d[n] for n in ("x", "w1t", "s1", "b1", "wgt", "sg", "bg", "w2t", "s2", "b2")]
    widened = [args[0].float(), *args[1:]]  # a wider x is cast to its bf16, exactly
    _close(torch.ops.fusegen.swiglu_fp8(*widened), _swiglu_fp8(d), rtol=2e-2)
    args[1] = args[1].to(given)
    with pytest.raises(TypeError, match=f"w1t: expected dtype torch.float8_e5m2 .*, got {given}"):
        torch.ops.fusegen.swiglu_fp8(*args)
