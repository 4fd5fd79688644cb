"""Shared by the torch-boundary tests: every generated kernel, small legal dims, inputs, its entry points.

Kernels are found by listing generated/, so a new example is covered without touching the tests.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from types import ModuleType

import torch

from fusegen.codegen.files import ops as ops
from fusegen.dsl import load_spec
from fusegen.dsl.ir import KernelIR, eval_shape
from fusegen.sim import load_module
from fusegen.testing import TORCH_DTYPES

ROOT = Path(__file__).parents[2]
GENERATED = ROOT / "generated"
KERNELS = sorted(p.name for p in GENERATED.iterdir() if (p / "ops.py").is_file())
#: values tried for each free dim, smallest first: the rows get 3 (or `rows`), other dims the first legal
CANDIDATES = (3, 2, 1, 32, 64, 128, 256)


@functools.cache
def spec_ir(name: str) -> KernelIR:
    """The spec's own IR, from the spec the generated files name in their header."""
    header = (GENERATED / name / "kernel.py").read_text(encoding="utf-8").splitlines()[0]
    match = re.search(r" from (\S+\.spec) ", header)
    assert match, header
    return load_spec(str(ROOT / match.group(1)))[0]


def kernel(name: str, file: str = "kernel.py") -> ModuleType:
    """generated/<name>/<file> on the interpreter (one import per file)."""
    return _load(GENERATED / name / file)


@functools.cache
def _load(path: Path) -> ModuleType:
    return load_module(path)


def op(name: str) -> object:
    """torch.ops.fusegen.<name>, registered from this checkout's generated/."""
    ops.load_ops(name, GENERATED)
    return getattr(torch.ops.fusegen, name)


def row_dim(ir: KernelIR) -> str:
    """The dim of the first input's first axis: tokens / rows."""
    return ir.inputs[0].shape[0].symbols()[0]


def small_dims(ir: KernelIR, rows: int = 3) -> dict[str, int]:
    """Each free dim at the smallest candidate every `require` line allows (rows: `rows`)."""
    env = dict(ir.fixed_dims())
    for d in ir.dims:
        if d.value is None:
            tries = (rows,) if d.name == row_dim(ir) else CANDIDATES
            env[d.name] = next(v for v in tries if _allowed(ir, {**env, d.name: v}, d.name))
    return env


def _allowed(ir: KernelIR, env: dict[str, int], name: str) -> bool:
    """Every constraint whose dims are all chosen holds (the one being chosen included)."""
    chosen = [c for c in ir.constraints if name in c.expr.symbols() and set(c.expr.symbols()) <= set(env)]
    return all(c.holds(env) for c in chosen)


def inputs(ir: KernelIR, env: dict[str, int], seed: int = 0) -> list[torch.Tensor]:
    """Seeded N(0, 1/16) inputs in the spec's dtypes and shapes (small, to keep FFN activations tame)."""
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(eval_shape(i.shape, env), generator=gen) / 4).to(TORCH_DTYPES[i.dtype])
            for i in ir.inputs]  # fmt: skip


def as_tuple(value: object) -> tuple[torch.Tensor, ...]:
    """A host's or op's result as a tuple of tensors."""
    return tuple(value) if isinstance(value, tuple | list) else (value,)  # type: ignore[arg-type]


def trainable(name: str) -> bool:
    """Whether the op registers a backward (its family trains)."""
    return (GENERATED / name / "backward_reference.py").is_file()


def has_backward_kernel(name: str) -> bool:
    """Whether the backward runs as NKI kernels (backward_kernel.py)."""
    return (GENERATED / name / "backward_kernel.py").is_file()


def has_prep(name: str) -> bool:
    """Whether kernel.py has the weight-prep host `_fused_weight`."""
    return hasattr(kernel(name), "_fused_weight")
