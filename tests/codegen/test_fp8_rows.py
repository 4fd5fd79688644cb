"""fp8 outputs of row kernels: generated add_rmsnorm_fp8 against a float64 formula (its per-token scale,
and its quantised row to the nearest e5m2 code wherever the exact value is not within fp32 rounding of a
tie), on trn2 and trn1, and the spec errors for the fp8 values the row family does not lower."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fusegen.cli import main
from fusegen.sim import load_module

ROOT = Path(__file__).resolve().parents[2]
E5M2 = torch.float8_e5m2
TOP = {E5M2: 57344.0}  # the format's largest finite value


def _inputs(t: int, h: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(t * 7919 + h)
    x = (torch.randn(t, h, generator=g) * 3).bfloat16()
    r = torch.randn(t, h, generator=g).bfloat16()
    w = (torch.rand(h, generator=g) + 0.5).bfloat16()
    if t > 1:
        x[1], r[1] = 0, 0  # an all-zero row: the tiny scale, q all zero
    return x, r, w


def _expected(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, top: float) -> tuple[torch.Tensor, ...]:
    """h, the exact quotient y / s and s, in float64."""
    t = x.double() + r.double()
    y = t * torch.rsqrt((t * t).mean(-1, keepdim=True) + 1e-6) * w.double()
    s = torch.clamp(y.abs().amax(-1, keepdim=True), min=1e-12) / top
    return t, y / s, s


def _check(q: torch.Tensor, s: torch.Tensor, exact_q: torch.Tensor, exact_s: torch.Tensor) -> None:
    """s within fp32 rounding; q the nearest code of the exact quotient except at near-ties."""
    assert ((s.double() - exact_s).abs() <= 1e-6 * exact_s).all()
    got, nearest = q.double(), exact_q.to(q.dtype).double()
    off = got != nearest
    midpoint = (got[off] + nearest[off]) / 2
    assert ((exact_q[off] - midpoint).abs() <= 1e-6 * exact_q[off].abs()).all()  # a tie up to fp32 rounding
    assert off.float().mean().item() < 1e-4
    rows = exact_q.abs().amax(-1) > 0
    assert (got.abs().amax(-1)[rows] == TOP[q.dtype]).all()  # a row's largest element lands on the top code


# the last shape streams its rows from HBM (too wide for SBUF whole)
@pytest.mark.parametrize(("t", "h", "lnc"), [(130, 4096, 2), (1, 8192, 1), (3, 384, 2), (3, 40960, 2)])
def test_add_rmsnorm_fp8_matches_the_formula(t: int, h: int, lnc: int) -> None:
    module = load_module(ROOT / "generated" / "add_rmsnorm_fp8" / "kernel.py", target="trn2")
    x, r, w = _inputs(t, h)
    h_out, q, s = module.add_rmsnorm_fp8(x, r, w, lnc=lnc)
    exact_h, exact_q, exact_s = _expected(x, r, w, 57344.0)
    assert (q.dtype, q.shape, s.dtype, s.shape) == (E5M2, (t, h), torch.float32, (t, 1))
    assert torch.equal(h_out, exact_h.bfloat16())
    _check(q, s, exact_q, exact_s)
    if t > 1:
        assert not q[1].float().any()


def _build(spec: Path, text: str, target: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    spec.write_text(text)
    code = main(["build", str(spec), "--out", str(spec.parent / "out"), "--target", target])
    return code, capsys.readouterr().err


def test_the_example_builds_and_runs_on_trn1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (ROOT / "examples" / "add_rmsnorm_fp8.spec").read_text()
    code, err = _build(tmp_path / "add_rmsnorm_fp8.spec", text, "trn1", capsys)
    assert code == 0, err
    module = load_module(tmp_path / "out" / "add_rmsnorm_fp8" / "kernel.py", target="trn1")
    x, r, w = _inputs(130, 256)
    _, q, s = module.add_rmsnorm_fp8(x, r, w, target="trn1")
    _, exact_q, exact_s = _expected(x, r, w, 57344.0)
    assert q.dtype == E5M2
    _check(q, s, exact_q, exact_s)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("input x: fp8_e5m2[T, H]\noutput y: bf16[T, H]\ny = rmsnorm(f32(x), 1e-6)",
         "t.spec:3:1: error: `x` is an fp8 input; the rowreduce family writes fp8 outputs only"),
        ("input x: bf16[T, H]\noutput y: bf16[T, H]\ny = f32(fp8_e5m2(x)) * 2",
         "t.spec:5:9: error: an fp8 value read again; the rowreduce family writes fp8 outputs only"),
        ("input x: bf16[T, H]\noutput q: fp8_e5m2[T, H]\noutput y: bf16[T, H]\nq = x * 2\ny = f32(q) + 1",
         "t.spec:6:5: error: output `q` is fp8_e5m2 and read again; the rowreduce family"),
    ],
)  # fmt: skip
def test_fp8_the_row_family_does_not_lower(
    line: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _build(tmp_path / "t.spec", f"kernel t\ndim T, H\n{line}\ncheck T=4 H=128\n", "trn2", capsys)
    assert code == 2
    assert message in err
    assert not (tmp_path / "out").exists()
