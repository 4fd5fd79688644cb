"""`fusegen explain`: what a generated kernel costs before any hardware run, and why its plan was chosen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fusegen import calibration as measured
from fusegen.codegen.build import plan_shape
from fusegen.codegen.commands import fits_host, validated_shape
from fusegen.codegen.plan import TilePlan
from fusegen.codegen.range_errors import spec_ranges
from fusegen.dsl import load_spec
from fusegen.dsl.diagnostics import Diagnostic, SpecError
from fusegen.jsonout import document, emit
from fusegen.perf.analysis import Analysis, analyse, dims_text, progress, tiles_text
from fusegen.perf.schedule import ENGINES, Schedule
from fusegen.perf.timeline import chrome_trace, svg

#: below this busy share no engine really bounds the kernel: dependencies and latencies do
BUSY_BOUND_PCT = 60.0
#: a runner-up must be this much faster by the trace before we call the planner's choice into question
DISAGREE_MARGIN = 0.02


def explain(spec: str, target: str, lnc: int, shape: dict[str, int] | None, trace: str | None = None,
            svg_path: str | None = None, fmt: str = "text", calibration: str | None = None
            ) -> int:  # fmt: skip
    """Model `spec`'s kernel at `shape` (default: its first check line), print the report with the device
    measurements of the calibration file (fusegen/calibration.py), write files."""
    dims = _dims(spec, shape)
    plan_shape(spec, dims, target, lnc)  # when nothing fits: the planner's message
    with spec_ranges(spec, dims):  # the kernel runs on the interpreter: `log(x)` of N(0, 1) inputs
        analysis = analyse(spec, dims, target, lnc)
    path = Path(calibration) if calibration else measured.default_path()
    records = measured.read(path)
    if fmt == "json":
        emit(document("explain", True, **report_json(analysis),
                      measured=measured.measured_json(records, analysis.name)))  # fmt: skip
    else:
        print(report(analysis))
        time_ns = analysis.modeled.time_ns
        print(f"\n{measured.section(records, path, analysis.name, target, lnc, dims, time_ns)}")
    if trace:
        chrome_trace(analysis.modeled.schedules, trace)
        progress(f"wrote the modelled timeline to {trace} (open it in https://ui.perfetto.dev)")
    if svg_path:
        svg(analysis.plan, analysis.modeled.schedules, svg_path)
        progress(f"wrote the SBUF budget and engine timeline to {svg_path}")
    return 0


def _dims(spec: str, shape: dict[str, int] | None) -> dict[str, int]:
    """`--shape` checked like a check line, else the spec's first check line; either fits the host."""
    ir, _ = load_spec(spec)
    if shape:
        dims = validated_shape(ir, spec, shape)
    elif not ir.checks:
        source = Path(spec).read_text(encoding="utf-8", errors="replace")
        raise SpecError([Diagnostic(ir.outputs[0].span, f"`{ir.name}` has no check line",
                                    hint="give the shape with --shape R=... K=...")], source)  # fmt: skip
    else:
        dims = ir.checks[0].env()
    fits_host(ir, spec, [dims], given=bool(shape))  # the interpreter runs the kernel on the host
    return dims


def report(a: Analysis) -> str:
    """The whole text report."""
    head = (f"{a.name} ({a.family} family) at {dims_text(a.dims)} on {a.target}, LNC {a.lnc}: "
            f"{len(a.modeled.launches)} launch(es), {a.modeled.instructions} instructions")  # fmt: skip
    sections = [head, _plan_section(a), _engine_section(a), _roofline_section(a), _alternatives_section(a)]
    return "\n\n".join(s for s in sections if s)


def report_json(a: Analysis) -> dict[str, Any]:
    """The report's figures (times in ns, bytes, percentages 0-100) for `--format json`."""
    m, r, main = a.modeled, a.modeled.roof, _main_schedule(a)
    plan = None if a.plan is None else {
        "tiles": dict(a.plan.tiles), "sbuf_bytes": a.plan.sbuf_bytes, "sbuf_budget": a.plan.sbuf_budget,
        "psum_banks": a.plan.psum_banks, "psum_budget": a.plan.psum_budget,
    }  # fmt: skip
    return {
        "kernel": a.name, "family": a.family, "dims": a.dims, "target": a.target, "lnc": a.lnc,
        "plan": plan, "launches": len(m.launches), "instructions": m.instructions,
        "modelled_ns": m.time_ns, "bound_engine": main.bound,
        "engines": {e: {"busy_ns": main.engine_busy_ns(e), "busy_pct": main.busy_pct(e)} for e in ENGINES},
        "roofline": {"time_ns": r.time_ns, "bound": r.bound, "efficiency": r.efficiency(m.time_ns),
                     "flops": r.flops, "min_hbm_bytes": r.min_hbm_bytes, "hbm_moved_bytes": m.hbm_moved},
        "alternatives": [{"tiles": dict(alt.plan.tiles), "planner_ns": alt.plan.modeled_ns,
                          "trace_ns": alt.trace_ns} for alt in a.alternatives],
    }  # fmt: skip


def _plan_section(a: Analysis) -> str:
    if a.plan is None:
        return f"plan\n  {a.plan_note}"
    p = a.plan
    sbuf = f"{p.sbuf_bytes:,} of {p.sbuf_budget:,} B ({_pct(p.sbuf_bytes, p.sbuf_budget)})"
    rows = [
        *((f"tile {name}", str(value)) for name, value in p.tiles),
        ("SBUF per partition", f"{sbuf}, headroom {p.sbuf_budget - p.sbuf_bytes:,} B"),
        ("PSUM banks", f"{p.psum_banks} of {p.psum_budget}"),
        *p.summary,
    ]
    lines = ["plan", *(f"  {k:<38} {v}" for k, v in rows), "", _buffer_table(p)]
    return "\n".join(lines)


def _buffer_table(p: TilePlan) -> str:
    budget = {"sbuf": p.sbuf_budget, "psum": p.psum_budget * 2048}
    width = max([39, *(len(b.name) for b in p.buffers)]) + 1  # whole names: they say what a buffer holds
    lines = [f"  {'buffer':<{width}}{'memory':>7}{'bytes':>10}{'copies':>8}{'of budget':>11}"]
    for b in p.buffers:
        total = b.bytes * b.copies
        lines.append(
            f"  {b.name:<{width}}{b.memory:>7}{b.bytes:>10,}{b.copies:>8}{_pct(total, budget[b.memory]):>11}"
        )
    return "\n".join(lines)


def _engine_section(a: Analysis) -> str:
    m = a.modeled
    lines = [
        f"modelled time {m.time_ns / 1000:.1f} us (the interpreter's trace: {m.instructions} instructions "
        f"scheduled, engines in parallel, dependencies respected)",
        f"  {'engine':<8}{'busy us':>10}{'busy %':>8}",
    ]
    for kernel, sched in m.schedules:
        if len(m.schedules) > 1:
            lines.append(f"  {kernel}: {sched.time_ns / 1000:.1f} us")
        lines += [
            f"  {e:<8}{sched.engine_busy_ns(e) / 1000:>10.1f}{sched.busy_pct(e):>7.0f}%" for e in ENGINES
        ]
    lines.append(f"  bound by: {_bound_text(_main_schedule(a))}")
    lines.append("  (busy per lane averaged over cores; DMA over its 16 queues per core)")
    return "\n".join(lines)


def _main_schedule(a: Analysis) -> Schedule:
    """The longest launch: the one that decides the bound."""
    return max((s for _, s in a.modeled.schedules), key=lambda s: s.time_ns)


def _bound_text(sched: Schedule) -> str:
    engine, pct = sched.bound, sched.busy_pct(sched.bound)
    if pct < BUSY_BOUND_PCT:
        return f"latency and dependencies (the busiest engine, {engine}, is busy {pct:.0f}% of the time)"
    return f"{engine} ({pct:.0f}% busy)"


def _roofline_section(a: Analysis) -> str:
    m, r = a.modeled, a.modeled.roof
    eff = r.efficiency(m.time_ns)
    peak_tflops = r.pe_peak_flops_per_ns / 1000
    moved = m.hbm_moved / max(1, r.min_hbm_bytes)
    return "\n".join([
        f"roofline {r.time_ns / 1000:.1f} us ({r.bound}-bound); modelled efficiency {100 * eff:.0f}%",
        f"  PE:  {r.flops / 1e9:.2f} GFLOP at {peak_tflops:.1f} TFLOPS = {r.compute_ns / 1000:.1f} us",
        f"  HBM: {r.min_hbm_bytes / 1e6:.2f} MB minimum (inputs read once, outputs written once) at "
        f"{r.hbm_bytes_per_ns:.0f} GB/s = {r.memory_ns / 1000:.1f} us",
        f"  HBM traffic moved {m.hbm_moved / 1e6:.2f} MB = {moved:.2f}x the minimum",
    ])  # fmt: skip


def _alternatives_section(a: Analysis) -> str:
    if not a.alternatives:
        return f"next plans\n  {a.alternatives_note}" if a.alternatives_note else ""
    chosen = a.alternatives[0]
    lines = [
        "next plans (planner: the planner's closed-form model; trace: run on the interpreter, scheduled)",
        f"  {'#':<3}{'tiles':<28}{'planner us':>11}{'trace us':>10}{'vs chosen':>11}",
    ]
    for rank, alt in enumerate(a.alternatives):
        trace = f"{alt.trace_ns / 1000:.1f}" if alt.trace_ns is not None else "-"
        ratio = "chosen" if rank == 0 else _ratio(alt.trace_ns, chosen.trace_ns, alt.plan, chosen.plan)
        planned = alt.plan.modeled_ns / 1000
        lines.append(f"  {rank + 1:<3}{tiles_text(alt.plan):<28}{planned:>11.1f}{trace:>10}{ratio:>11}")
    lines.append("  why the chosen plan wins:")
    lines += [f"  - {reason}" for reason in chosen.plan.reasons]
    lines += _disagreement(a)
    if a.alternatives_note:
        lines.append(f"  ({a.alternatives_note})")
    return "\n".join(lines)


def _ratio(time: float | None, chosen: float | None, plan: TilePlan, chosen_plan: TilePlan) -> str:
    """How much slower a runner-up is: by the trace when both ran, else by the planner."""
    if time is not None and chosen:
        return f"{time / chosen:.2f}x"
    return f"{plan.modeled_ns / max(chosen_plan.modeled_ns, 1e-9):.2f}x"


def _disagreement(a: Analysis) -> list[str]:
    """Say so when the trace schedule ranks a runner-up above the planner's choice."""
    timed = [(alt.trace_ns, rank) for rank, alt in enumerate(a.alternatives) if alt.trace_ns is not None]
    chosen_ns = a.alternatives[0].trace_ns
    if not timed or chosen_ns is None or min(timed)[0] > chosen_ns * (1 - DISAGREE_MARGIN):
        return []
    best_ns, rank = min(timed)
    return [f"  note: by the trace schedule, plan #{rank + 1} is faster ({best_ns / 1000:.1f} us against "
            f"{chosen_ns / 1000:.1f} us): the planner's model and the trace disagree"]  # fmt: skip


def _pct(n: float, total: float) -> str:
    return f"{100 * n / total:.1f}%" if total else "-"
