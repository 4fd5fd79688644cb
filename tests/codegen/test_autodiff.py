"""The backward IR (codegen/autodiff.py) against torch.autograd through the forward reference, in fp64."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from fusegen.codegen.autodiff import RULES, backward_ir, grad_name
from fusegen.codegen.files.reference import reference_source
from fusegen.dsl import load_spec
from fusegen.dsl.ir import KernelIR, eval_shape

EXAMPLES = sorted(Path(__file__).parents[2].joinpath("examples").glob("*.spec"))
#: TileKernels' bar for calc_diff (kernels.md §1.8)
BAR = 1e-8


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """TileKernels' metric: 1 - 2 sum(xy) / sum(x^2 + y^2), in fp64."""
    x, y = x.double(), y.double()
    denom = (x * x + y * y).sum()
    return 0.0 if denom == 0 else float(1 - 2 * (x * y).sum() / denom)


def fp64_function(source: str, name: str) -> Callable[..., Any]:
    """Exec a generated reference with every dtype widened to fp64, so the comparison sees only the math."""
    fp8 = ("torch.float8_e4m3fn", "torch.float8_e5m2")
    for narrow in (".float()", "torch.bfloat16", "torch.float16", "torch.float32", *fp8):
        source = source.replace(narrow, ".double()" if narrow == ".float()" else "torch.float64")
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<{name}>", "exec"), namespace)  # our own generated code
    return namespace[name]


def small_env(ir: KernelIR, rng: random.Random) -> dict[str, int]:
    """Random small dims satisfying the spec's constraints (128 where a divisibility rule needs it)."""
    env = dict(ir.fixed_dims())
    for dim in ir.dims:
        if dim.value is None:
            for value in (rng.randint(2, 6), 128):
                trial = {**env, dim.name: value}
                known = [c for c in ir.constraints if set(c.expr.symbols()) <= set(trial)]
                if all(c.holds(trial) for c in known):
                    env = trial
                    break
    return env


def grads_both_ways(ir: KernelIR, inputs: list[torch.Tensor]) -> list[tuple[str, float]]:
    """(input, calc_diff) of the backward IR's gradients against autograd through the forward reference."""
    forward = fp64_function(reference_source(ir), f"{ir.name}_reference")
    back_ir = backward_ir(ir)
    backward = fp64_function(reference_source(back_ir), f"{back_ir.name}_reference")
    leaves = [t.clone().requires_grad_(True) for t in inputs]
    has_saved = any(o.optional for o in ir.outputs)
    outs = forward(*leaves, save=True) if has_saved else forward(*leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    named = dict(
        zip(
            [o.name for o in ir.outputs if not o.optional] + [o.name for o in ir.outputs if o.optional],
            outs,
            strict=True,
        )
    )
    required = [o.name for o in ir.outputs if not o.optional]
    seeds = [torch.randn_like(named[n]) for n in required]
    expected = torch.autograd.grad([named[n] for n in required], leaves, seeds, allow_unused=True)
    by_name = {
        **{d.name: t for d, t in zip(ir.inputs, inputs, strict=True)},
        **{n: named[n].detach() for n in named},
        **{grad_name(n): s for n, s in zip(required, seeds, strict=True)},
    }
    got = backward(*(by_name[d.name] for d in back_ir.inputs))
    got = got if isinstance(got, tuple) else (got,)
    return [
        (d.name, calc_diff(g, e if e is not None else torch.zeros_like(g)))
        for d, g, e in zip(ir.inputs, got, expected, strict=True)
    ]


def random_inputs(ir: KernelIR, env: dict[str, int], gen: torch.Generator) -> list[torch.Tensor]:
    """Standard normal fp64 inputs at `env`."""
    return [torch.randn(eval_shape(d.shape, env), dtype=torch.float64, generator=gen) for d in ir.inputs]


@pytest.mark.parametrize("spec", EXAMPLES, ids=lambda p: p.stem)
@pytest.mark.parametrize("seed", [0, 1])
def test_backward_matches_autograd(spec: Path, seed: int) -> None:
    ir, _ = load_spec(str(spec))
    env = small_env(ir, random.Random(seed))
    inputs = random_inputs(ir, env, torch.Generator().manual_seed(seed))
    diffs = grads_both_ways(ir, inputs)
    assert all(d < BAR for _, d in diffs), (env, diffs)


def gate_naive(
    x: torch.Tensor, k: torch.Tensor, w_h: torch.Tensor, w_e: torch.Tensor, eps: float, clamp: float
) -> torch.Tensor:
    """Our copy of the seed's gate_naive (shared/seeds/engram_gate_shapes.py), in the inputs' dtype."""
    rstd_x = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    rstd_k = torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + eps)
    dot = (x * rstd_x * w_h * k * rstd_k * w_e).sum(-1) * x.shape[-1] ** -0.5
    return (dot.abs().clamp_min(clamp).sqrt() * dot.sign()).sigmoid().unsqueeze(-1)


