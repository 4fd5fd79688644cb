"""Ops used the way training code uses them: outputs modified in place before the backward (`h += x`),
second-order requests, forward-mode requests. Each gives torch's answer or a clear error naming the op."""

from __future__ import annotations

import re

import pytest
import torch

from fusegen.codegen.files import ops as ops
from tests.codegen.boundary import (
    GENERATED,
    KERNELS,
    as_tuple,
    inputs,
    kernel,
    op,
    small_dims,
    spec_ir,
    trainable,
)

TRAINS = [name for name in KERNELS if trainable(name)]


def _leaves(name: str, rows: int = 3) -> list[torch.Tensor]:
    """f32 inputs at small dims that require grad."""
    ir = spec_ir(name)
    return [a.float().requires_grad_(True) for a in inputs(ir, small_dims(ir, rows=rows))]


@pytest.mark.parametrize("backend", ["interpreter", "reference"])
@pytest.mark.parametrize("name", KERNELS)
def test_outputs_are_tensors_of_their_own(name: str, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every output is a fresh tensor, not a view (the interpreter handed out views of its flat buffers:
    autograd forbids in-place writes to a view a custom op returns), from the op and the host function."""
    monkeypatch.setenv("FUSEGEN_OPS_BACKEND", backend)
    ir = spec_ir(name)
    args = inputs(ir, small_dims(ir))
    assert all(o._base is None for o in as_tuple(op(name)(*args)))  # type: ignore[operator]
    assert all(o._base is None for o in as_tuple(getattr(kernel(name), name)(*args)))


@pytest.mark.parametrize("name", TRAINS)
def test_an_output_modified_in_place_trains_as_in_torch(name: str) -> None:
    """`y = op(...)[0]; y.add_(1)` then backward: the gradients of `y + 1`, when y is not saved for the
    backward; when it is, torch's version-counter error (as eager torch gives for a saved tensor)."""
    leaves = _leaves(name, rows=130)
    first = as_tuple(op(name)(*leaves))[0]  # type: ignore[operator]
    want = torch.autograd.grad((first.float() + 1).square().sum(), leaves)
    first = as_tuple(op(name)(*leaves))[0]  # type: ignore[operator]
    first.add_(1)
    if 0 in ops.load_ops(name, GENERATED)._SAVED_OUTPUTS:  # a norm epilogue's x_new: refused, as torch
        # refuses any tensor written in place after autograd saved it
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            torch.autograd.grad(first.float().square().sum(), leaves)
        return
    got = torch.autograd.grad(first.float().square().sum(), leaves)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


SECOND = "fusegen::{name} has no second derivative: its backward (fusegen::{name}_backward) is not"


@pytest.mark.parametrize("name", ["engram_gate", "swiglu_ffn", "layernorm"])
def test_a_double_backward_names_the_op(name: str) -> None:
    """create_graph=True gives the first-order gradients; differentiating them names the op (it was torch's
    "no autograd formula was registered" for the internal fusegen::<name>_backward)."""
    leaves = _leaves(name)
    want = torch.autograd.grad(as_tuple(op(name)(*leaves))[0].float().square().sum(), leaves)  # type: ignore[operator]
    loss = as_tuple(op(name)(*leaves))[0].float().square().sum()  # type: ignore[operator]
    got = torch.autograd.grad(loss, leaves, create_graph=True)
    assert all(torch.equal(g.detach(), w) for g, w in zip(got, want, strict=True))
    with pytest.raises(RuntimeError, match=re.escape(SECOND.format(name=name))):
        sum(g.square().sum() for g in got).backward()  # a gradient penalty


def test_a_hessian_names_the_op() -> None:
    x, kv, w_h, w_e = _leaves("engram_gate")
    with pytest.raises(RuntimeError, match=re.escape(SECOND.format(name="engram_gate"))):
        torch.autograd.functional.hessian(lambda w: op("engram_gate")(x, kv, w, w_e)[0].float().sum(), w_h)  # type: ignore[operator]


@pytest.mark.parametrize("name", ["engram_gate", "swiglu_ffn", "rmsnorm_qkv"])
def test_forward_mode_ad_is_refused_not_zero(name: str) -> None:
    """A forward-AD dual input gave outputs with no tangent (torch runs a custom op without a forward-mode
    rule as if its inputs had none): now a NotImplementedError naming the op."""
    import torch.autograd.forward_ad as fwad

    ir = spec_ir(name)
    args = inputs(ir, small_dims(ir))
    with fwad.dual_level():
        dual = fwad.make_dual(args[0], torch.ones_like(args[0]))
        says = f"fusegen::{name} has no forward-mode derivative"
        with pytest.raises(NotImplementedError, match=re.escape(says)):
            op(name)(dual, *args[1:])  # type: ignore[operator]
