"""Modelled timelines as Chrome trace-event JSON (Perfetto) and as hand-written SVG with the SBUF budget."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from fusegen.codegen.plan import TilePlan
from fusegen.perf.schedule import ENGINES, Schedule, Span

WIDTH, LEFT, ROW, BAR = 1000, 250, 22, 14
TICKS = 4  # time-axis labels above the engine lanes
COLORS = {
    "tensor": "#4e79a7",
    "vector": "#f28e2b",
    "scalar": "#59a14f",
    "gpsimd": "#b07aa1",
    "dma": "#e15759",
}


def chrome_trace(schedules: Sequence[tuple[str, Schedule]], path: str | Path) -> None:
    """Write the launches' timelines one after another: pid = core, tid = engine or DMA queue, times in µs."""
    events: list[dict[str, Any]] = []
    offset = 0.0
    for kernel, sched in schedules:
        events += [_event(kernel, span, lane, offset) for span in sched.spans for lane in span.lanes]
        offset += sched.time_ns
    cores = sorted({e["pid"] for e in events})
    events += [{"ph": "M", "name": "process_name", "pid": c, "args": {"name": f"core {c}"}} for c in cores]
    Path(path).write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ns"}))


def _event(kernel: str, span: Span, lane: str, offset: float) -> dict[str, Any]:
    rec = span.record
    return {
        "name": rec.op, "cat": rec.engine, "ph": "X", "pid": rec.core, "tid": lane,
        "ts": (offset + span.start_ns) / 1000, "dur": (span.end_ns - span.start_ns) / 1000,
        "args": {"kernel": kernel, "line": rec.line, "partitions": rec.partitions, "elems": rec.elems,
                 "hbm_bytes": rec.hbm_read + rec.hbm_write, "index": rec.index},
    }  # fmt: skip


def svg(plan: TilePlan | None, schedules: Sequence[tuple[str, Schedule]], path: str | Path) -> None:
    """Write an SVG: the SBUF budget (a bar per buffer against the usable budget), then the engine lanes."""
    parts: list[str] = []
    y = _budget_panel(plan, parts, 20) if plan is not None else 20
    _timeline_panel(schedules, parts, y + 20)
    height = y + 60 + ROW * sum(s.cores * len(ENGINES) for _, s in schedules) + 20 * len(schedules)
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'font-family="sans-serif" font-size="11">')  # fmt: skip
    Path(path).write_text("\n".join([head, *parts, "</svg>"]) + "\n")


def _text(x: float, y: float, text: str, anchor: str = "start") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}">{escape(text)}</text>'


def _rect(x: float, y: float, w: float, h: float, color: str, title: str = "") -> str:
    tip = f"<title>{escape(title)}</title>" if title else ""
    return f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(w, 0.5):.1f}" height="{h}" fill="{color}">{tip}</rect>'


def _budget_panel(plan: TilePlan, parts: list[str], y: int) -> int:
    """SBUF buffers as bars scaled to the usable budget (a full-width bar = the whole budget)."""
    scale = (WIDTH - LEFT - 20) / plan.sbuf_budget
    parts.append(
        _text(10, y + 4, f"SBUF per partition: {plan.sbuf_bytes:,} of {plan.sbuf_budget:,} B usable")
    )
    y += 14
    rows = [(b.name, b.bytes * b.copies) for b in plan.buffers if b.memory == "sbuf"]
    for name, nbytes in [*rows, ("total", plan.sbuf_bytes)]:
        parts.append(_text(LEFT - 6, y + BAR - 3, name if len(name) <= 38 else name[:37] + "…", "end"))
        parts.append(_rect(LEFT, y, WIDTH - LEFT - 20, BAR, "#eeeeee"))
        color = "#4e79a7" if name != "total" else "#e15759"
        parts.append(_rect(LEFT, y, nbytes * scale, BAR, color, f"{name}: {nbytes:,} B"))
        y += ROW - 4
    return y


def _timeline_panel(schedules: Sequence[tuple[str, Schedule]], parts: list[str], y: int) -> None:
    """One lane per engine per core; DMA lanes show when any queue is busy."""
    total = sum(s.time_ns for _, s in schedules) or 1.0
    scale = (WIDTH - LEFT - 20) / total
    parts.append(_text(10, y, f"modelled timeline, {total / 1000:.1f} us"))
    anchors = ["middle"] * (TICKS - 1) + ["end"]  # the last tick sits at the right edge
    parts += [_text(LEFT + i / TICKS * total * scale, y, f"{i / TICKS * total / 1000:.1f} us", anchors[i - 1])
              for i in range(1, TICKS + 1)]  # fmt: skip
    offset = 0.0
    for kernel, sched in schedules:
        y += 16
        parts.append(_text(10, y, kernel))
        for core in range(sched.cores):
            for engine in ENGINES:
                y += 4
                parts.append(_text(LEFT - 6, y + BAR - 3, f"core {core} {engine}", "end"))
                for start, end in _busy_intervals(sched.spans, core, engine, total / 2000):
                    parts.append(
                        _rect(LEFT + (offset + start) * scale, y, (end - start) * scale, BAR, COLORS[engine])
                    )
                y += ROW - 4
        offset += sched.time_ns


def _busy_intervals(spans: list[Span], core: int, engine: str, merge_gap: float) -> list[tuple[float, float]]:
    """Busy intervals of one engine lane, merged over gaps below `merge_gap` (keeps the SVG small)."""
    intervals = sorted(
        (s.start_ns, s.end_ns) for s in spans if s.record.core == core and s.record.engine == engine
    )
    merged: list[tuple[float, float]] = []
    for start, end in intervals:
        if merged and start <= merged[-1][1] + merge_gap:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged
