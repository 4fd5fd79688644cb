"""The generated Engram gate on the interpreter: an independent copy of the seed's gate_naive, TileKernels'
calc_diff bar, save on/off, s == 0, the fused weight bit for bit, family selection and HBM bytes per token.
"""

from __future__ import annotations

import functools
from pathlib import Path
from types import ModuleType

import pytest
import torch

from fusegen.codegen.build import FAMILIES, BuildOptions, build_spec
from fusegen.codegen.family import Mismatch
from fusegen.codegen.ffn.family import FFN
from fusegen.codegen.rewrites import rewrite
from fusegen.codegen.rowreduce.family import ROWREDUCE
from fusegen.codegen.rowreduce.rowplan import token_bytes
from fusegen.dsl import SpecError, load_spec
from fusegen.sim import load_module

REPO = Path(__file__).parents[2]
EPS, CLAMP = 1e-20, 1e-6
#: TileKernels' forward bar (kernels.md §1.8): calc_diff < 2e-10 for every output against the reference.
CALC_DIFF_BAR = 2e-10


@functools.cache
def kernel(name: str = "engram_gate") -> ModuleType:
    """The committed generated kernel module, bound to the interpreter."""
    return load_module(REPO / "generated" / name / "kernel.py")


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """TileKernels' metric: 1 - 2 sum(xy) / sum(x^2 + y^2), in float64."""
    x, y = x.double(), y.double()
    denominator = (x * x + y * y).sum()
    return float(1 - 2 * (x * y).sum() / denominator) if denominator else 0.0


def gate_naive(x, kv, w_h, w_e, residual: bool = True):  # type: ignore[no-untyped-def]
    """Two explicit RMSNorms, then their dot (the seed's unfused reading), float64; plus the saved tensors."""
    heads = x.shape[1]
    x, k, v = x.double(), kv[:, :heads].double(), kv[:, heads].double()
    rstd_x = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
    rstd_k = torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + EPS)
    normed_x = x * rstd_x * w_h.double()
    normed_k = k * rstd_k * w_e.double()
    s = (normed_x * normed_k).sum(-1) * x.shape[-1] ** -0.5
    gate = (s.abs().clamp_min(CLAMP).sqrt() * s.sign()).sigmoid()
    raw = (x * w_h.double() * w_e.double() * k).sum(-1)
    out = gate.unsqueeze(-1) * v.unsqueeze(1) + (x if residual else 0)
    return out.bfloat16(), raw, gate, rstd_x.squeeze(-1), rstd_k.squeeze(-1)


