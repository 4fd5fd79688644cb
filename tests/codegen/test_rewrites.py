"""The IR rewrite pass: golden dumps, pass-through, validity, CSE, rmsnorm factors, unchanged values."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import torch

from fusegen.codegen.files.reference import reference_source
from fusegen.codegen.rewrites import rewrite
from fusegen.dsl import check, format_ir, load_spec, parse
from fusegen.dsl.ir import KernelIR
from fusegen.testing import load_generated

REPO = Path(__file__).parents[2]
GOLDEN = Path(__file__).parent / "golden"

RMSNORM_SPEC = """\
kernel gate_rmsnorm
dim T, G, H
input x: bf16[T, G, H]
input y: bf16[T, G, H]
input wx: bf16[H]
input wy: bf16[H]
param eps = 1e-6
output s: f32[T, G]
output rx_out: f32[T, G]
rx = rsqrt(mean(square(x), axis=-1, keepdim=true) + eps)
d = sum(rmsnorm(x, eps, wx) * rmsnorm(y, eps, wy), axis=-1, keepdim=true)
s = d[:, :, 0]
rx_out = rx[:, :, 0]
check T=3 G=2 H=8
"""

ONE_WEIGHT_SPEC = """\
kernel one_weight
dim T, H
input x: bf16[T, H]
input w: bf16[H]
output s: f32[T, 1]
s = sum(x * w, axis=-1, keepdim=true)
check T=3 H=8
"""


def _golden(request: pytest.FixtureRequest, name: str, text: str) -> None:
    path = GOLDEN / f"{name}.txt"
    if request.config.getoption("--update-golden"):
        path.write_text(text, encoding="utf-8")
        return
    assert path.exists(), f"missing {path}; create it with `pytest tests/codegen --update-golden`"
    assert text == path.read_text(encoding="utf-8"), (
        f"{path} differs; if intended, rerun with --update-golden"
    )


def _spec(text: str) -> KernelIR:
    return check(parse(text, "inline.spec"))


def _is_valid(ir: KernelIR) -> bool:
    ordered = all(n.id == i and all(a < n.id for a in n.args) for i, n in enumerate(ir.nodes))
    return ordered and all(0 <= o.node < len(ir.nodes) for o in ir.outputs)


@pytest.fixture
def engram(monkeypatch: pytest.MonkeyPatch) -> KernelIR:
    monkeypatch.chdir(REPO)
    return load_spec("examples/engram_gate.spec")[0]


@pytest.mark.parametrize("stage", ["before", "after"])
def test_engram_ir_matches_golden(request: pytest.FixtureRequest, engram: KernelIR, stage: str) -> None:
    ir = engram if stage == "before" else rewrite(engram)
    _golden(request, f"engram_gate.{stage}.ir", format_ir(ir))


def test_engram_keeps_three_accumulators_and_nothing_normalised(engram: KernelIR) -> None:
    fused = rewrite(engram)
    assert _is_valid(fused)
    sums = [n for n in fused.nodes if n.op in ("sum", "mean")]
    assert len(sums) == 3, "sum x^2, sum k^2 and one merged sum x*k*w"
    dot = next(n for n in sums if n.op == "sum")
    assert dot.name == "raw", "the saved raw dot and the normalised dot merged into one sum"
    (weight,) = [n for n in fused.nodes if n.shape == fused.inputs[2].shape and n.op == "mul"]
    assert [fused.node(a).name for a in weight.args] == ["w_h", "w_e"] and weight.dtype == "f32"
    full = fused.node(fused.outputs[0].node).shape
    normalised = [n for n in fused.nodes if n.op == "mul" and n.shape == full and
                  any(fused.node(a).op == "rsqrt" for a in n.args)]  # fmt: skip
    assert not normalised, "no full-width tensor is multiplied by an rstd"


@pytest.mark.parametrize("name", ["swiglu_ffn", "swiglu_ffn_ln"])
def test_specs_without_the_pattern_pass_through(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.chdir(REPO)
    ir = load_spec(f"examples/{name}.spec")[0]
    assert rewrite(ir) is ir


def test_one_weight_and_nothing_to_hoist_is_left_alone() -> None:
    ir = _spec(ONE_WEIGHT_SPEC)
    assert rewrite(ir) is ir


def test_rmsnorm_factors_are_expanded_and_their_rstd_merges(request: pytest.FixtureRequest) -> None:
    fused = rewrite(_spec(RMSNORM_SPEC))
    assert _is_valid(fused)
    assert not [n for n in fused.nodes if n.op == "rmsnorm"]
    rsqrts = [n for n in fused.nodes if n.op == "rsqrt"]
    assert len(rsqrts) == 2, "the spec's own rx and rmsnorm(x)'s rstd are one node"
    _golden(request, "gate_rmsnorm.after.ir", format_ir(fused))


def reference_module(ir: KernelIR, tmp_path: Path, tag: str) -> ModuleType:
    """`ir`'s reference.py, written under `tmp_path` as `tag`.py and imported."""
    path = tmp_path / f"{tag}.py"
    path.write_text(reference_source(ir))
    return load_generated(path)


