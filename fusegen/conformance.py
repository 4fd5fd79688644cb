"""torch conformance of a generated op, checked the way torch documents it: `torch.library.opcheck` on
`torch.ops.fusegen.<name>` with and without requires_grad, and `torch.autograd.gradcheck` (fast mode) of a
trainable op's registered backward against finite differences of its forward (docs/autodiff.md).

Used by the generated tests (test_<name>.py); the op runs where FUSEGEN_OPS_BACKEND and FUSEGEN_MODE say
(fusegen/modes.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from fusegen.codegen.files.ops import load_ops
from fusegen.testing import make_inputs

#: (eps, tol) of gradcheck by the narrowest float dtype among a spec's inputs and outputs. The op rounds its
#: inputs and outputs to that dtype (unit roundoff u: 2^-8 for bf16), so finite differences see the gradient
#: only through that rounding. Fast mode steps each input along a unit-norm direction by eps: at eps = 1 an
#: element moves by ~1/sqrt(numel), far above bf16's resolution yet small enough that the step's
#: second-order error stays below the rounding's (measured: |numerical - analytical| <= 5.1e-3 on the
#: row-reduction examples). tol (atol = rtol) is 4u, per Jacobian element: fast mode scales atol by
#: sum(u) * sum(v), so with bf16 this is a coarse check (wrong shapes, dtypes, NaNs, missing or grossly wrong
#: terms); gradient values are held to 1e-7..1e-8 against fp64 by tests/codegen/test_autodiff.py,
#: test_backward_kernel.py and test_ops.py.
GRADCHECK = {"bf16": (1.0, 2.0**-6), "f16": (1.0, 2.0**-9), "f32": (1e-2, 1e-4)}
#: narrowest first
_NARROWEST = ("bf16", "f16", "f32")


def away_from_zero(t: torch.Tensor) -> torch.Tensor:
    """`t` with each value moved 1 further from zero, rounded to its dtype (so the op reads the fp64 copy
    exactly): a gradcheck step (at most eps = 1 per element) then never crosses zero, where relu, abs and a
    norm's scale invariance (rmsnorm(x * s) is sign(s) rmsnorm(x)) change slope abruptly and a finite
    difference is no derivative. Weights are left as they are: their 1 / sqrt(fan-in) scale keeps the
    outputs near unit size."""
    f = t.float()
    return (f + torch.where(f < 0, -1.0, 1.0)).to(t.dtype)


def _op(directory: Path, name: str) -> Any:
    """torch.ops.fusegen.<name>, registered by importing `directory`/ops.py."""
    load_ops(name, directory.parent)
    return getattr(torch.ops.fusegen, name)


_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
#: torch.library.opcheck's default utilities
_OPCHECK_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def opcheck(
    directory: Path, name: str, inputs: tuple[tuple[str, str, str], ...], shapes: dict[str, tuple[int, ...]],
    requires_grad: bool,
) -> None:  # fmt: skip
    """torch.library.opcheck of the op (schema, autograd registration, fake tensor, AOT dispatch) on seeded
    inputs in the spec's dtypes; with `requires_grad` every input requires grad."""
    args = [t.requires_grad_(requires_grad) for t in make_inputs(inputs, shapes)]
    fp8 = [t for t in args if t.dtype in _FP8]
    if not fp8:
        torch.library.opcheck(_op(directory, name).default, tuple(args))
        return
    # torch's schema check compares inputs with allclose, which fp8 tensors lack: check the op leaves its
    # inputs' bytes alone here instead, and run opcheck's other utilities
    before = [t.view(torch.uint8).clone() for t in fp8]
    utils = tuple(u for u in _OPCHECK_UTILS if u != "test_schema")
    torch.library.opcheck(_op(directory, name).default, tuple(args), test_utils=utils)
    _op(directory, name)(*args)
    if any(not torch.equal(b, t.view(torch.uint8)) for b, t in zip(before, fp8, strict=True)):
        raise AssertionError(f"{name} wrote to an fp8 input it does not declare mutable")


def call(
    directory: Path, name: str, inputs: tuple[tuple[str, str, str], ...], shapes: dict[str, tuple[int, ...]],
    requires_grad: bool,
) -> Any:  # fmt: skip
    """The op on seeded inputs in the spec's dtypes; with `requires_grad` every input requires grad."""
    return _op(directory, name)(*(t.requires_grad_(requires_grad) for t in make_inputs(inputs, shapes)))


def gradcheck(
    directory: Path, name: str, inputs: tuple[tuple[str, str, str], ...], shapes: dict[str, tuple[int, ...]],
    differentiated: tuple[int, ...], dtypes: tuple[str, ...],
) -> bool:  # fmt: skip
    """torch.autograd.gradcheck (fast mode) of the op's outputs at positions `differentiated` with respect to
    every input, at fp64 copies of the seeded inputs (values exact in the spec's dtypes); `dtypes`: the spec's
    input and output dtypes, which set the step and tolerances (GRADCHECK)."""
    op = _op(directory, name)
    eps, tol = GRADCHECK[next(d for d in _NARROWEST if d in dtypes)]
    seeded = make_inputs(inputs, shapes)
    args = tuple((t if scale == "fan_in" else away_from_zero(t)).double().requires_grad_(True)
                 for (_, _, scale), t in zip(inputs, seeded, strict=True))  # fmt: skip

    def differentiable(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outs = op(*tensors)
        outs = outs if isinstance(outs, tuple) else (outs,)
        return tuple(outs[i].double() for i in differentiated)  # differences in fp64, not the output dtype

    return torch.autograd.gradcheck(differentiable, args, eps=eps, atol=tol, rtol=tol, fast_mode=True)
