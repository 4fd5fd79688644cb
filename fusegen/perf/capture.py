"""Capture every kernel launch a host function makes on the interpreter, with its non-tensor arguments."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from fusegen.sim import Kernel, RunResult


@dataclass(frozen=True)
class Launch:
    """One launch: the kernel, its arguments (the scalars are the tile plan) and the interpreter's result."""

    kernel: Kernel
    grid: int
    args: tuple[Any, ...]
    result: RunResult

    @property
    def name(self) -> str:
        """The kernel function's name."""
        return self.kernel.fn.__name__

    @property
    def scalars(self) -> tuple[Any, ...]:
        """The non-tensor arguments, in order."""
        return tuple(a for a in self.args if not isinstance(a, torch.Tensor))


@contextlib.contextmanager
def launches(module: ModuleType) -> Iterator[list[Launch]]:
    """Within the block, every launch of a @nki.jit kernel of `module` is appended to the yielded list."""
    captured: list[Launch] = []
    kernels = [k for k in vars(module).values() if isinstance(k, Kernel)]
    for kernel in kernels:
        kernel.launch = _recording(kernel, captured)  # type: ignore[method-assign]
    try:
        yield captured
    finally:
        for kernel in kernels:
            del kernel.launch  # back to the class method


def _recording(kernel: Kernel, captured: list[Launch]) -> Any:
    """Kernel.launch that also records the launch."""
    launch = type(kernel).launch.__get__(kernel)

    def recorded(grid: int, args: tuple[Any, ...], kwargs: dict[str, Any], **options: Any) -> RunResult:
        result = launch(grid, args, kwargs, **options)
        captured.append(Launch(kernel, grid, (*args, *kwargs.values()), result))
        return result

    return recorded
