"""Run a spec's generated kernel on the interpreter at one shape and model it: schedule, roofline, plans."""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from fusegen import sim
from fusegen.codegen.build import BuildOptions, select_family
from fusegen.codegen.commands import build_and_warn
from fusegen.codegen.family import Family
from fusegen.codegen.files.tests import test_case
from fusegen.codegen.output import write_atomically
from fusegen.codegen.plan import PlanError, TilePlan
from fusegen.codegen.rewrites import rewrite
from fusegen.dsl import load_spec
from fusegen.dsl.ir import CheckShape, KernelIR
from fusegen.perf.capture import Launch, launches
from fusegen.perf.roofline import Roofline, hbm_bytes_moved, matmul_flops, roofline, spec_flops
from fusegen.perf.schedule import Schedule, schedule
from fusegen.sim import RunResult
from fusegen.testing import make_inputs

#: runner-up plans `explain` shows
ALTERNATIVES = 5


def progress(message: str) -> None:
    """A progress line on stderr (interpreter runs take seconds)."""
    print(f"fusegen: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Modeled:
    """One interpreter run of a kernel, scheduled."""

    launches: tuple[Launch, ...]
    schedules: tuple[tuple[str, Schedule], ...]
    roof: Roofline
    hbm_moved: int

    @property
    def time_ns(self) -> float:
        """Modelled time of all launches, one after another."""
        return sum(s.time_ns for _, s in self.schedules)

    @property
    def instructions(self) -> int:
        """Records scheduled."""
        return sum(len(s.spans) for _, s in self.schedules)


@dataclass(frozen=True)
class Alternative:
    """A runner-up plan: the planner's modelled time and, when it could be run, the trace-modelled time."""

    plan: TilePlan
    trace_ns: float | None


@dataclass(frozen=True)
class Analysis:
    """Everything `fusegen explain` reports for one spec at one shape."""

    name: str
    family: str
    dims: dict[str, int]
    target: str
    lnc: int
    plan: TilePlan | None
    plan_note: str
    modeled: Modeled
    alternatives: tuple[Alternative, ...]
    alternatives_note: str


def model_launches(
    found: list[Launch], target: str, lnc: int, min_hbm_bytes: int, flops: float | None = None
) -> Modeled:
    """Schedule every captured launch and compare the whole with the roofline (its PE side: `flops`, the
    spec's math, where given, else every matmul the trace ran)."""
    tgt = sim.get_target(target)
    schedules = tuple((launch.name, schedule(launch.result.trace, tgt)) for launch in found)
    records = [rec for launch in found for rec in launch.result.trace]
    traced, fp32 = matmul_flops(records)
    flops = traced if flops is None else flops
    return Modeled(
        tuple(found), schedules, roofline(tgt, lnc, flops, min_hbm_bytes, fp32), hbm_bytes_moved(records)
    )


def tensor_bytes(values: Any) -> int:
    """Bytes of every tensor in `values` (a tensor or a tuple of them)."""
    items = values if isinstance(values, tuple | list) else (values,)
    return sum(t.numel() * t.element_size() for t in items if isinstance(t, torch.Tensor))


def analyse(spec: str, dims: dict[str, int], target: str, lnc: int, alternatives: bool = True) -> Analysis:
    """Build `spec` to a temporary directory, run its host function at `dims`, model what ran."""
    with tempfile.TemporaryDirectory(prefix="fusegen-explain-") as tmp:
        out = Path(tmp)
        built = build_and_warn(spec, BuildOptions(out, target, lnc))
        write_atomically(out, built.files)
        kernels = sim.load_module(out / built.name / "kernel.py", target=target, force=True)
    spec_ir = load_spec(spec)[0]
    case = test_case(spec_ir, dims)
    args = make_inputs(case.inputs, case.shapes)
    progress(f"running {built.name} at {dims_text(dims)} on the interpreter ({target}, LNC {lnc})")
    with launches(kernels) as found:
        outputs = getattr(kernels, built.name)(*args, lnc=lnc, target=target)
    progress(f"scheduling {sum(len(f.result.trace) for f in found)} instructions")
    flops = spec_flops(spec_ir, {**spec_ir.fixed_dims(), **dims})
    modeled = model_launches(found, target, lnc, tensor_bytes(args) + tensor_bytes(outputs), flops)
    family, ir, match = _family(spec)
    plan, plan_note = _plan_at(family, ir, match, dims, target, lnc)
    host = getattr(kernels, built.name)
    replan = _replanned(kernels, lambda: host(*args, lnc=lnc, target=target))
    alts, alts_note = (
        _alternatives(family, ir, match, dims, target, lnc, plan, found, replan) if alternatives else ((), "")
    )
    return Analysis(built.name, family.name, dims, target, lnc, plan, plan_note, modeled, alts, alts_note)


def dims_text(dims: dict[str, int]) -> str:
    """`R=256 K=1280` form."""
    return " ".join(f"{k}={v}" for k, v in sorted(dims.items()))


def _family(spec: str) -> tuple[Family, KernelIR, Any]:
    """The family matching the rewritten spec, as `fusegen build` selects it."""
    ir = rewrite(load_spec(spec)[0])
    family, match = select_family(ir, Path(spec).read_text(encoding="utf-8", errors="replace"))
    return family, ir, match


def _plan_at(family: Family, ir: KernelIR, match: Any, dims: dict[str, int], target: str,
             lnc: int) -> tuple[TilePlan | None, str]:  # fmt: skip
    """The family's plan at `dims` (its plans() plans the check lines, so ask with one made of `dims`)."""
    span = ir.checks[0].span if ir.checks else ir.outputs[0].span
    at = dataclasses.replace(ir, checks=(CheckShape(tuple(sorted(dims.items())), span),))
    try:
        return family.plans(at, match, target, lnc)[0], ""
    except PlanError as err:
        return None, f"no tile plan: {err}"


def _alternatives(
    family: Family, ir: KernelIR, match: Any, dims: dict[str, int], target: str, lnc: int,
    chosen: TilePlan | None, found: list[Launch], replan: Callable[[TilePlan], RunResult],
) -> tuple[tuple[Alternative, ...], str]:  # fmt: skip
    """The planner's runner-up plans, each also run on the interpreter (through the host function, which
    lays its arguments out for the plan) when the one launch it made ends with the chosen plan's tiles."""
    ranked = _candidates(family, ir, match, dims, target, lnc)
    if not ranked or chosen is None:
        return (), f"the {family.name} planner offers no alternative plans (it does not rank plans)"
    runnable = len(found) == 1 and _tile_args(found[0], chosen)
    tgt = sim.get_target(target)
    alts = []
    for plan in ranked[: ALTERNATIVES + 1]:
        trace_ns = None
        if runnable:
            ran = found[0].result if plan.tiles == chosen.tiles else replan(plan)
            trace_ns = schedule(ran.trace, tgt).time_ns
        alts.append(Alternative(plan, trace_ns))
    note = (
        "" if runnable else "runner-ups were not run: the launch's arguments do not end with the plan's tiles"
    )
    return tuple(alts), note


def _candidates(family: Family, ir: KernelIR, match: Any, dims: dict[str, int], target: str,
                lnc: int) -> list[TilePlan]:  # fmt: skip
    """The planner's best plans at `dims` (none for a family without a search, or where nothing fits)."""
    try:
        return family.candidates(ir, match, dims, target, lnc, ALTERNATIVES + 1)
    except PlanError:
        return []


def _tile_args(launch: Launch, plan: TilePlan) -> bool:
    """Whether the launch's arguments end with the plan's tile values (the host's `_Plan` fields)."""
    values = tuple(v for _, v in plan.tiles)
    return len(launch.args) >= len(values) and tuple(launch.args[len(launch.args) - len(values) :]) == values


def _replanned(kernels: ModuleType, call: Callable[[], object]) -> Callable[[TilePlan], RunResult]:
    """Runs of the host function (`call`) with its planner's choice (`_choose`) replaced by a plan's tiles,
    so the host lays its arguments out for that plan (the FFN column blocks' down weights depend on KC)."""

    def run(plan: TilePlan) -> RunResult:
        progress(f"running the runner-up {tiles_text(plan)} on the interpreter")
        chosen = kernels._choose
        kernels._choose = lambda *_: kernels._Plan(*(v for _, v in plan.tiles))  # type: ignore[attr-defined]
        try:
            with launches(kernels) as found:
                call()
        finally:
            kernels._choose = chosen  # type: ignore[attr-defined]
        return found[0].result

    return run


def tiles_text(plan: TilePlan) -> str:
    """`S=256 CI=768` form."""
    return " ".join(f"{k}={v}" for k, v in plan.tiles)
