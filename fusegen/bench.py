"""`fusegen bench`: a kernel's latency measured on a Neuron device next to the cost model's prediction.

On a device the generated host function is compiled with `torch_neuronx.trace`, checked once against the
reference, then timed: `warmup` untimed calls, `iters` timed ones, p50/p99 of the wall clock per call (a
traced module takes and returns CPU tensors, so a call includes the host-device copies: an upper bound
on the kernel's own time). Each measurement is appended to the calibration file (fusegen/calibration.py)
that `fusegen explain` reads. Without a device the command prints the modelled figures and says so.
The device path follows AWS's documented APIs but has not been run on hardware yet (docs/hardware.md).
"""

from __future__ import annotations

import functools
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fusegen import calibration, modes
from fusegen.calibration import Measurement
from fusegen.codegen.build import BuildOptions, plan_shape
from fusegen.codegen.commands import build_and_warn
from fusegen.codegen.files.tests import test_case
from fusegen.codegen.output import write_atomically
from fusegen.codegen.range_errors import spec_ranges
from fusegen.dsl import load_spec
from fusegen.jsonout import document, emit
from fusegen.perf.analysis import analyse, dims_text
from fusegen.perf.explain import _dims as spec_dims  # --shape checked, else the first check line
from fusegen.testing import Case, compare, load_generated, make_inputs

#: default warm-up and timed calls (nki-samples' benchmarks use warmup=5, iters=10; more iterations make
#: p99 mean something)
WARMUP, ITERS = 10, 100
METHOD = "torch_neuronx.trace, wall clock per call (host-device copies included)"
#: (generated folder, kernel name, case, target, lnc, warmup, iters) -> the measurement
Measure = Callable[[Path, str, Case, str, int, int, int], Measurement]


class BenchError(Exception):
    """The kernel ran on the device but its outputs differ from the reference: no latency is recorded."""


def measure_on_device(folder: Path, name: str, case: Case, target: str, lnc: int, warmup: int,
                      iters: int) -> Measurement:  # fmt: skip
    """Compile the host function with torch_neuronx.trace, check it once against the reference, time it."""
    kernel = modes.load_kernel(folder / "kernel.py", "device", target)
    args = tuple(make_inputs(case.inputs, case.shapes))
    try:
        host = functools.partial(getattr(kernel, name), lnc=lnc, target=target)
        traced = modes.trace(host, args, target, lnc)
    except Exception as err:  # the compiler's verdict on this kernel: a failure to report, not a fusegen bug
        raise BenchError(f"compiling {name} for the device failed: {type(err).__name__}: {err}") from err
    want = getattr(load_generated(folder / "reference.py"), f"{name}_reference")(*args)
    report = compare(traced(*args), want, case.outputs, f"{name} [{dims_text(case.dims)}] on the device:")
    if not report.ok:
        raise BenchError(report.text())
    times = modes.latencies_ns(lambda: traced(*args), warmup, iters)
    return calibration.summarize(times, warmup, METHOD)


def bench(spec: str, target: str, lnc: int, shape: dict[str, int] | None, warmup: int = WARMUP,
          iters: int = ITERS, path: Path | None = None, fmt: str = "text",
          measure: Measure | None = None) -> int:  # fmt: skip
    """Model `spec`'s kernel at `shape`; on a device (or with `measure`, e.g. a test's) also measure it and
    append the result to the calibration file `path` (default: calibration.default_path())."""
    dims = spec_dims(spec, shape)
    plan_shape(spec, dims, target, lnc)  # when nothing fits: the planner's message
    with spec_ranges(spec, dims):  # the model runs the kernel on the interpreter, on the test inputs
        modelled_ns = analyse(spec, dims, target, lnc, alternatives=False).modeled.time_ns
    ir, _ = load_spec(spec)
    why = modes.skip_reason("device", target, lnc) if measure is None else None
    result: dict[str, Any] = {"kernel": ir.name, "spec": spec, "target": target, "lnc": lnc, "dims": dims,
                              "modelled_ns": modelled_ns, "device": why is None, "reason": why,
                              "measured": None, "ratio": None, "calibration": None}  # fmt: skip
    if why is None:
        path = path or calibration.default_path()
        try:
            measured = _measure(spec, dims, target, lnc, warmup, iters, measure or measure_on_device)
        except BenchError as err:
            print(f"fusegen bench: {err}", file=sys.stderr)
            return 1
        calibration.append(path, calibration.record(ir.name, spec, ir.source_sha256, target, lnc, dims,
                                                    modelled_ns, measured))  # fmt: skip
        ratio = measured.p50_ns / modelled_ns
        result |= {"measured": asdict(measured), "ratio": ratio, "calibration": str(path)}
    if fmt == "json":
        emit(document("bench", True, **result))
    else:
        print(_text(result))
    return 0


def _measure(spec: str, dims: dict[str, int], target: str, lnc: int, warmup: int, iters: int,
             measure: Measure) -> Measurement:  # fmt: skip
    """Build the spec to a temporary folder and measure its kernel there."""
    with tempfile.TemporaryDirectory(prefix="fusegen-bench-") as tmp:
        out = Path(tmp)
        built = build_and_warn(spec, BuildOptions(out, target, lnc))
        write_atomically(out, built.files)
        return measure(out / built.name, built.name, test_case(load_spec(spec)[0], dims), target, lnc, warmup,
                       iters)  # fmt: skip


def _text(r: dict[str, Any]) -> str:
    """The text report: modelled, then measured (or why not)."""
    lines = [f"{r['kernel']} at {dims_text(r['dims'])} on {r['target']}, LNC {r['lnc']}",
             f"  modelled  {r['modelled_ns'] / 1000:.1f} us (the cost model; `fusegen explain` says why)"]
    m = r["measured"]
    if m is None:
        lines.append(f"  measured  -: no Neuron device to measure on ({r['reason']}); the figures above are "
                     "modelled only")  # fmt: skip
        return "\n".join(lines)
    lines += [
        f"  measured  p50 {m['p50_ns'] / 1000:.1f} us, p99 {m['p99_ns'] / 1000:.1f} us, mean "
        f"{m['mean_ns'] / 1000:.1f} us, min {m['min_ns'] / 1000:.1f} us over {m['iters']} calls after "
        f"{m['warmup']} warm-up ({m['method']})",
        f"  measured/modelled {r['ratio']:.2f}x (p50); appended to {r['calibration']}",
    ]
    return "\n".join(lines)
