"""Scalars the kernel forms from its params when NKI traces it (`1.0 / p`, `q ** -0.5`, `(q - p) ** 0.5`) are
Python floats there: a param that makes one undefined (a zero divisor, rsqrt of 0, sqrt of a negative) is a
ValueError from the host naming the spec's expression and line, before any launch (it was a
ZeroDivisionError, or a complex `scale`, from inside the kernel's trace)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from fusegen.cli import main
from fusegen.codegen.files.ops import load_ops
from fusegen.sim import load_module
from tests.codegen.ffn_formula import GENERATED, close

ROW = """kernel scaled_row
dim T, H
input x: bf16[T, H]
param p = 2.0
param q = 4.0
output y: f32[T, H]
y = x / p * rsqrt(q) * sqrt(q - p)
check T=4 H=128
"""

FFN = """kernel scaled_ffn
dim R, K, I
require K % 128 == 0
input x: bf16[R, K]
input w1t: bf16[K, I]
input w2t: bf16[I, K]
param t = 1.0
output y: f32[R, K]
y = bf16(relu(x @ w1t) / t) @ w2t
check R=3 K=128 I=64
"""


def _build(tmp_path: Path, text: str) -> Path:
    name = text.split()[1]
    spec = tmp_path / f"{name}.spec"
    spec.write_text(text)
    assert main(["build", "--out", str(tmp_path / "out"), str(spec)]) == 0
    return tmp_path / "out" / name


@pytest.fixture(scope="module")
def row(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory.mktemp("row"), ROW)


def test_defined_params_run_as_the_math_says(row: Path) -> None:
    x = torch.randn(4, 128).bfloat16()
    y = load_module(row / "kernel.py", target="trn2").scaled_row(x, p=0.5, q=4.0)
    torch.testing.assert_close(y, x.float() / 0.5 * 4.0**-0.5 * 3.5**0.5, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("params", "says"), [
    ({"p": 0.0}, "scaled_row: the kernel needs p != 0 (spec line 7), got 0.0 from p=0.0, q=4.0"),
    ({"q": 0.0}, "the kernel needs q > 0 (spec line 7), got 0.0"),
    ({"q": -1.0}, "the kernel needs q > 0 (spec line 7), got -1.0"),
    ({"p": 5.0}, "the kernel needs (q - p) >= 0 (spec line 7), got -1.0 from p=5.0, q=4.0"),
])  # fmt: skip
def test_an_undefined_trace_time_scalar_is_named(row: Path, params: dict[str, float], says: str) -> None:
    module = load_module(row / "kernel.py", target="trn2")
    with pytest.raises(ValueError, match=_escaped(says)):
        module.scaled_row(torch.randn(4, 128).bfloat16(), **params)


def test_nan_params_pass_as_in_torch(row: Path) -> None:
    """nan compares false with everything, so no check refuses it; the kernel gives nan like the math."""
    module = load_module(row / "kernel.py", target="trn2")
    y = module.scaled_row(torch.randn(4, 128).bfloat16(), q=float("nan"))
    assert y.isnan().all()


def test_the_op_checks_the_same(row: Path) -> None:
    load_ops(row)
    with pytest.raises(ValueError, match=_escaped("fusegen::scaled_row: the kernel needs p != 0")):
        torch.ops.fusegen.scaled_row(torch.randn(4, 128), 0.0, 4.0)


def test_an_ffn_divisor(tmp_path: Path) -> None:
    module = load_module(_build(tmp_path, FFN) / "kernel.py", target="trn2")
    x, w1t, w2t = (torch.randn(*shape).bfloat16() for shape in ((3, 128), (128, 64), (64, 128)))
    with pytest.raises(ValueError, match=_escaped("scaled_ffn: the kernel needs t != 0 (spec line 9)")):
        module.scaled_ffn(x, w1t, w2t, t=0.0)


def test_a_param_divisor_beside_a_prepared_weight(tmp_path: Path) -> None:
    # the row kernel's weight prep has a signature of its own without params: collecting its domains from
    # the spec's `/ p` was a KeyError (an internal error) instead of a build
    text = ROW.replace("param q = 4.0", "input w: f16[H]")
    text = text.replace("x / p * rsqrt(q) * sqrt(q - p)", "(x - w) / p")
    module = load_module(_build(tmp_path, text) / "kernel.py", target="trn2")
    x, w = torch.randn(4, 128).bfloat16(), torch.randn(128).half()
    torch.testing.assert_close(module.scaled_row(x, w, p=-0.5), (x.float() - w.float()) / -0.5)
    with pytest.raises(ValueError, match=_escaped("scaled_row: the kernel needs p != 0")):
        module.scaled_row(x, w, p=0.0)


@pytest.mark.parametrize("scale", [np.float32(-0.37), np.int32(2), Fraction(1, 3)])
def test_a_numpy_or_fraction_param_runs_as_its_float(scale: object) -> None:
    """Real numbers that are not Python floats pass the check; the kernel gets their float, as the op's schema
    gives it (an np.float32 scale reached `activation(scale=)`, which the interpreter refused)."""
    module = load_module(GENERATED / "scaled_softmax" / "kernel.py", target="trn2")
    x = torch.randn(9, 300).bfloat16()
    p, lse = module.scaled_softmax(x, scale=scale)
    z = x.float() * float(scale)  # type: ignore[arg-type]
    close(p, torch.softmax(z, -1), 1e-2)
    close(lse, torch.logsumexp(z, -1, keepdim=True), 1e-5)


SQUARED = """kernel squared_row
dim T, H
input x: bf16[T, H]
param a = 1.0
output y: f32[T, H]
y = x * (a * a)
check T=4 H=128
"""


def test_an_immediate_past_f32_is_named(tmp_path: Path) -> None:
    """a * a = 1e40 from a = 1e20 was an inf immediate: the kernel (and the reference) gave inf for every x;
    a finite a * a runs as the math says, an inf a gives the inf the caller asked for."""
    folder = _build(tmp_path, SQUARED)
    module = load_module(folder / "kernel.py", target="trn2")
    x = torch.randn(4, 128).bfloat16()
    says = ("squared_row: the kernel computes with (a * a) (spec line 6), which is 1e+40 from "
            "a=1e+20: outside the f32 range (|value| <= 3.4028235e+38)")
    with pytest.raises(ValueError, match=_escaped(says)):
        module.squared_row(x, a=1e20)
    load_ops(folder)
    with pytest.raises(ValueError, match=_escaped(f"fusegen::{says}")):
        torch.ops.fusegen.squared_row(x, 1e20)
    assert torch.equal(module.squared_row(x, a=1e19), x.float() * 1e38)
    assert torch.equal(module.squared_row(x, a=float("inf")), x.float() * float("inf"))


def test_a_reciprocal_past_f32_is_named(row: Path) -> None:
    """x / p runs as x * (1 / p): p = 2e-39 (in f32's range) made 1 / p inf, so the kernel gave inf where
    the math, x / p * rsqrt(q) * sqrt(q - p) at q = 1e30, is finite."""
    module = load_module(row / "kernel.py", target="trn2")
    with pytest.raises(ValueError, match=_escaped("scaled_row: the kernel computes with 1 / p (spec line 7), "
                                                  "which is 5e+38 from p=2e-39, q=1e+30")):  # fmt: skip
        module.scaled_row((torch.randn(4, 128) / 16).bfloat16(), p=2e-39, q=1e30)


def _escaped(text: str) -> str:
    import re

    return re.escape(text)


PROJ_SCALARS = """kernel scalar_proj
dim R, K, N
input x: bf16[R, K]
input w: bf16[K, N]
param a = 0.7
output y: f32[R, N]
c = 3.0 * 2.0
h = x @ w
y = h * c * rsqrt(a) + h / (a + 1.0) - h * (a * a)
check R=5 K=256 N=192
"""

FFN_SCALARS = """kernel scalar_ffn
dim R, K, I
require K % 128 == 0
input x: bf16[R, K]
input wgt: bf16[K, I]
input wut: bf16[K, I]
input wdt: bf16[I, K]
input r: bf16[R, K]
param alpha = 0.5
param beta = 3.0
output out: f32[R, K]
c = alpha * beta + 1.0
out = (bf16(silu(x @ wgt) * (x @ wut)) @ wdt) * c + r * rsqrt(beta)
check R=3 K=256 I=384
"""


def test_scalar_values_in_a_projection_epilogue(tmp_path: Path) -> None:
    """Scalar statements and scalar subexpressions of params and numbers in the proj epilogue (the family
    refused them: "values in the epilogue must be [R, N]"), against the formula written out in torch."""
    module = load_module(_build(tmp_path, PROJ_SCALARS) / "kernel.py", target="trn2")
    x, w = torch.randn(5, 256).bfloat16(), torch.randn(256, 192).bfloat16()
    h = x.float() @ w.float()
    for a in (0.7, 2.5):
        want = h * 6.0 * a**-0.5 + h / (a + 1.0) - h * (a * a)
        close(module.scalar_proj(x, w, a=a), want, rtol=1e-5)


def test_scalar_values_in_an_ffn_epilogue(tmp_path: Path) -> None:
    """The same in the FFN's epilogue, with the f32 range check on the immediate they form. The scalars
    are checked against the kernel's own down projection d (alpha = 0, beta = 1 make c = 1: out = d + r),
    exactly up to f32 rounding; d against the formula within bf16 rounding, since the kernel rounds h to
    bf16 after sums in another order, and one element rounded the other way moves d by far more than f32
    rounding (flaky at 1e-5 with other seeds)."""
    module = load_module(_build(tmp_path, FFN_SCALARS) / "kernel.py", target="trn2")
    shapes = ((3, 256), (256, 384), (256, 384), (384, 256), (3, 256))
    gen = torch.Generator().manual_seed(0)
    x, wgt, wut, wdt, r = (torch.randn(*shape, generator=gen).bfloat16() for shape in shapes)
    h = (torch.nn.functional.silu(x.float() @ wgt.float()) * (x.float() @ wut.float())).bfloat16()
    d = module.scalar_ffn(x, wgt, wut, wdt, r, alpha=0.0, beta=1.0) - r.float()
    close(d, h.float() @ wdt.float(), rtol=2**-8)
    want = d * (0.25 * 4.0 + 1.0) + r.float() * 4.0**-0.5
    close(module.scalar_ffn(x, wgt, wut, wdt, r, alpha=0.25, beta=4.0), want, rtol=1e-5)
    with pytest.raises(ValueError, match=_escaped("outside the f32 range")):
        module.scalar_ffn(x, wgt, wut, wdt, r, alpha=1e20, beta=1e20)
