"""Where a generated kernel runs: one switch for the generated tests, `fusegen check` and ops.py.

`sim` (fusegen.sim, the default, always available), `nki-sim` (AWS's `nki.simulate`), `compile` (compile
only, through `torch_neuronx.trace` and neuronx-cc, no device needed) and `device` (a NeuronCore, through
`torch_neuronx.trace`, compared on the host with the reference). The switch is FUSEGEN_MODE, or pytest's
`--fusegen-mode` (fusegen/pytest_plugin.py sets FUSEGEN_MODE), or `fusegen check --mode`. A mode whose
packages or device are missing is skipped with `unavailable(mode)`'s reason. The `compile` and `device`
paths follow AWS's documented APIs but have not been run on hardware yet (docs/hardware.md).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import glob
import importlib
import importlib.util
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

MODES = ("sim", "nki-sim", "compile", "device")
DEFAULT = "sim"
ENV = "FUSEGEN_MODE"
#: modes in which kernels (and ops.py's op) run on CPU tensors in this process
CPU_MODES = ("sim", "nki-sim")
#: (distribution, module) each mode needs beyond fusegen's own dependencies
NEEDS = {
    "sim": (),
    "nki-sim": (("nki", "nki"),),
    "compile": (("nki", "nki"), ("torch-neuronx", "torch_neuronx"), ("neuronx-cc", "neuronxcc")),
    "device": (("nki", "nki"), ("torch-neuronx", "torch_neuronx"), ("neuronx-cc", "neuronxcc")),
}
#: the Neuron driver's device files (`ls /dev/neuron*` in AWS's container setup guide lists them)
DEVICE_GLOB = "/dev/neuron*"
INSTALL_HINT = "install the `neuron` extra from AWS's Neuron package index (docs/hardware.md)"


class ModeError(ValueError):
    """An unknown mode, or one that cannot run here (the message says why and what to do)."""


def selected(value: str | None = None) -> str:
    """The mode asked for: `value` if given, else FUSEGEN_MODE, else sim."""
    mode = value if value is not None else (os.environ.get(ENV) or DEFAULT)
    if mode not in MODES:
        where = "" if value is not None else f" (from {ENV})"
        raise ModeError(f"unknown mode `{mode}`{where}: choose one of {', '.join(MODES)}")
    return mode


def _importable(module: str) -> bool:
    """True if `module` is installed (fusegen.sim's stand-in `nki` does not count)."""
    loaded = sys.modules.get(module)
    if loaded is not None:
        return not getattr(loaded, "__fusegen_sim__", False)
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def devices() -> list[str]:
    """The Neuron device files on this host."""
    return sorted(glob.glob(DEVICE_GLOB))


def unavailable(mode: str) -> str | None:
    """Why `mode` cannot run here (missing packages, an `nki` without `simulate`, no device), or None."""
    missing = [dist for dist, module in NEEDS[mode] if not _importable(module)]
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        return f"mode {mode} needs {', '.join(missing)}, which {verb} not installed here: {INSTALL_HINT}"
    if mode == "nki-sim" and not hasattr(importlib.import_module("nki"), "simulate"):
        return "mode nki-sim needs nki.simulate, which this nki lacks (NKI 0.3.0 / Neuron SDK 2.29 or later)"
    if mode == "device" and not devices():
        return f"mode device found no Neuron device (no {DEVICE_GLOB}; `neuron-ls` lists the devices)"
    return None


def runtime_lnc(target: str) -> int:
    """The LNC the Neuron runtime runs: NEURON_LOGICAL_NC_CONFIG, else the target's default (trn2: 2)."""
    return int(os.environ.get("NEURON_LOGICAL_NC_CONFIG", "1" if target == "trn1" else "2"))


def skip_reason(mode: str, target: str = "trn2", lnc: int | None = None, op: bool = False) -> str | None:
    """Why a generated test cannot run in `mode` here, or None. lnc: the launch's LNC (a device runs only
    the runtime's); op: a test of ops.py's op, which runs on CPU tensors (sim, nki-sim) only."""
    if op and mode not in CPU_MODES:
        return f"the op's torch checks run on CPU tensors (sim, nki-sim); mode {mode} tests the kernel only"
    why = unavailable(mode)
    if why is None and mode == "device" and lnc is not None and lnc != runtime_lnc(target):
        why = (f"the Neuron runtime here runs LNC={runtime_lnc(target)} (NEURON_LOGICAL_NC_CONFIG); "
               f"set NEURON_LOGICAL_NC_CONFIG={lnc} to run the LNC={lnc} launch")  # fmt: skip
    return why


def cpu_mode() -> str:
    """The mode ops.py runs a CPU-tensor op in: sim or nki-sim; ModeError if FUSEGEN_MODE asks for another
    or for one that cannot run here."""
    mode = selected()
    if mode not in CPU_MODES:
        raise ModeError(f"{ENV}={mode}: an op on CPU tensors runs in sim or nki-sim mode; move the tensors "
                        f"to the Neuron device to run the NKI kernel there, or set {ENV}=sim")  # fmt: skip
    why = unavailable(mode)
    if why:
        raise ModeError(why)
    return mode


def jit_kernels(source: str) -> list[str]:
    """Names of the functions `source` decorates with `@nki.jit` (bare or called)."""
    from fusegen.sim.subset import parse  # run-time parses take turns across threads (subset.py)

    names = []
    for node in parse(source).body:
        if isinstance(node, ast.FunctionDef):
            for dec in node.decorator_list:
                dec = dec.func if isinstance(dec, ast.Call) else dec
                where = getattr(dec, "value", None)
                if isinstance(dec, ast.Attribute) and dec.attr == "jit" and getattr(where, "id", "") == "nki":
                    names.append(node.name)
    return names


@contextlib.contextmanager
def platform_target(target: str) -> Iterator[None]:
    """NEURON_PLATFORM_TARGET_OVERRIDE=target inside the block: AWS's simulator and compiler default to the
    host's chip (the simulator to trn3 on a host without one)."""
    name = "NEURON_PLATFORM_TARGET_OVERRIDE"
    saved = os.environ.get(name)
    os.environ[name] = target
    try:
        yield
    finally:
        if saved is None:
            del os.environ[name]
        else:
            os.environ[name] = saved


class Simulated:
    """An `@nki.jit` kernel run by AWS's CPU simulator: `kernel[lnc](...)` and `kernel(...)` launch
    `nki.simulate(kernel[lnc])(...)`, as AWS's simulator guide documents."""

    def __init__(self, kernel: Any, target: str, lnc: int | None = None) -> None:
        self.kernel, self.target, self.lnc = kernel, target, lnc

    def __getitem__(self, lnc: int) -> Simulated:
        return Simulated(self.kernel, self.target, lnc)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        nki = importlib.import_module("nki")
        kernel = self.kernel if self.lnc is None else self.kernel[self.lnc]
        with platform_target(self.target):
            return nki.simulate(kernel)(*args, **kwargs)


def _import(path: Path) -> ModuleType:
    """A generated file imported by path with whatever `nki` is installed."""
    spec = importlib.util.spec_from_file_location(f"_fusegen_mode_{path.parent.name}_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ModeError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_kernel(path: Path, mode: str, target: str = "trn2") -> ModuleType:
    """`path` (a generated kernel.py) for `mode`: under fusegen.sim (which then shadows an installed nki:
    the mode asks for it), or with the installed nki, its kernels under nki.simulate for nki-sim."""
    if mode == "sim":
        from fusegen.sim import load_module

        return load_module(path, target=target, force=True)
    module = _import(path)
    if mode == "nki-sim":
        for name in jit_kernels(path.read_text(encoding="utf-8")):
            setattr(module, name, Simulated(getattr(module, name), target))
    return module


def compiler_args(target: str, lnc: int) -> list[str]:
    """neuronx-cc options for `target` and `lnc` (`--logical-nc-config` exists on trn2 and later only)."""
    return ["--target", target] + ([] if target == "trn1" else ["--logical-nc-config", str(lnc)])


def trace(fn: Callable[..., Any], args: tuple[Any, ...], target: str, lnc: int, cpu_backend: bool = False,
          workdir: str | None = None) -> Any:  # fmt: skip
    """torch_neuronx.trace of `fn` at `args`: compiles the host function and its NKI kernels into one NEFF;
    cpu_backend: compile without a device (AWS documents it with `--target` in compiler_args)."""
    torch_neuronx = importlib.import_module("torch_neuronx")
    with platform_target(target):
        options = {"compiler_workdir": workdir, "compiler_args": compiler_args(target, lnc)}
        return torch_neuronx.trace(fn, args, **options, cpu_backend=cpu_backend)


def compile_error(fn: Callable[..., Any], args: tuple[Any, ...], target: str, lnc: int) -> str | None:
    """Compile `fn` at `args` without running it; the compiler's error (its last lines), or None."""
    try:
        trace(fn, args, target, lnc, cpu_backend=True)
    except Exception as err:  # any compiler failure is this kernel's result, collected, not raised
        lines = [line for line in str(err).strip().splitlines() if line.strip()]
        return f"{type(err).__name__}: {' | '.join(lines[-3:]) or 'no message'}"
    return None


def run(module: ModuleType, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], mode: str, target: str,
        lnc: int) -> Any:  # fmt: skip
    """The host function `name` of `module` (load_kernel's) on `args` in a running mode (not compile)."""
    fn = functools.partial(getattr(module, name), **kwargs, lnc=lnc, target=target)
    if mode == "device":
        return trace(fn, args, target, lnc)(*args)  # the traced module takes and returns CPU tensors
    return fn(*args)


def latencies_ns(fn: Callable[[], Any], warmup: int, iters: int) -> list[float]:
    """Wall-clock nanoseconds of `iters` calls of `fn` after `warmup` untimed ones (a traced Neuron module
    returns CPU tensors, so each call has finished when it returns)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter_ns()
        fn()
        times.append(float(time.perf_counter_ns() - start))
    return times
