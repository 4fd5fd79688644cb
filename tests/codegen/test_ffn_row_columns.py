"""FFNs with per-row [R, 1] values train: an [R, 1] input in the epilogue (an MoE router weight scaling the
expert's output) and an [R, 1] output (a row statistic, whose gradient is an [R, 1] input of the backward).
The backward's elementwise kernels load only [R, N] and [N] values, so these train through
backward_reference.py; forward and gradients against hand-written fp64 torch formulas, on the interpreter."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fusegen.cli import main
from fusegen.codegen.files.ops import load_ops
from tests.codegen.test_autodiff import calc_diff
from tests.codegen.test_ffn_backward import BAR

R, K, I = 33, 256, 200
HEAD = "dim R, K, I\nrequire K % 128 == 0\ninput x: bf16[R, K]\n"
SPECS = {
    "ffn_rowcol_in": HEAD + "input wgt: bf16[K, I]\ninput wut: bf16[K, I]\ninput wdt: bf16[I, K]\n"
    "input rw: f32[R, 1]\ninput a: f32[R, K]\nparam alpha = 0.5\noutput out: f32[R, K]\n"
    "out = (bf16(silu(x @ wgt) * (x @ wut)) @ wdt) * rw + alpha * a\ncheck R=8 K=128 I=64\n",
    "ffn_rowcol_out": HEAD + "input w1t: bf16[K, I]\ninput w2t: bf16[I, K]\ninput s: f32[R, 1]\n"
    "output y: f32[R, K]\noutput n2: f32[R, 1]\ny = bf16(relu(x @ w1t)) @ w2t\n"
    "n2 = sum(square(y * s), axis=-1, keepdim=true)\ncheck R=8 K=128 I=64\n",
}


def _rowcol_in(x, wgt, wut, wdt, rw, a):  # type: ignore[no-untyped-def]
    h = (F.silu(x @ wgt) * (x @ wut)).to(torch.bfloat16).to(x.dtype)
    return ((h @ wdt) * rw + 0.75 * a,)


def _rowcol_out(x, w1t, w2t, s):  # type: ignore[no-untyped-def]
    y = F.relu(x @ w1t).to(torch.bfloat16).to(x.dtype) @ w2t
    return y, (y * s).square().sum(-1, keepdim=True)


#: name -> (the math in fp64, the input shapes after x; an [R, 1] input is a positive per-row scale)
FORMULAS: dict[str, tuple[Callable[..., tuple[torch.Tensor, ...]], tuple[tuple[int, int], ...]]] = {
    "ffn_rowcol_in": (_rowcol_in, ((K, I), (K, I), (I, K), (R, 1), (R, K))),
    "ffn_rowcol_out": (_rowcol_out, ((K, I), (I, K), (R, 1))),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ffn_rowcol")
    for name, body in SPECS.items():
        (out / f"{name}.spec").write_text(f"kernel {name}\n{body}", encoding="utf-8")
    assert main(["build", "--out", str(out / "gen"), *(str(out / f"{n}.spec") for n in SPECS)]) == 0
    return out / "gen"


def _inputs(name: str, gen: torch.Generator) -> list[torch.Tensor]:
    """x, then bf16 weights scaled by 1/sqrt(fan-in), f32 per-row scales in [0.5, 1.5), f32 residuals."""
    tensors = [torch.randn(R, K, generator=gen).bfloat16()]
    for shape in FORMULAS[name][1]:
        if shape == (R, 1):
            tensors.append(torch.rand(R, 1, generator=gen) + 0.5)
        elif shape == (R, K):
            tensors.append(torch.randn(R, K, generator=gen))
        else:
            tensors.append((torch.randn(*shape, generator=gen) * shape[0] ** -0.5).bfloat16())
    return tensors


@pytest.mark.parametrize("name", sorted(SPECS))
def test_ffn_with_row_columns_trains(name: str, built: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FUSEGEN_OPS_BACKEND", "interpreter")
    load_ops(built / name)
    gen = torch.Generator().manual_seed(3)
    args = _inputs(name, gen)
    params = (0.75,) if name == "ffn_rowcol_in" else ()
    leaves = [t.detach().requires_grad_(True) for t in args]
    outs = getattr(torch.ops.fusegen, name)(*leaves, *params)
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    grads = [torch.randn(o.shape, generator=gen) for o in outs]
    got = torch.autograd.grad(sum((o * g).sum() for o, g in zip(outs, grads, strict=True)), leaves)
    ref_leaves = [t.double().requires_grad_(True) for t in args]
    wants = FORMULAS[name][0](*ref_leaves)
    assert all(calc_diff(o, w) <= BAR for o, w in zip(outs, wants, strict=True))
    loss = sum((w * g.double()).sum() for w, g in zip(wants, grads, strict=True))
    for index, (g, w) in enumerate(zip(got, torch.autograd.grad(loss, ref_leaves), strict=True)):
        # a bf16 leaf's gradient is rounded to bf16 (relative error <= 2**-9, so calc_diff <= 2**-19)
        bar = BAR if g.dtype == torch.float32 else 2**-17
        assert g.shape == w.shape and calc_diff(g, w) <= bar, (index, calc_diff(g, w))