def inputs(tokens: int, heads: int, width: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """torch.randn bf16 inputs, as TileKernels' tests draw them."""
    gen = torch.Generator().manual_seed(seed)
    shapes = ((tokens, heads, width), (tokens, heads + 1, width), (heads, width), (heads, width))
    return tuple(torch.randn(s, generator=gen).bfloat16() for s in shapes)


@pytest.mark.parametrize(
    ("tokens", "heads", "width", "lnc"), [(300, 4, 512, 2), (129, 2, 256, 1), (256, 4, 7168, 2)]
)
def test_matches_gate_naive_within_tilekernels_bar(tokens: int, heads: int, width: int, lnc: int) -> None:
    args = inputs(tokens, heads, width)
    got = kernel().engram_gate(*args, save=True, lnc=lnc)
    want = gate_naive(*args)
    names = ("out", "dot", "gate", "rstd_x", "rstd_k")
    diffs = {n: calc_diff(g, w) for n, g, w in zip(names, got, want, strict=True)}
    assert all(d < CALC_DIFF_BAR for d in diffs.values()), diffs
    assert [g.dtype for g in got] == [torch.bfloat16] + [torch.float32] * 4


def test_chunked_reduction_agrees_with_one_pass() -> None:
    args = inputs(130, 2, 512, seed=1)
    module = kernel()
    one_pass = module.engram_gate_kernel[1](*args, EPS, CLAMP, 512, True, False, False, True)
    chunked = module.engram_gate_kernel[1](*args, EPS, CLAMP, 128, True, True, False, True)
    for a, b in zip(one_pass, chunked, strict=True):
        assert calc_diff(a, b) < CALC_DIFF_BAR


def test_weights_rebuilt_per_tile_give_the_same_bits() -> None:
    args = inputs(200, 2, 256, seed=8)
    module = kernel()
    resident = module.engram_gate_kernel[2](*args, EPS, CLAMP, 256, True, True, False, True)
    streamed = module.engram_gate_kernel[2](*args, EPS, CLAMP, 256, False, False, False, True)
    for a, b in zip(resident, streamed, strict=True):
        assert torch.equal(a, b)


def test_weights_too_big_to_keep_are_rebuilt_per_tile() -> None:
    """HC = 8, H = 7168: all heads' fp32 weights (229 KiB) exceed SBUF, one head's fit."""
    module = kernel()
    assert module._choose(module._MODEL, 4096, 8, module._SBUF_BUDGET["trn2"])[1] is True
    hb, resident = module._choose(module._MODEL, 7168, 8, module._SBUF_BUDGET["trn2"])
    assert not resident and hb % 128 == 0
    args = inputs(130, 8, 7168, seed=9)
    got = module.engram_gate(*args, save=True, lnc=2)
    want = gate_naive(*args)
    assert all(calc_diff(g, w) < CALC_DIFF_BAR for g, w in zip(got, want, strict=True))


def test_save_does_not_change_out_bit_for_bit() -> None:
    args = inputs(200, 4, 256, seed=2)
    plain = kernel().engram_gate(*args, save=False, lnc=2)
    saved = kernel().engram_gate(*args, save=True, lnc=2)[0]
    assert torch.equal(plain.view(torch.int16), saved.view(torch.int16))


def test_s_exactly_zero_gives_gate_one_half() -> None:
    """sign(0) = 0 (the spec's `sign`, torch's): s == 0 gives sigmoid(0) = 0.5, not sigmoid(±sqrt(clamp))."""
    x, kv, w_h, w_e = inputs(3, 4, 256, seed=3)
    x[1] = 0  # rstd_x = 1e10 but the dot is exactly 0
    out, dot, gate, rstd_x, _ = kernel().engram_gate(x, kv, w_h, w_e, save=True, lnc=1)
    assert torch.equal(dot[1], torch.zeros(4)) and torch.equal(gate[1], torch.full((4,), 0.5))
    assert torch.equal(rstd_x[1], torch.full((4,), EPS**-0.5))
    assert torch.equal(out[1], (0.5 * kv[1, 4].float()).expand(4, -1).bfloat16())
    assert torch.equal(gate_naive(x, kv, w_h, w_e)[2][1].float(), gate[1])


def test_fused_weight_is_bit_exact() -> None:
    _, _, w_h, w_e = inputs(1, 4, 7168, seed=4)
    fused = kernel()._fused_weight(w_h, w_e)
    want = w_h.float() * w_e.float()
    assert fused.dtype == torch.float32 and fused.shape == want.shape and fused.is_contiguous()
    assert torch.equal(fused.view(torch.int32), want.view(torch.int32))


def test_gate_without_residual() -> None:
    args = inputs(150, 2, 256, seed=5)
    out = kernel("engram_gate_noresid").engram_gate_noresid(*args, lnc=2)
    assert calc_diff(out, gate_naive(*args, residual=False)[0]) < CALC_DIFF_BAR


def test_families_leave_each_others_specs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    engram = rewrite(load_spec("examples/engram_gate.spec")[0])
    with pytest.raises(Mismatch):
        FFN.match(engram)
    for spec in sorted((REPO / "examples").glob("*.spec")):
        ir = rewrite(load_spec(f"examples/{spec.name}")[0])
        matching = []
        for family in FAMILIES:
            try:
                family.match(ir)
                matching.append(family.name)
            except Mismatch:
                pass
        assert len(matching) == 1, (spec.name, matching)  # exactly one family carries each example


def test_a_spec_fitting_neither_family_names_both(tmp_path: Path) -> None:
    spec = tmp_path / "neither.spec"
    # centred over the tokens: no matmul for the FFN, a reduction over the token axis for the row family
    spec.write_text("kernel neither\ndim R, K\ninput x: bf16[R, K]\noutput y: bf16[R, K]\n"
                    "y = x - mean(x, axis=0, keepdim=true)\ncheck R=4 K=8\n")  # fmt: skip
    with pytest.raises(SpecError) as err:
        build_spec(str(spec), BuildOptions(out_dir=tmp_path))
    text = err.value.render()
    assert all(f"leaves the {family.name} family" in text for family in FAMILIES)


def test_hbm_bytes_per_token_from_the_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each input byte is read once, each output written once; the fp32 fused weight stays resident."""
    monkeypatch.chdir(REPO)
    tokens, heads, width, lnc = 512, 4, 2048, 2
    module = kernel()
    module.engram_gate(*inputs(tokens, heads, width, seed=6), save=True, lnc=lnc)
    dma = module.engram_gate_kernel.last_run.trace.totals()["dma"]
    ir = rewrite(load_spec("examples/engram_gate.spec")[0])
    per_token, minimum = token_bytes(ir, ROWREDUCE.match(ir), {"T": tokens, "HC": heads, "H": width})
    weights = 2 * heads * width * 2 * lnc  # w_h and w_e, bf16, read once per core
    assert minimum == 26 * width + 16 * heads
    assert dma["hbm_read"] + dma["hbm_write"] == per_token * tokens + weights
    assert (dma["hbm_read"] + dma["hbm_write"]) / tokens <= 1.05 * minimum


@pytest.mark.parametrize(("clamp", "heads", "width"), [
    (float("-inf"), 2, 256), (-3e38, 2, 256), (-1e10, 2, 256), (float("-inf"), 1, 32768),  # the last streamed
])  # fmt: skip
def test_a_negative_clamp_clamps_nothing(clamp: float, heads: int, width: int) -> None:
    """max(|s|, clamp) is exact for any clamp: a negative one leaves |s| as it is (built as relu(|s| - clamp)
    + clamp, -inf gave nan everywhere and -3e38 lost |s|), so out matches the formula without a clamp."""
    x, kv, w_h, w_e = inputs(130, heads, width)
    out = kernel().engram_gate(x, kv, w_h, w_e, clamp=clamp, lnc=1)
    no_clamp = kernel().engram_gate(x, kv, w_h, w_e, clamp=0.0, lnc=1)
    assert not out.float().isnan().any()
    assert torch.equal(out, no_clamp)  # |s| >= 0: a clamp of 0 or below changes nothing
    assert calc_diff(out, gate_naive(x, kv, w_h, w_e)[0]) < CALC_DIFF_BAR
