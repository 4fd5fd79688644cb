"""Kernel launch: @nki.jit objects, program instances in threads, shared HBM, core barriers."""

from __future__ import annotations

import contextlib
import functools
import gc
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .barrier import CoreBarrier, worker
from .conformance import DEFAULT_RULES, check_arguments, check_kernel, check_launch, check_mode
from .context import Context, set_current
from .errors import (
    BarrierError,
    SimError,
    UninitializedReadError,
    UninitializedReadWarning,
    instruction_failure,
)
from .instr import unwritten_count
from .liveness import check_instance
from .memory import Alloc, MemoryRegion, contiguous_strides
from .pool import StoragePool
from .race import RaceTracker
from .targets import Target, get_target
from .tensor import NkiTensor
from .trace import Trace

# GIL switch interval during a launch (Python's default: 0.005): how long the thread running GEMMs off the
# turn waits at most for the GIL (held by the other instance's Python) after each torch call; 0.2 ms
# blocked the instance threads about half as long as 1 ms (docs/performance.md, fifth pass)
_SWITCH_INTERVAL_S = 0.0002


@dataclass
class RunResult:
    """Outputs, trace and per-instance statistics of one launch."""

    outputs: Any
    trace: Trace
    stats: dict[str, Any] = field(default_factory=dict)


