"""Gradients through the generated op (`torch.ops.fusegen.<name>`, its registered backward: backward kernels
or backward_reference.py) against torch autograd of the oracle's own trees (bench/oracle_eval.py) in
float64; a cast rounds the gradient through its dtype there, as docs/autodiff.md says the derivation does.

This is a check of derivations, not of rounding: no radius is carried through a backward. An element is
flagged where it is off by more than GRAD_REL of its tensor's largest float64 gradient, plus two roundings
of the gradient's dtype and four times the float32 autograd's own error there (so what f32 cannot compute
well is not held against the op). A wrong derivative (a missing term, a wrong sign, a reduction over the
wrong axis) is off by the order of the gradient itself; rounding in f32 is ~2**-24 of the terms.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from oracle_eval import DTYPES, UNIT, Evaluator
from oracle_gen import FP8, OracleCase

GRAD_REL = 2.0**-6
#: generators whose specs train (the proj family is inference-only, README)
TRAINED = ("rows_case", "heads_case", "ffn_case")


def trains(case: OracleCase) -> bool:
    """Whether the case's op has a backward to check (no fp8: those ops are inference-only)."""
    return case.generator in TRAINED and not any(d in FP8 for _, d, _ in case.inputs)


def _oracle_grads(case: OracleCase, args: Sequence[torch.Tensor], cot: dict[str, torch.Tensor],
                  dtype: torch.dtype) -> list[torch.Tensor | None]:  # fmt: skip
    """d(sum of outputs x cotangents) / d(input) by torch autograd of the oracle's trees in `dtype`."""
    leaves = [a.to(dtype).requires_grad_(True) for a in args]
    env: dict[str, torch.Tensor | float] = {n: t for (n, _, _), t in zip(case.inputs, leaves, strict=True)}
    env.update(case.params)
    env.update({k: float(v) for k, v in case.dims.items()})
    ev = Evaluator(env, dtype, radius=False)
    loss = sum((ev(o.node)[0] * cot[o.name].to(dtype).reshape(ev(o.node)[0].shape)).sum()
               for o in case.outputs if o.name in cot)  # fmt: skip
    assert isinstance(loss, torch.Tensor)
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return list(grads)


def _cotangents(case: OracleCase, outs: Sequence[torch.Tensor], differentiated: Sequence[int]) -> dict:
    """Seeded random output gradients in each output's dtype (what autograd hands the op's backward)."""
    cot = {}
    for i in differentiated:
        gen = torch.Generator().manual_seed(zlib.crc32(case.outputs[i].name.encode()))
        cot[case.outputs[i].name] = torch.randn(outs[i].shape, generator=gen).to(outs[i].dtype).float()
    return cot


def check_grads(case: OracleCase, folder: Path, name: str, args: Sequence[torch.Tensor], tally: Any) -> None:
    """The op's input gradients for seeded output gradients against the oracle's."""
    from fusegen.codegen.files.ops import load_ops

    ops = load_ops(folder)
    differentiated = getattr(ops, "_DIFFERENTIATED_OUTPUTS", ())
    if not differentiated:
        return
    leaves = [a.detach().clone().requires_grad_(True) for a in args]
    outs = getattr(torch.ops.fusegen, name)(*leaves, **case.params)
    outs = outs if isinstance(outs, tuple | list) else (outs,)
    cot = _cotangents(case, outs, differentiated)
    loss = sum((outs[i].float() * cot[case.outputs[i].name]).sum() for i in differentiated)
    assert isinstance(loss, torch.Tensor)
    got = torch.autograd.grad(loss, leaves, allow_unused=True)
    g64, g32 = _oracle_grads(case, args, cot, torch.float64), _oracle_grads(case, args, cot, torch.float32)
    tally.grad_cases += 1
    for (n, dtype, _), g, w, w32 in zip(case.inputs, got, g64, g32, strict=True):
        if w is None or w32 is None or not bool(w.isfinite().all()):
            continue  # no path from the input, or no finite answer to hold the op to
        g = torch.zeros_like(w) if g is None else g.to(torch.float64)
        wrong, tol = grad_wrong(dtype, g, w, w32)
        tally.grad_elements += wrong.numel()
        if wrong.any():
            tally.wrong.append((_worst(n, g, w, w32, tol, wrong) + f"; called with {case.params}", case.text))


def grad_wrong(dtype: str, g: torch.Tensor, w: torch.Tensor,
               w32: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(wrong, tolerance) per element of the op's gradient `g` against float64 `w` (float32 `w32`)."""
    tol = GRAD_REL * w.abs().max() + 2 * UNIT[dtype] * w.abs() + 4 * (w32.double() - w).abs()
    stored = w.to(DTYPES[dtype]).double()  # the op returns it in the input's dtype: past its range, inf
    return ~(((g - w).abs() <= tol) | (~stored.isfinite() & (g == stored))), tol


def _worst(n: str, g: torch.Tensor, w: torch.Tensor, w32: torch.Tensor, tol: torch.Tensor,
           wrong: torch.Tensor) -> str:  # fmt: skip
    """One line on the worst flagged gradient element."""
    at = int(((g - w).abs() - tol).nan_to_num(float("inf")).flatten().argmax())
    idx = [int(i) for i in torch.unravel_index(torch.tensor(at), w.shape)]
    v = [float(t.flatten()[at]) for t in (g, w, w32, tol)]
    return (f"d{n}{idx}: op {v[0]:.6g}, oracle f64 {v[1]:.6g} (f32 {v[2]:.6g}), tol {v[3]:.3g}, max|d{n}| "
            f"{float(w.abs().max()):.3g}; {int(wrong.sum())} of {wrong.numel()} elements off")  # fmt: skip
