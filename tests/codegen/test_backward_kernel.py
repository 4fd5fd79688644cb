"""The generated backward NKI kernels (generated/<name>/backward_kernel.py) on the interpreter, at every check
shape of the three Engram specs: against autograd through our independent gate_naive formula in fp64, and
against backward_reference.py (the backward IR as f32 torch code). TileKernels' metric and bar (1e-8)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import torch

from fusegen.dsl import load_spec
from fusegen.sim import load_module
from fusegen.testing import load_generated
from tests.codegen.test_autodiff import BAR, calc_diff, naive_grads

ROOT = Path(__file__).parents[2]
#: spec name -> whether its `out` adds the residual x
SPECS = {"engram_gate": True, "engram_gate_noresid": False, "engram_gate_hc8": False}
#: |s| below which a token's gradients are ill-conditioned in f32. The kernel recomputes s = Σ x·k·W·rx·rk
#: with an f32 sum whose error is absolute (~1e-6 of Σ|x·k·W|), and the signed square root's gradient
#: 1 / (2 sqrt|s|) carries it into that token's gradients with a relative error that grows like 1 / |s|.
#: A draw whose smallest |s| is below this gets the bar scaled by WELL_CONDITIONED / min|s| (measured:
#: T=4001, min|s| = 5.6e-5: 7.8e-8; HC=8 T=127, min|s| = 4.2e-6: 1.7e-7, where f32 autograd through
#: gate_naive itself reaches 2.6e-7); every other draw is held to TileKernels' 1e-8.
WELL_CONDITIONED = 1e-3


def cases() -> list[object]:
    """(spec, check index, lnc): every check at LNC 2; LNC 1 for engram_gate and the rebuilt-weights shape."""
    out = []
    for name in SPECS:
        checks = load_spec(str(ROOT / "examples" / f"{name}.spec"))[0].checks
        for i, check in enumerate(checks):
            env = check.env()
            label = "-".join(f"{k}{v}" for k, v in sorted(env.items()))
            lncs = (1, 2) if name == "engram_gate" or env.get("H") == 7168 else (2,)
            out += [pytest.param(name, i, lnc, id=f"{name}-{label}-lnc{lnc}") for lnc in lncs]
    return out


def generated(name: str, file: str, sim: bool = False) -> ModuleType:
    """A generated file of `name`, under the interpreter when `sim`."""
    path = ROOT / "generated" / name / file
    return load_module(path, target="trn2") if sim else load_generated(path)


def smallest_s(tensors: list[torch.Tensor]) -> float:
    """min |s| over tokens and heads, in fp64."""
    x, kv, w_h, w_e = (t.double() for t in tensors)
    k = kv[:, : x.shape[1]]
    rx, rk = (torch.rsqrt(t.square().mean(-1, keepdim=True) + 1e-20) for t in (x, k))
    return float(((x * rx * w_h) * (k * rk * w_e)).sum(-1).abs().min()) * x.shape[-1] ** -0.5


def bar_for(tensors: list[torch.Tensor]) -> float:
    """BAR, scaled up only for a draw with an ill-conditioned token (see WELL_CONDITIONED)."""
    return BAR * max(1.0, WELL_CONDITIONED / smallest_s(tensors))


def inputs(name: str, check: int) -> tuple[dict[str, int], list[torch.Tensor], torch.Tensor]:
    """The check's dims, bf16 x, kv, w_h, w_e and a bf16 grad_out."""
    ir = load_spec(str(ROOT / "examples" / f"{name}.spec"))[0]
    env = {**ir.fixed_dims(), **ir.checks[check].env()}
    t, hc, h = env["T"], env["HC"], env["H"]
    gen = torch.Generator().manual_seed(check)
    shapes = [(t, hc, h), (t, hc + 1, h), (hc, h), (hc, h)]
    tensors = [torch.randn(s, generator=gen).to(torch.bfloat16) for s in shapes]
    return env, tensors, torch.randn(t, hc, h, generator=gen).to(torch.bfloat16)


@pytest.mark.parametrize(("name", "check", "lnc"), cases())
def test_backward_kernel_matches_autograd_and_reference(name: str, check: int, lnc: int) -> None:
    _, tensors, grad_out = inputs(name, check)
    forward = getattr(generated(name, "reference.py"), f"{name}_reference")
    _, _, gate, rstd_x, rstd_k = forward(*tensors, save=True)  # the reference's saved tensors, as TileKernels
    saved = (*tensors, gate, rstd_x, rstd_k, grad_out)
    got = getattr(generated(name, "backward_kernel.py", sim=True), f"{name}_backward")(*saved, lnc=lnc)
    reference = getattr(generated(name, "backward_reference.py"), f"{name}_backward_reference")(*saved)
    naive = naive_grads([t.double() for t in tensors], grad_out.double(), resid=SPECS[name])
    assert [g.dtype for g in got] == [torch.float32] * 4
    assert [g.shape for g in got] == [t.shape for t in tensors]
    against_naive = [calc_diff(g, e) for g, e in zip(got, naive, strict=True)]
    assert max(against_naive) < bar_for(tensors), (smallest_s(tensors), against_naive)
    if smallest_s(tensors) >= WELL_CONDITIONED:  # else the f32 reference is no yardstick (1e-4 at HC=8 T=127)
        against_reference = [calc_diff(g, e) for g, e in zip(got, reference, strict=True)]
        assert max(against_reference) < BAR, against_reference


def test_zero_dot_and_clamped_tokens_get_no_gate_gradient() -> None:
    name = "engram_gate_noresid"
    _, (x, kv, w_h, w_e), grad_out = inputs(name, 0)
    x[:2].zero_()
    kv[:2, :4].zero_()
    x[:2, :, 0] = 1.0  # token 0: x ⟂ k, s == 0 exactly
    kv[:2, :4, 1] = 1.0
    x[1, :, 1] = 1e-9  # token 1: 0 < |s| < clamp (1e-9 rounds to a bf16 near it)
    tensors = [x, kv, w_h, w_e]
    forward = getattr(generated(name, "reference.py"), f"{name}_reference")
    _, _, gate, rstd_x, rstd_k = forward(*tensors, save=True)
    got = generated(name, "backward_kernel.py", sim=True).engram_gate_noresid_backward(
        *tensors, gate, rstd_x, rstd_k, grad_out, lnc=2
    )
    assert torch.count_nonzero(got[0][:2]) == 0 and torch.count_nonzero(got[1][:2, :4]) == 0
    assert torch.count_nonzero(got[1][:2, 4]) > 0  # v still gets the gate times grad_out
    naive = naive_grads([t.double() for t in tensors], grad_out.double(), resid=False)
    assert max(calc_diff(g, e) for g, e in zip(got, naive, strict=True)) < BAR
