"""Running a generated kernel on the interpreter against its reference: inputs, tolerances, reports.

Used by the generated tests and by `fusegen check`. Tolerance follows nki-library's rule:
|out - ref| <= atol + rtol * max|ref|, per output, with rtol/atol by output dtype.
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

from fusegen.sim import load_module

TORCH_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
#: (rtol, atol) by output dtype: bf16 per nki-library; f32 outputs still pass through bf16 matmul inputs.
TOLERANCE = {torch.bfloat16: (2e-2, 1e-5), torch.float16: (1e-2, 1e-5), torch.float32: (1e-3, 1e-5)}


@dataclass(frozen=True)
class OutputCheck:
    """One output's worst error against its bound."""

    name: str
    dtype: torch.dtype
    max_error: float
    bound: float

    @property
    def ok(self) -> bool:
        """Within tolerance (and finite)."""
        return self.max_error <= self.bound


@dataclass(frozen=True)
class Report:
    """Every output's check for one run."""

    label: str
    outputs: tuple[OutputCheck, ...]

    @property
    def ok(self) -> bool:
        """All outputs within tolerance."""
        return all(o.ok for o in self.outputs)

    def text(self) -> str:
        """One line per output: max error against the bound."""
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
def _kernel_module(path: Path, target: str) -> ModuleType:
    return load_module(path, target=target)


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


def compare(got: Any, want: Any, names: tuple[str, ...], label: str) -> Report:
    """Check every output of `got` against `want` with the dtype's tolerance."""
    got_t = got if isinstance(got, tuple) else (got,)
    want_t = want if isinstance(want, tuple) else (want,)
    checks = []
    for name, g, w in zip(names, got_t, want_t, strict=True):
        rtol, atol = TOLERANCE[w.dtype]
        wf = w.float()
        error = (g.float() - wf).abs().max().item() if g.shape == w.shape else float("inf")
        bound = atol + rtol * wf.abs().max().item()
        checks.append(OutputCheck(name, w.dtype, error if error == error else float("inf"), bound))
    return Report(label, tuple(checks))


@dataclass(frozen=True)
class Case:
    """One run: the kernel's inputs (name, dtype, scale), its output names, concrete dims and shapes."""

    inputs: tuple[tuple[str, str, str], ...]
    outputs: tuple[str, ...]
    dims: dict[str, int]
    shapes: dict[str, tuple[int, ...]]


def run_against_reference(
    directory: Path, name: str, case: Case, lnc: int = 1, target: str = "trn2"
) -> Report:
    """Run `directory`/kernel.py's host function on the interpreter and compare with reference.py."""
    kernel = _kernel_module(directory / "kernel.py", target)
    reference = load_generated(directory / "reference.py")
    args = make_inputs(case.inputs, case.shapes)
    got = getattr(kernel, name)(*args, lnc=lnc, target=target)
    want = getattr(reference, f"{name}_reference")(*args)
    dims = " ".join(f"{k}={v}" for k, v in sorted(case.dims.items()))
    return compare(got, want, case.outputs, f"{name} [{dims}] {target} lnc={lnc}:")
