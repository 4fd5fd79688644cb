"""Every op under torch.inference_mode() and torch.no_grad(), at LNC 1 and 2 (rows on both cores): the
interpreter's per-core threads run in the caller's modes. FFN ops in an eval-mode module with
nn.Parameter weights: the same values under no_grad and with grad enabled (then with a graph to train). Every
op under torch.autocast: the same outputs and gradients as without."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
import torch

from fusegen.codegen.files import ops as ops
from tests.codegen.boundary import GENERATED, KERNELS, as_tuple, inputs, op, small_dims, spec_ir, trainable

MODES: dict[str, Callable[[], contextlib.AbstractContextManager[object]]] = {
    "inference_mode": torch.inference_mode, "no_grad": torch.no_grad,
}  # fmt: skip


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("name", KERNELS)
def test_op_in_inference_contexts(name: str, lnc: int, monkeypatch: pytest.MonkeyPatch) -> None:
    kernels = ops.load_ops(name, GENERATED)._module("kernel.py", "sim")  # what the op launches
    monkeypatch.setattr(kernels, "_LNC", lnc)
    ir = spec_ir(name)
    args = inputs(ir, small_dims(ir, rows=130))  # 130 rows: both cores of LNC 2 write outputs
    want = as_tuple(op(name)(*args))  # type: ignore[operator]
    assert kernels._LNC == lnc
    for mode in MODES.values():
        with mode():
            got = as_tuple(op(name)(*args))  # type: ignore[operator]
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    with torch.inference_mode():  # an inference tensor in, too
        got = as_tuple(op(name)(*(a.clone() for a in args)))  # type: ignore[operator]
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


class _Ffn(torch.nn.Module):
    """A SwiGLU FFN layer holding its weights as parameters, calling torch.ops.fusegen.swiglu_ffn."""

    def __init__(self, weights: list[torch.Tensor]) -> None:
        super().__init__()
        self.weights = torch.nn.ParameterList(torch.nn.Parameter(w) for w in weights)
        self.ffn = op("swiglu_ffn")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ffn(x, *self.weights)  # type: ignore[operator, no-any-return]


def test_ffn_op_in_an_eval_module_with_parameters() -> None:
    ir = spec_ir("swiglu_ffn")
    x, *weights = inputs(ir, small_dims(ir, rows=130))
    want = op("swiglu_ffn")(x, *weights)  # type: ignore[operator]
    model = _Ffn(weights).eval()
    assert all(p.requires_grad for p in model.parameters())
    for mode in MODES.values():
        with mode():
            assert torch.equal(model(x), want)
    out = model(x)  # grad enabled, parameters require grad: the op records its backward
    assert out.requires_grad and torch.equal(out.detach(), want)


@pytest.mark.parametrize("backend", ["interpreter", "reference"])
@pytest.mark.parametrize("name", KERNELS)
def test_op_under_autocast_computes_as_without(name: str, backend: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A training loop's torch.autocast("cpu", bf16) reached the interpreter's and the reference's torch
    matmuls (bf16 products where the kernel accumulates in fp32 PSUM): outputs and gradients changed."""
    monkeypatch.setenv("FUSEGEN_OPS_BACKEND", backend)
    ir = spec_ir(name)
    args = inputs(ir, small_dims(ir, rows=5))
    leaves = [a.float().requires_grad_(trainable(name) and a.dtype != torch.float8_e4m3fn) for a in args]
    leaves = [a if a.requires_grad else b for a, b in zip(leaves, args, strict=True)]
    results = []
    for autocast in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            outs = as_tuple(op(name)(*leaves))  # type: ignore[operator]
            grads = torch.autograd.grad(outs[0].float().square().sum(), leaves) if trainable(name) else ()
        results.append([o.detach() for o in outs] + list(grads))
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))
