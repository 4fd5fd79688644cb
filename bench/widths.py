"""Every FFN and row example at every published model width: plan, SBUF, modelled time, roofline efficiency.

Per (width, rows, launch) row: the tile plan the planner picks, its SBUF bytes per partition, the
modelled time of the busiest core, and the roofline efficiency (roofline time / modelled time); where a
plan is more than 1.5x slower than its roofline, the engine the time model says bounds it. FFN times are
the planner's closed-form model (seconds for the whole table). Summary lines: the worst FFN efficiency at
R=2048 for K >= 4096 on trn2 (goal: >= 85% of the PE roofline), then the median and worst of those plans
re-planned with the DMA packet figure at 50% and 150% (docs/performance.md, "Cost model II").
Row kernels (HBM roofline) are timed by running their generated kernel on the interpreter at 1 and 128
rows per shape and scheduling the trace (fusegen/perf/row_widths.py; about a minute per example).
With --check, also runs `fusegen check` (interpreter against the reference) at the wide-but-cheap
shapes CI runs, each in its own process, and reports its peak resident memory (goal: < 8 GB).
Run: .venv/bin/python bench/widths.py [--family ffn,rows] [--examples a,b] [--launch trn2:2] [--rows 1,2048]
     [--check]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fusegen.perf.cost import SENSITIVITY, assume  # noqa: E402
from fusegen.perf.row_widths import (  # noqa: E402
    RowExample,
    dims_at,
    modelled_ns,
    plan_rows,
    row_examples,
    shapes,
    tile_times,
)
from fusegen.perf.widths import LAUNCHES, ROWS, WIDTHS, Example, Planned, ffn_examples, plan_at  # noqa: E402

SLOW = 1.5  # beyond this multiple of the roofline, name the engine that bounds the plan
#: (example, shape) `fusegen check` runs at wide K with few rows and a small I (what CI runs)
CHECKS = (
    ("swiglu_rmsnorm", "R=130 K=8192 I=256"),
    ("swiglu_rmsnorm", "R=3 K=16384 I=200"),
    ("swiglu_ffn_ln", "R=3 K=16384 I=128"),
    ("prenorm_swiglu", "R=3 K=16384 I=256"),
)
#: the same for row kernels: wide rows and a vocabulary row, and the Engram gate at a real prefill
ROW_CHECKS = (
    ("add_rmsnorm", "T=3 H=16384"),
    ("layernorm", "T=3 H=16384"),
    ("scaled_softmax", "T=3 H=128256"),
    ("engram_gate", "T=4001 HC=4 H=7168"),
)


def check_memory(checks: tuple[tuple[str, str], ...]) -> None:
    """`fusegen check` at each of `checks` in a child process: its result and peak RSS."""
    print("\n| example | shape | fusegen check | peak RSS (MB) |\n| --- | --- | --- | ---: |")
    for name, shape in checks:
        spec = str(ROOT / "examples" / f"{name}.spec")
        cmd = [sys.executable, "-m", "fusegen.cli", "check", spec, "--shape", *shape.split()]
        child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
        _, code, usage = os.wait4(child.pid, 0)  # this child's own peak, not the largest so far
        peak = usage.ru_maxrss / 1024  # KB on Linux
        status = "ok" if os.waitstatus_to_exitcode(code) == 0 else f"exit {os.waitstatus_to_exitcode(code)}"
        print(f"| {name} | {shape} | {status} | {peak:,.0f} |")


def cell(p: Planned) -> str:
    """One table row's plan columns."""
    if p.plan is None:
        return f"| – | – | – | – | {p.error.split(': ', 1)[-1]} |"
    tiles = dict(p.plan.tiles)
    eff = p.roof.efficiency(p.plan.modeled_ns)
    bound = dict(p.plan.summary)["planner's estimate (busiest core)"].split("bound by ")[-1]
    note = f"{bound}-bound" if p.plan.modeled_ns > SLOW * p.roof.time_ns else ""
    split = " I-split" if tiles["split_i"] else ""
    blocks = f" KC={tiles['KC']}" if tiles["KC"] else ""
    blocks += f" G={tiles['G']}" if tiles.get("G") else ""
    blocks += " HT" if tiles.get("HT") else ""
    return (
        f"| S={tiles['S']} CI={tiles['CI']}{split}{blocks} | {p.plan.sbuf_bytes:,} "
        f"| {p.plan.modeled_ns / 1000:,.1f} | {100 * eff:.0f}% ({p.roof.bound}) | {note} |"
    )


def row_cell(ex: RowExample, p: Planned, dims: dict[str, int], target: str, lnc: int) -> str:
    """One row-kernel table row's plan columns; the time from the interpreter runs of `tile_times`."""
    if p.plan is None:
        return f"| – | – | – | – | {p.error.split(': ', 1)[-1]} |"
    summary = dict(p.plan.summary)
    how = "streamed" if summary["row inputs"].startswith("streamed") else "whole rows"
    weights = "" if not ex.match.weights else (
        ", weights resident" if summary["prepared weights"].startswith("resident") else ", weights per tile"
    )  # fmt: skip
    times = tile_times(ex, dims[ex.width], dims.get(ex.heads or ""), target)
    ns = modelled_ns(times, dims[ex.rows], lnc)
    note = f"{times.bound}-bound" if ns > SLOW * p.roof.time_ns else ""
    return (
        f"| HB={p.plan.tile('HB')} {how}{weights} | {p.plan.sbuf_bytes:,} | {ns / 1000:,.1f} "
        f"| {100 * p.roof.efficiency(ns):.0f}% | {note} |"
    )