def naive_grads(inputs: list[torch.Tensor], grad_out: torch.Tensor, resid: bool) -> list[torch.Tensor]:
    """Autograd through gate_naive: out = [x +] gate * v, v = kv[:, HC] shared by the heads."""
    x, kv, w_h, w_e = (t.clone().requires_grad_(True) for t in inputs)
    hc = x.shape[1]
    out = gate_naive(x, kv[:, :hc], w_h, w_e, 1e-20, 1e-6) * kv[:, hc:]
    return list(torch.autograd.grad(out + x if resid else out, (x, kv, w_h, w_e), grad_out))


def backward_fp64(ir: KernelIR, inputs: list[torch.Tensor], grad_out: torch.Tensor) -> list[torch.Tensor]:
    """The backward reference in fp64, fed the fp64 forward's saved tensors."""
    _, *saved = fp64_function(reference_source(ir), f"{ir.name}_reference")(*inputs, save=True)
    back_ir = backward_ir(ir)
    names = {o.name: t for o, t in zip([o for o in ir.outputs if o.optional], saved, strict=True)}
    by_name = {d.name: t for d, t in zip(ir.inputs, inputs, strict=True)} | names
    by_name[grad_name("out")] = grad_out
    return list(
        fp64_function(reference_source(back_ir), f"{back_ir.name}_reference")(
            *(by_name[d.name] for d in back_ir.inputs)
        )
    )


ENGRAM = Path(__file__).parents[2] / "examples" / "engram_gate.spec"


@pytest.mark.parametrize("check", range(5), ids=lambda i: f"check{i}")
def test_engram_backward_matches_gate_naive_at_check_shapes(check: int) -> None:
    ir, _ = load_spec(str(ENGRAM))
    env = ir.checks[check].env()
    gen = torch.Generator().manual_seed(check)
    inputs = random_inputs(ir, env, gen)
    grad_out = torch.randn(eval_shape(ir.outputs[0].shape, env), dtype=torch.float64, generator=gen)
    got = backward_fp64(ir, inputs, grad_out)
    diffs = [calc_diff(g, e) for g, e in zip(got, naive_grads(inputs, grad_out, resid=True), strict=True)]
    assert max(diffs) < BAR, (env, diffs)


def test_engram_clamp_region_and_zero_dot_have_zero_gate_gradient() -> None:
    ir, _ = load_spec(str(ENGRAM.with_name("engram_gate_noresid.spec")))
    env = {"T": 4, "HC": 2, "H": 128}
    x, kv, w_h, w_e = random_inputs(ir, env, torch.Generator().manual_seed(7))
    w_h.fill_(1.0)
    w_e.fill_(1.0)
    x[:2].zero_()
    kv[:2, :2].zero_()
    x[:2, :, 0] = 1.0  # token 0: x ⟂ k, s == 0 exactly
    kv[:2, :2, 1] = 1.0
    x[1, :, 1] = 1e-9  # token 1: 0 < |s| < clamp
    inputs = [x, kv, w_h, w_e]
    grad_out = torch.randn(eval_shape(ir.outputs[0].shape, env), dtype=torch.float64)
    got = backward_fp64(ir, inputs, grad_out)
    expected = naive_grads(inputs, grad_out, resid=False)
    assert max(calc_diff(g, e) for g, e in zip(got, expected, strict=True)) < BAR
    assert torch.count_nonzero(got[0][:2]) == 0 and torch.count_nonzero(got[1][:2, :2]) == 0
    assert torch.count_nonzero(got[1][:2, 2]) > 0  # v still gets the gate times grad_out


#: ops no example spec uses: where, tanh, div, exp, neg, minimum, clamp, max, sqrt, mean, rmsnorm on f32
MISC_SPEC = """kernel misc
dim R, K
input x: f32[R, K]
input y: f32[R, K]
input b: bf16[K]
param eps = 1e-6
output o: f32[R, K]
output m: f32[R, 1]
a = where(x > y, tanh(x) / (y * y + 1), exp(-x) - minimum(x, y))
c = clamp(a, min=-0.5, max=0.5) + max(x * b, axis=-1, keepdim=true) + sqrt(abs(y) + eps)
o = c * sigmoid(mean(a, axis=1, keepdim=true)) + sum(x, axis=-1, keepdim=true) ** 2.0 / K
m = max(a, axis=1, keepdim=true) + sum(rmsnorm(x, eps) * y, axis=1, keepdim=true)
check R=3 K=5
"""


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_backward_of_the_remaining_ops(seed: int, tmp_path: Path) -> None:
    path = tmp_path / "misc.spec"
    path.write_text(MISC_SPEC)
    ir, _ = load_spec(str(path))
    env = {"R": 3 + seed, "K": 5}
    diffs = grads_both_ways(ir, random_inputs(ir, env, torch.Generator().manual_seed(seed)))
    assert all(d < BAR for _, d in diffs), diffs


def test_every_rule_is_exercised(tmp_path: Path) -> None:
    path = tmp_path / "misc.spec"
    path.write_text(MISC_SPEC)
    used = {n.op for spec in [*EXAMPLES, path] for n in load_spec(str(spec))[0].nodes}
    untested = set(RULES) - used - {"lt", "le", "ge", "eq", "ne"}  # comparisons: no gradient, like `gt`
    assert not untested, untested
