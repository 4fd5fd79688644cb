"""Every kernel file under generated/ runs under rules='error' (every documented rule of fusegen/sim/rules.py
is an error) at each check shape of its spec, on trn2 and trn1, through its host functions: the forward kernel
(with its optional outputs), fused_weight where there is one, and the backward host (backward kernel and its
reduce kernel) fed the reference's saved tensors. Outputs are not compared here (the generated tests do that);
only conformance is.

"""

from __future__ import annotations

import functools
import inspect
import math
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

import fusegen.sim as sim
from fusegen.testing import load_generated, make_inputs

GENERATED = Path(__file__).resolve().parents[2] / "generated"
#: target -> the LNC degree the host is asked for (None: its default, LNC=2; trn1 has no LNC)
TARGETS = {"trn2": None, "trn1": 1}

def _specs() -> list[str]:
    return sorted(p.name for p in GENERATED.iterdir() if (p / "kernel.py").exists())


@functools.cache
def _test_module(spec: str) -> ModuleType:
    return load_generated(GENERATED / spec / f"test_{spec}.py")


@functools.cache
def _kernels(spec: str, file: str, target: str) -> ModuleType:
    return sim.load_module(GENERATED / spec / file, target=target, rules="error")


#: the FFN backward's kernels (ffn_gemms.py.jinja, ffn_backward.py.jinja), all launched by its host
FFN_BACKWARD_KERNELS = (r"_token_gemm_kernel|_add_cores_kernel|_transpose_kernel|_row_gemm_kernel"
                        r"|_ew\d+_kernel")
#: a backward whose inputs pass this many elements is skipped: an FFN backward's f32 weight gradients and
#: per-core partials at K=4096 I=14336 hold ~1 GB on the interpreter (~2 min); the same kernels run at the
#: smaller checks
BACKWARD_ELEMENTS = 2**24


def _roles(spec: str) -> list[str]:
    roles = ["forward"]
    if "def _fused_weight(" in (GENERATED / spec / "kernel.py").read_text():
        roles.append("fused_weight")
    if (GENERATED / spec / "backward_kernel.py").exists():
        roles.append("backward")
    return roles


def _planned_targets(spec: str, role: str) -> list[str]:
    """The targets the role's host plans for (its signature's `targets=`): fp8_e4m3 kernels are trn2-only."""
    file = "backward_kernel.py" if role == "backward" else "kernel.py"
    found = re.search(r"^    targets=\((.*)\),$", (GENERATED / spec / file).read_text(), re.M)
    return [t for t in TARGETS if found is None or f"'{t}'" in found.group(1)]


def cases() -> list[Any]:
    out = []
    for spec in _specs():
        checks = [p for p in _test_module(spec).SHAPES if p.id.startswith("check-")]
        for role in _roles(spec):
            for target in _planned_targets(spec, role):
                for check in checks:
                    shapes = _test_module(spec).input_shapes(check.values[0]).values()
                    if role == "backward" and max(math.prod(s) for s in shapes) > BACKWARD_ELEMENTS:
                        continue
                    out.append(
                        pytest.param(
                            spec,
                            role,
                            target,
                            check.values[0],
                            id=f"{spec}-{role}-{target}-{check.id}",
                        )
                    )
    return out


def _call(host: Any, named: dict[str, torch.Tensor], target: str) -> Any:
    """Call a host function with the tensors its parameters name (defaults for the rest)."""
    params = inspect.signature(host).parameters
    args = {name: named[name] for name, p in params.items() if p.default is inspect.Parameter.empty}
    if "save" in params:
        args["save"] = True
    if TARGETS[target] is not None:
        args["lnc"] = TARGETS[target]
    return host(**args, target=target)


@pytest.mark.parametrize(("spec", "role", "target", "dims"), cases())
def test_generated_kernel_conforms(spec: str, role: str, target: str, dims: dict[str, int]) -> None:
    test = _test_module(spec)
    tensors = make_inputs(test.INPUTS, test.input_shapes(dims))
    named = {name: t for (name, _, _), t in zip(test.INPUTS, tensors, strict=True)}
    if role == "forward":
        _call(getattr(_kernels(spec, "kernel.py", target), spec), named, target)
    elif role == "fused_weight":
        _call(_kernels(spec, "kernel.py", target)._fused_weight, named, target)
    else:
        reference = load_generated(GENERATED / spec / "reference.py")
        forward = getattr(reference, f"{spec}_reference")
        saves = "save" in inspect.signature(forward).parameters  # the FFN family saves nothing
        saved = forward(*tensors, save=True) if saves else forward(*tensors)
        saved = saved if isinstance(saved, tuple) else (saved,)
        outputs = {name: t for (name, _, _), t in zip(test.OUTPUTS, saved, strict=True)}
        gen = torch.Generator().manual_seed(1)
        grads = {f"d_{n}": torch.randn(t.shape, generator=gen).to(t.dtype) for n, t in outputs.items()}
        named = {**named, **outputs, **grads}
        _call(getattr(_kernels(spec, "backward_kernel.py", target), f"{spec}_backward"), named, target)


def test_the_roles_reach_every_kernel_under_generated() -> None:
    """Each @nki.jit function of generated/ is one the roles above launch (a new kind needs a new role)."""
    for spec in _specs():
        reached = {
            f"{spec}_kernel",
            "_fused_weight_kernel",
            f"{spec}_backward_kernel",
            f"{spec}_backward_reduce_kernel",
        }
        for file in ("kernel.py", "backward_kernel.py"):
            path = GENERATED / spec / file
            if path.exists():
                kernels = re.findall(r"^@nki\.jit\s*\ndef (\w+)", path.read_text(), flags=re.MULTILINE)
                kernels = [k for k in kernels if not re.fullmatch(FFN_BACKWARD_KERNELS, k)]
                assert kernels or file == "backward_kernel.py", path
                assert set(kernels) <= reached, (path, kernels)