def row_tables(names: set[str], launches: list[tuple[str, int]], rows: list[int]) -> None:
    """Per row example: every table shape at every row count and launch."""
    for ex in row_examples(ROOT):
        if names and ex.name not in names:
            continue
        print(f"\n### {ex.name}\n")
        print("| shape | R | target LNC | plan | SBUF B/part | modelled us | efficiency (HBM roof) | bound |")
        print("| --- | ---: | --- | --- | ---: | ---: | ---: | --- |")
        for label, width, heads in shapes(ex):
            for r in rows:
                for target, lnc in launches:
                    dims = dims_at(ex, r, width, heads)
                    p = plan_rows(ex, dims, target, lnc)
                    cells = row_cell(ex, p, dims, target, lnc)
                    print(f"| {label} | {r} | {target} {lnc} {cells}", flush=True)


def wide_efficiencies(examples: list[Example], launches: list[tuple[str, int]]) -> list[float]:
    """Planner efficiency of every plan at R=2048, K >= 4096 on trn2."""
    plans = [plan_at(ex, 2048, k, i, t, lnc) for ex in examples for _, k, i in WIDTHS if k >= 4096
             for t, lnc in launches if t == "trn2"]  # fmt: skip
    return [p.roof.efficiency(p.plan.modeled_ns) for p in plans if p.plan]


def sensitivity(examples: list[Example], launches: list[tuple[str, int]]) -> None:
    """Median and worst of those, re-planned with the DMA packet figure varied (the planner's only uncertain
    figure; throttling and the DGE issue are trace-model effects)."""
    variants = [("cost model II", {})] + [v for v in SENSITIVITY if "dma_row_bytes" in v[1]]
    for name, changes in variants:
        with assume(**changes):
            effs = wide_efficiencies(examples, launches)
        if effs:
            print(f"  {name}: median {100 * statistics.median(effs):.0f}%, worst {100 * min(effs):.0f}%")


def main(argv: list[str] | None = None) -> int:
    """Print the table (markdown) and the summary."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--examples", default="", help="comma-separated example names (default: all FFN examples)"
    )
    ap.add_argument("--family", default="ffn,rows", help="ffn, rows or both (default)")
    ap.add_argument("--launch", default="", help="target:lnc, e.g. trn2:2 (default: all)")
    ap.add_argument("--rows", default="", help="comma-separated R (default: 1,128,2048,8192,65536)")
    ap.add_argument("--check", action="store_true", help="also run fusegen check at CHECKS, report peak RSS")
    args = ap.parse_args(argv)
    wanted = set(filter(None, args.examples.split(",")))
    families = set(args.family.split(","))
    examples = [e for e in ffn_examples(ROOT) if not wanted or e.name in wanted] if "ffn" in families else []
    launches = [(t, int(n)) for t, n in [args.launch.split(":")]] if args.launch else list(LAUNCHES)
    row_counts = [int(r) for r in args.rows.split(",")] if args.rows else list(ROWS)
    worst: tuple[float, str] = (2.0, "")
    per_example: dict[str, tuple[float, str]] = {}
    for ex in examples:
        print(f"\n### {ex.name}\n")
        print(
            "| model (K, I) | R | target LNC | plan | SBUF B/part | modelled us | efficiency (roof) | bound |"
        )
        print("| --- | ---: | --- | --- | ---: | ---: | ---: | --- |")
        for model, k, i in WIDTHS:
            for rows in row_counts:
                for target, lnc in launches:
                    p = plan_at(ex, rows, k, i, target, lnc)
                    print(f"| {model} ({k}, {i}) | {rows} | {target} {lnc} {cell(p)}")
                    if p.plan and target == "trn2" and rows == 2048 and k >= 4096:
                        eff = p.roof.efficiency(p.plan.modeled_ns)
                        worst = min(worst, (eff, f"{ex.name} K={k} I={i} LNC={lnc}"))
                        where = f"K={k} I={i} LNC={lnc}, {cell(p).split(' |')[0][2:]}"
                        per_example[ex.name] = min(per_example.get(ex.name, (2.0, "")), (eff, where))
    if per_example:
        print("\n| example | worst at R=2048, K >= 4096, trn2 | where (plan) |\n| --- | ---: | --- |")
        for name, (eff, where) in per_example.items():
            print(f"| {name} | {100 * eff:.0f}% | {where} |")
    if worst[1]:
        print(f"\nworst modelled efficiency at R=2048, K >= 4096 on trn2: {100 * worst[0]:.0f}% ({worst[1]})")
        sensitivity(examples, launches)
    if "rows" in families:
        row_tables(wanted, launches, row_counts)
    if args.check:
        check_memory((CHECKS if "ffn" in families else ()) + (ROW_CHECKS if "rows" in families else ()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