@pytest.mark.parametrize("source", ["engram", "rmsnorm"])
def test_rewritten_ir_computes_the_same_values(engram: KernelIR, tmp_path: Path, source: str) -> None:
    before = engram if source == "engram" else _spec(RMSNORM_SPEC)
    after = rewrite(before)
    gen = torch.Generator().manual_seed(0)
    t, g, h = 5, 3, 256
    shapes = {"x": (t, g, h), "kv": (t, g + 1, h), "y": (t, g, h), "w_h": (g, h), "w_e": (g, h), "wx": (h,),
              "wy": (h,)}  # fmt: skip
    args = [torch.randn(shapes[i.name], generator=gen).bfloat16() for i in before.inputs]
    save = {"save": True} if any(o.optional for o in before.outputs) else {}
    want = getattr(reference_module(before, tmp_path, "before"), f"{before.name}_reference")(*args, **save)
    got = getattr(reference_module(after, tmp_path, "after"), f"{after.name}_reference")(*args, **save)
    for w, g_ in zip(want, got, strict=True):
        torch.testing.assert_close(g_.float(), w.float(), rtol=1e-5, atol=1e-5)


def test_column_slices_of_a_packed_product_become_projections(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(REPO)
    before = load_spec("examples/packed_clamped_swiglu.spec")[0]
    after = rewrite(before)
    assert _is_valid(after)
    ups = [n for n in after.nodes if n.op == "matmul"][:-1]
    weights = [after.node(u.args[1]) for u in ups]
    assert [w.op for w in weights] == ["index", "index"]
    assert {after.node(w.args[0]).name for w in weights} == {"w12t"}
    assert [str(w.attr("index")[1].start) for w in weights] == ["0", "I"]  # type: ignore[index]
    assert not [n for n in after.nodes if n.op == "index" and after.node(n.args[0]).op == "matmul"]
    gen = torch.Generator().manual_seed(1)
    args = [torch.randn(shape, generator=gen).bfloat16() for shape in ((5, 128), (128, 2 * 96), (96, 128))]
    want = reference_module(before, tmp_path, "before").packed_clamped_swiglu_reference(*args, limit=0.5)
    got = reference_module(after, tmp_path, "after").packed_clamped_swiglu_reference(*args, limit=0.5)
    assert torch.equal(got, want), "a column slice of a product is the product with the sliced weight"


MAX_ABS_SPEC = """\
kernel amax
dim T, H
input x: bf16[T, H]
input w: bf16[H]
output a: f32[T, 1]
output b: f32[T, 1]
y = rmsnorm(x, 1e-6, w)
a = max(abs(y), 1, keepdim=true)
b = max(abs(x * mean(x, 1, keepdim=true)), 1, keepdim=true)
check T=3 H=8
"""


def test_a_non_negative_per_row_factor_leaves_max_abs_as_a_scale(tmp_path: Path) -> None:
    """max|x * rstd * w| is max|x * w| * rstd (rstd >= 0, so no pass needs the normalised row first); a
    per-row mean may be negative and stays inside. The two forms round the same products, up to the
    order of the multiplications, so they agree to an ulp or two of f32."""
    before = _spec(MAX_ABS_SPEC)
    after = rewrite(before)
    assert _is_valid(after)
    a, b = (after.node(o.node) for o in after.outputs)
    assert (a.op, after.node(a.args[1]).op) == ("mul", "rsqrt")  # max(abs(x * w)) * rstd
    assert after.node(after.node(a.args[0]).args[0]).op == "abs"
    assert b.op == "max"  # the mean is not known to be non-negative: left alone
    x = torch.randn(4, 512, generator=torch.Generator().manual_seed(1)).bfloat16()
    w = (torch.randn(512, generator=torch.Generator().manual_seed(2)) * 3).bfloat16()  # negative weights too
    want = reference_module(before, tmp_path, "before").amax_reference(x, w)
    got = reference_module(after, tmp_path, "after").amax_reference(x, w)
    for w_, g_ in zip(want, got, strict=True):
        torch.testing.assert_close(g_, w_, rtol=3e-7, atol=0)