class Launch:
    """One kernel launch over `grid` program instances sharing HBM."""

    def __init__(self, grid: int, target: Target, strict: bool, rules_error: bool = True) -> None:
        self.grid = grid
        self.target = target
        self.strict = strict
        self.rules_error = rules_error
        self.barrier = CoreBarrier(grid)
        self.contexts = [Context(core, self) for core in range(grid)]
        self.shared: list[Alloc] = []
        self.trackers: list[RaceTracker] = []
        self.pool = StoragePool()
        self.lock = threading.Lock()
        # uninitialized shared-HBM reads as (core, error), raised if no race explains them
        self.deferred: list[tuple[int, SimError]] = []
        self.errors: list[tuple[int, BaseException]] = []
        self.stop_above = grid  # cores above this index stop at their next instruction (one failed)

    def hbm_input(self, tensor: torch.Tensor, name: str, site: tuple[str, int]) -> NkiTensor:
        """A caller tensor as shared HBM (copy on write; written back after the run if written)."""
        alloc = Alloc(
            tuple(tensor.shape), tensor.dtype, MemoryRegion.shared_hbm, name, site, self.pool, source=tensor
        )
        self._track(alloc)
        return NkiTensor.whole(alloc)

    def shared_alloc(
        self, ctx: Context, shape: tuple[int, ...], dtype: torch.dtype, name: str, site: tuple[str, int]
    ) -> Alloc:
        """The n-th shared_hbm allocation of every instance is the same tensor."""
        index = ctx.shared_count
        ctx.shared_count += 1
        with self.lock:
            if index == len(self.shared):
                alloc = Alloc(shape, dtype, MemoryRegion.shared_hbm, name, site, self.pool)
                self._track(alloc)
                self.shared.append(alloc)
            alloc = self.shared[index]
        if (alloc.shape, alloc.dtype) != (shape, dtype):
            raise SimError(
                f"{site[0]}:{site[1]}: ndarray: shared_hbm allocation #{index} is {shape} "
                f"{dtype} on core {ctx.core} but {alloc.shape} {alloc.dtype} on another core"
            )
        return alloc

    def _track(self, alloc: Alloc) -> None:
        """Shared tensors of multi-core launches get race tracking."""
        if self.grid > 1:
            alloc.race = RaceTracker(alloc.numel, self.grid)
            self.trackers.append(alloc.race)

    def run(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> RunResult:
        """Execute every instance, then collect outputs, trace and statistics."""
        site = (fn.__code__.co_filename, fn.__code__.co_firstlineno)
        args = tuple(_to_hbm(self, a, f"arg{i}", site) for i, a in enumerate(args))
        kwargs = {k: _to_hbm(self, v, k, site) for k, v in kwargs.items()}
        results: list[Any] = [None] * self.grid
        modes = _torch_modes()  # thread-local: the caller's, carried into every instance's thread

        def body(core: int) -> None:
            """Run one instance on the current thread, recording its result or error."""
            ctx = self.contexts[core]
            set_current(ctx)
            torch.set_num_threads(1)  # per thread: worker threads keep their own OpenMP/MKL setting
            self.barrier.turn.acquire()
            try:
                with modes():
                    results[core] = fn(*args, **kwargs)
                ctx.matmuls.flush()
                self.barrier.finish(core)
            except BaseException as exc:
                self.fail(core, exc)
            finally:
                self.barrier.turn.release()
                set_current(None)

        done = [worker(core).submit(body, core) for core in range(1, self.grid)]
        body(0)
        for event in done:
            event.wait()
        self._raise_first()
        stats = {
            "grid": self.grid,
            "target": self.target.name,
            "cores": [check_instance(ctx) for ctx in self.contexts],
        }
        outputs = _outputs(results[0], site, self.strict)
        self._write_back(args, kwargs)
        rows = [r for ctx in self.contexts for r in ctx.records]
        return RunResult(outputs, Trace(rows=rows), stats)

    def close(self) -> None:
        """Free pooled storage and break the launch <-> context cycle (no cyclic GC pass needed)."""
        self.pool.close()
        self.contexts = []
        for tracker in self.trackers:
            tracker.release()

    def fail(self, core: int, exc: BaseException) -> None:
        """Record an instance's exception; stop the higher cores and release barrier waiters.

        Lower cores run on, so the reported error is the lowest failing core's, whatever the timing.
        """
        self.errors.append((core, exc))
        self.stop_above = min(self.stop_above, core)
        self.barrier.abort(f"core {core} failed: {type(exc).__name__}")

    def _raise_first(self) -> None:
        """Re-raise the lowest core's primary (non-barrier) error, else a deferred uninitialized read."""
        primary = sorted((e for e in self.errors if not isinstance(e[1], BarrierError)), key=lambda e: e[0])
        first = primary or sorted(self.errors, key=lambda e: e[0])
        if first:
            raise first[0][1]
        if self.deferred:
            raise min(self.deferred, key=lambda e: e[0])[1]

    @staticmethod
    def _write_back(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Inputs the kernel wrote are copied back to the caller's tensors (like nki.simulate)."""
        for a in [*args, *kwargs.values()]:
            if isinstance(a, NkiTensor) and a.alloc.dirty and a.alloc.source is not None:
                a.alloc.source.copy_(a.materialize())  # through the caller's strides and offset


class _QuietRuntime:
    """One torch thread per instance, no cyclic GC and a short GIL switch interval while launches run
    (measured faster; docs/sim.md). The thread stacking operands and running GEMMs off the turn needs the
    GIL between its torch calls, and would otherwise wait up to the default 5 ms for the turn holder.

    These settings are process-wide (torch's count also sets the default new threads inherit) and launches
    may overlap on several threads, so the first launch to start saves them and the last to end restores
    them: saving per launch could capture another launch's quiet values and restore those for good. Left:
    a thread whose first torch work ran during another launch inherited that launch's count of 1; launching
    alone later, it saves and restores 1 (torch has no way to read the process default from a thread)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active = 0  # launches running
        self.torch_threads = 1
        self.gc_was_enabled = False
        self.switch_interval = 0.0

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        """Quiet while the block runs."""
        self._enter()
        try:
            yield
        finally:
            if self._leave():
                gc.collect(0)  # the launches' young objects: paid here, not by the caller's next statement

    def _enter(self) -> None:
        """Save the settings if no launch runs; the calling thread (instance 0) runs torch single-threaded."""
        with self.lock:
            if not self.active:
                self.torch_threads = torch.get_num_threads()
                self.gc_was_enabled = gc.isenabled()
                self.switch_interval = sys.getswitchinterval()
                gc.disable()
                sys.setswitchinterval(_SWITCH_INTERVAL_S)
            torch.set_num_threads(1)
            self.active += 1  # last: nothing above left a launch counted that never ran

    def _leave(self) -> bool:
        """Give the calling thread the saved torch count; restore the rest after the last launch. True if
        that re-enabled the cyclic GC."""
        with self.lock:
            self.active -= 1
            # the saved count, not the one this thread read on entering: a thread new to torch that enters
            # during another launch reads that launch's 1
            torch.set_num_threads(self.torch_threads)
            if self.active:
                return False
            sys.setswitchinterval(self.switch_interval)
            if self.gc_was_enabled:
                gc.enable()
            return self.gc_was_enabled


_quiet_runtime = _QuietRuntime()


def _torch_modes() -> Callable[[], contextlib.AbstractContextManager[None]]:
    """The calling thread's grad and inference modes, to enter on the instances' threads: tensors one
    instance makes under inference_mode (pooled tiles, shared HBM) are written by the others."""
    inference, grad = torch.is_inference_mode_enabled(), torch.is_grad_enabled()

    @contextlib.contextmanager
    def enter() -> Iterator[None]:
        with torch.inference_mode(inference), torch.set_grad_enabled(grad):
            yield

    return enter


def _to_hbm(launch: Launch, value: Any, name: str, site: tuple[str, int]) -> Any:
    """Tensors (torch or numpy) become shared HBM tensors; tuples are converted element-wise."""
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(value)
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            raise SimError(f"{site[0]}:{site[1]}: launch: no backend for device {value.device} (argument "
                           f"{name}): fusegen's interpreter runs CPU tensors")
        return launch.hbm_input(value, name, site)
    if isinstance(value, tuple | list):
        return tuple(_to_hbm(launch, v, f"{name}[{i}]", site) for i, v in enumerate(value))
    return value


def _outputs(value: Any, site: tuple[str, int], strict: bool) -> Any:
    """Returned shared_hbm tensors as torch tensors of their dtype."""
    if value is None or isinstance(value, int | float | str):
        return value
    if isinstance(value, tuple | list):
        return tuple(_outputs(v, site, strict) for v in value)
    if not isinstance(value, NkiTensor) or value.alloc.region is not MemoryRegion.shared_hbm:
        raise SimError(
            f"{site[0]}:{site[1]}: return: kernel outputs must be nl.shared_hbm tensors, got {value!r}"
        )
    if unwritten_count(value):
        detail = f"{site[0]}:{site[1]}: return: output {value.alloc.label()} has never-written elements"
        if strict:
            raise UninitializedReadError(detail)
        warnings.warn(detail, UninitializedReadWarning, stacklevel=4)
        value.alloc.poison_unwritten(value.key)
    alloc = value.alloc
    if not alloc.borrowed and value.key == (alloc.shape, contiguous_strides(alloc.shape), 0):
        return alloc.hand_over()  # the launch is over: no copy needed
    return value.materialize().clone()


class Kernel:
    """A @nki.jit kernel bound to an interpreter configuration; `k(args)` or `k[grid](args)`."""

    def __init__(
        self,
        fn: Callable[..., Any],
        target: str,
        strict: bool,
        options: dict[str, Any],
        rules: str = DEFAULT_RULES,
    ) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.target = target
        self.strict = strict
        self.rules = check_mode(rules)
        self.options = options
        self.last_run: RunResult | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Launch one program instance; returns the outputs."""
        return self.launch(1, args, kwargs).outputs

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        """`kernel[n]`: a launcher for n program instances (the LNC degree)."""
        return lambda *args, **kwargs: self.launch(_grid_size(grid), args, kwargs).outputs

    def launch(
        self,
        grid: int,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        target: str | None = None,
        strict: bool | None = None,
        rules: str | None = None,
    ) -> RunResult:
        """Run with `grid` instances; the result is also kept as `last_run`."""
        tgt = get_target(target or self.target)
        rules_error = check_mode(rules or self.rules) == "error"
        check_kernel(self.fn, rules_error)
        check_launch(tgt, grid, rules_error)
        check_arguments(self.fn, args, kwargs, rules_error)
        launch = Launch(grid, tgt, self.strict if strict is None else strict, rules_error)
        # cyclic GC stays paused until close(): the launch's garbage then goes by reference counting; the
        # caller's CPU autocast (thread-local: instance 0 runs here) must not make instructions' math bf16
        with _quiet_runtime(), torch.autocast("cpu", enabled=False):
            try:
                result = launch.run(self.fn, args, kwargs)
            except Exception as exc:
                failure = instruction_failure(exc)  # e.g. a torch error inside an instruction
                if failure is None:
                    raise
                raise failure from exc
            finally:
                launch.close()
        self.last_run = result
        return result


def _grid_size(grid: Any) -> int:
    """A launch grid: an int or a 1-tuple."""
    if isinstance(grid, tuple) and len(grid) == 1:
        grid = grid[0]
    if not isinstance(grid, int) or grid < 1:
        raise SimError(f"launch grid must be a positive int (LNC degree), got {grid!r}")
    return grid


def run(
    kernel: Kernel | Callable[..., Any],
    *args: Any,
    grid: int = 1,
    target: str | None = None,
    strict: bool | None = None,
    rules: str | None = None,
    **kwargs: Any,
) -> RunResult:
    """Launch `kernel` (a @nki.jit kernel or a plain function) and return outputs, trace and stats."""
    if not isinstance(kernel, Kernel):
        kernel = Kernel(kernel, target or "trn2", True if strict is None else strict, {})
    return kernel.launch(_grid_size(grid), args, kwargs, target=target, strict=strict, rules=rules)
