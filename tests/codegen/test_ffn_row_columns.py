"""An FFN whose epilogue reads a per-row [R, 1] input (an MoE router weight scaling the expert's output)
trains: the forward kernel and the backward (backward_reference.py, since the backward's elementwise
kernels load only [R, N] and [N] values) against a hand-written fp64 torch formula, on the interpreter."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fusegen.cli import main
from fusegen.codegen.files.ops import load_ops
from tests.codegen.test_autodiff import calc_diff
from tests.codegen.test_ffn_backward import BAR

R, K, I = 33, 256, 200
SPEC = """kernel ffn_rowcol
dim R, K, I
require K % 128 == 0
input x: bf16[R, K]
input wgt: bf16[K, I]
input wut: bf16[K, I]
input wdt: bf16[I, K]
input rw: f32[R, 1]
input a: f32[R, K]
param alpha = 0.5
output out: f32[R, K]
out = (bf16(silu(x @ wgt) * (x @ wut)) @ wdt) * rw + alpha * a
check R=8 K=128 I=64
"""


def _formula(x, wgt, wut, wdt, rw, a, alpha):  # type: ignore[no-untyped-def]
    h = (F.silu(x @ wgt) * (x @ wut)).to(torch.bfloat16).to(x.dtype)
    return (h @ wdt) * rw + alpha * a


@pytest.fixture(scope="module")
def ffn_rowcol(tmp_path_factory: pytest.TempPathFactory) -> object:
    out = tmp_path_factory.mktemp("ffn_rowcol")
    spec = out / "ffn_rowcol.spec"
    spec.write_text(SPEC, encoding="utf-8")
    assert main(["build", "--out", str(out / "gen"), str(spec)]) == 0
    load_ops(Path(out / "gen" / "ffn_rowcol"))
    return torch.ops.fusegen.ffn_rowcol


def test_row_column_scaled_ffn_trains(ffn_rowcol: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FUSEGEN_OPS_BACKEND", "interpreter")
    gen = torch.Generator().manual_seed(3)
    shapes = ((K, I), (K, I), (I, K))
    weights = [(torch.randn(*shape, generator=gen) * shape[0] ** -0.5).bfloat16() for shape in shapes]
    args = [torch.randn(R, K, generator=gen).bfloat16(), *weights, torch.rand(R, 1, generator=gen) + 0.5,
            torch.randn(R, K, generator=gen)]  # fmt: skip
    grad = torch.randn(R, K, generator=gen)
    leaves = [t.detach().requires_grad_(True) for t in args]
    out = ffn_rowcol(*leaves, 0.75)  # type: ignore[operator]
    got = torch.autograd.grad((out * grad).sum(), leaves)
    ref_leaves = [t.double().requires_grad_(True) for t in args]
    want = _formula(*ref_leaves, 0.75)
    assert calc_diff(out, want) <= BAR
    wanted = torch.autograd.grad((want * grad.double()).sum(), ref_leaves)
    for name, g, w in zip(("x", "wgt", "wut", "wdt", "rw", "a"), got, wanted, strict=True):
        # a bf16 leaf's gradient is rounded to bf16 (relative error <= 2**-9, so calc_diff <= 2**-19)
        bar = BAR if g.dtype == torch.float32 else 2**-17
        assert g.shape == w.shape and calc_diff(g, w) <= bar, (name, calc_diff(g, w))
