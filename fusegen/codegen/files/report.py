"""plan.md: per check shape, the chosen tiling, its SBUF/PSUM budget with headroom, traffic, and why."""

from __future__ import annotations

from dataclasses import dataclass

from fusegen.codegen.files.render import header, render
from fusegen.codegen.plan import TilePlan
from fusegen.dsl.ir import KernelIR


@dataclass(frozen=True)
class PlanRows:
    """Pre-formatted text of one plan for the template."""

    title: str
    summary: tuple[tuple[str, str], ...]
    buffers: tuple[tuple[str, str, str, str, str], ...]
    reasons: tuple[str, ...]


def plan_markdown(ir: KernelIR, family: str, planning: str, plans: tuple[TilePlan, ...]) -> str:
    """The plan report of one kernel."""
    return render(
        "plan.md.jinja",
        header=header(ir, "plan.md.jinja", comment="<!--").replace("\n", " -->\n") + " -->",
        name=ir.name,
        family=family,
        planning=planning,
        plans=[_rows(p) for p in plans],
    )


def _rows(p: TilePlan) -> PlanRows:
    dims = " ".join(f"{k}={v}" for k, v in p.dims)
    summary = (
        ("target, LNC", f"{p.target}, {p.lnc}"),
        *((f"tile {name}", str(value)) for name, value in p.tiles),
        (
            "SBUF per partition",
            f"{_kib(p.sbuf_bytes)} of {_kib(p.sbuf_budget)} ({_pct(p.sbuf_bytes, p.sbuf_budget)}), "
            f"headroom {p.sbuf_budget - p.sbuf_bytes:,} B",
        ),
        ("PSUM banks", f"{p.psum_banks} of {p.psum_budget}, headroom {p.psum_budget - p.psum_banks}"),
        *p.summary,
    )
    budget = {"sbuf": p.sbuf_budget, "psum": p.psum_budget * 2048}
    buffers = tuple(
        (b.name, b.memory, f"{b.bytes:,}", str(b.copies), _pct(b.bytes * b.copies, budget[b.memory]))
        for b in p.buffers
    )
    return PlanRows(dims, summary, buffers, p.reasons)


def _kib(n: int) -> str:
    return f"{n / 1024:.1f} KiB"


def _pct(n: int, total: int) -> str:
    return f"{100 * n / total:.1f}%"
