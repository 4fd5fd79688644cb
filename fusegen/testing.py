"""Running a generated kernel against its reference in a mode (fusegen/modes.py): inputs, tolerances, reports.

Used by the generated tests and by `fusegen check`. Tolerance follows nki-library's rule:
|out - ref| <= atol + rtol * max|ref|, per output, with rtol/atol by output dtype and, for f32 outputs,
by whether a bf16/f16 rounding precedes them (the build decides and writes it into the generated test).
"""

from __future__ import annotations

import functools
import importlib.util
import zlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from fusegen import modes

#: (output name, rtol, atol)
Tolerance = tuple[str, float, float]
TORCH_DTYPES = {
    "bf16": torch.bfloat16,
    "f16": torch.float16,
    "f32": torch.float32,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}
#: (rtol, atol) by output dtype: bf16 per nki-library; f32 for outputs downstream of a bf16 rounding
#: (an FFN's `bf16(h) @ w2t`: measured ~7e-5 of max|ref|).
#: fp8 outputs: one step of the top binade relative to max|ref| (e4m3: 2**-3, e5m2: 2**-2), since the
#: kernel's f32 value and the reference's differ in evaluation order and may round to neighbouring codes
#: (tests/codegen/test_fp8.py checks the quantisation bit-exactly where the f32 value is exact).
TOLERANCE = {
    "bf16": (2e-2, 1e-5),
    "f16": (1e-2, 1e-5),
    "f32": (1e-3, 1e-5),
    "fp8_e4m3": (2**-3, 1e-5),
    "fp8_e5m2": (2**-2, 1e-5),
}
#: An f32 output that no bf16/f16 rounding precedes differs from its reference only by f32 evaluation
#: order (measured <= 2e-6 of max|ref| on the Engram gate's saved statistics), so it is held tighter.
F32_UNROUNDED = (1e-5, 1e-6)


def tolerance(dtype: str, rounded: bool) -> tuple[float, float]:
    """(rtol, atol) for an output of `dtype`; `rounded`: a bf16/f16 rounding precedes it."""
    return TOLERANCE[dtype] if dtype != "f32" or rounded else F32_UNROUNDED


@dataclass(frozen=True)
class OutputCheck:
    """One output's worst error against its bound."""

    name: str
    dtype: torch.dtype
    max_error: float
    bound: float

    @property
    def ok(self) -> bool:
        """Within tolerance (a non-finite value matched the reference's exactly: `_max_error`)."""
        return self.max_error <= self.bound


@dataclass(frozen=True)
class Report:
    """Every output's check for one run."""

    label: str
    outputs: tuple[OutputCheck, ...]
    #: compile mode: the compiler's error, if it failed (no outputs are compared)
    error: str | None = None
    compiled_only: bool = False

    @property
    def ok(self) -> bool:
        """All outputs within tolerance (compile mode: compiled)."""
        return self.error is None and all(o.ok for o in self.outputs)

    def text(self) -> str:
        """One line per output: max error against the bound (compile mode: one line, compiled or why not)."""
        if self.compiled_only:
            return f"{self.label} " + ("compiled" if self.error is None else f"compile FAILED: {self.error}")
        lines = []
        for o in self.outputs:
            verdict = "ok" if o.ok else "MISMATCH"
            dtype = str(o.dtype).removeprefix("torch.")
            lines.append(
                f"{self.label} {o.name} ({dtype}): max|out - ref| = {o.max_error:.3e}, "
                f"tolerance {o.bound:.3e}: {verdict}"
            )
        return "\n".join(lines)


def load_generated(path: Path) -> ModuleType:
    """Import a generated Python file (reference.py, test_<name>.py) by path, not through sys.path."""
    spec = importlib.util.spec_from_file_location(f"fusegen_gen_{zlib.crc32(str(path).encode())}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _kernel_module(path: Path, target: str, mode: str) -> ModuleType:
    return modes.load_kernel(path, mode, target)


def make_inputs(
    inputs: tuple[tuple[str, str, str], ...], shapes: dict[str, tuple[int, ...]]
) -> list[torch.Tensor]:
    """Seeded random inputs: N(0, 1), weights scaled by 1/sqrt(fan-in); the seed depends on name and shape."""
    tensors = []
    for name, dtype, scale in inputs:
        shape = shapes[name]
        gen = torch.Generator().manual_seed(zlib.crc32(f"{name}{shape}".encode()))
        value = torch.randn(shape, generator=gen)
        if scale == "fan_in":
            value = value / shape[0] ** 0.5
        tensors.append(value.to(TORCH_DTYPES[dtype]))
    return tensors


def compare(got: Any, want: Any, outputs: tuple[Tolerance, ...], label: str) -> Report:
    """Check every output of `got` against `want` within its (name, rtol, atol)."""
    got_t = got if isinstance(got, tuple) else (got,)
    want_t = want if isinstance(want, tuple) else (want,)
    checks = []
    for (name, rtol, atol), g, w in zip(outputs, got_t, want_t, strict=True):
        wf = w.float()
        finite = wf.isfinite()
        bound = atol + rtol * (wf[finite].abs().max().item() if finite.any() else 0.0)
        checks.append(OutputCheck(name, w.dtype, _max_error(g.float(), wf, finite), bound))
    return Report(label, tuple(checks))


def _max_error(got: torch.Tensor, want: torch.Tensor, finite: torch.Tensor) -> float:
    """max |got - want| where the reference is finite; inf for another shape, or where a non-finite value
    is not the same in both (a nan where the math gives nan, as `log` of a negative input, is the answer)."""
    if got.shape != want.shape:
        return float("inf")
    special = ~finite | ~got.isfinite()
    g, w = got[special], want[special]
    if not ((g == w) | (g.isnan() & w.isnan())).all():
        return float("inf")
    return (got[finite] - want[finite]).abs().max().item() if finite.any() else 0.0


@dataclass(frozen=True)
class Case:
    """One run: the kernel's inputs (name, dtype, scale), outputs with tolerances, concrete dims and shapes;
    save: also request the optional outputs."""

    inputs: tuple[tuple[str, str, str], ...]
    outputs: tuple[Tolerance, ...]
    dims: dict[str, int]
    shapes: dict[str, tuple[int, ...]]
    save: bool = False


def run_against_reference(
    directory: Path, name: str, case: Case, lnc: int = 1, target: str = "trn2", mode: str = "sim"
) -> Report:
    """Run `directory`/kernel.py's host function in `mode` and compare with reference.py (compile mode:
    compile it, and report the compiler's error if any). The caller checks modes.skip_reason first."""
    from fusegen.codegen.plan import check_lnc  # codegen imports this module: import when run
    from fusegen.sim.targets import get_target

    check_lnc(get_target(target), lnc)  # no LNC=2 launch on trn1: LNC exists on Trn2/Trn3 only
    kernel = _kernel_module(directory / "kernel.py", target, mode)
    args = tuple(make_inputs(case.inputs, case.shapes))
    save = {"save": True} if case.save else {}
    dims = " ".join(f"{k}={v}" for k, v in sorted(case.dims.items()))
    label = f"{name} [{dims}] {target} lnc={lnc}" + ("" if mode == "sim" else f" {mode}") + ":"
    if mode == "compile":
        host = functools.partial(getattr(kernel, name), **save, lnc=lnc, target=target)
        return Report(label, (), modes.compile_error(host, args, target, lnc), compiled_only=True)
    got = modes.run(kernel, name, args, save, mode, target, lnc)
    want = getattr(load_generated(directory / "reference.py"), f"{name}_reference")(*args, **save)
    return compare(got, want, case.outputs, label)
