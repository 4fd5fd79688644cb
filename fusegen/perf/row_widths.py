"""The row-reduction examples at published widths: plans, HBM rooflines and modelled times.

Shared by tests/codegen/test_row_widths.py (every row example plans at every width and row count, or
says why not) and bench/widths.py (plan, SBUF, modelled time, efficiency). Norm widths are the hidden
sizes of fusegen/perf/widths.py's model table; softmax also runs over published vocabularies.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from fusegen import sim
from fusegen.codegen.build import select_family
from fusegen.codegen.family import Family
from fusegen.codegen.files.tests import test_case
from fusegen.codegen.plan import PlanError
from fusegen.codegen.rewrites import rewrite
from fusegen.dsl import load_spec
from fusegen.dsl.ir import DTYPE_BYTES, CheckShape, KernelIR, eval_shape
from fusegen.perf.capture import launches
from fusegen.perf.roofline import roofline
from fusegen.perf.schedule import schedule
from fusegen.perf.widths import WIDTHS, Planned
from fusegen.testing import make_inputs

#: hidden sizes of the model table: the norms' widths
NORM_WIDTHS = tuple(sorted({k for _, k, _ in WIDTHS}))
#: (model family, vocabulary): the softmax's widths
VOCABS = (("Llama-2 / Mistral", 32000), ("Llama-3", 128256), ("Qwen2.5", 152064), ("Gemma", 256000))
#: the Engram gate's published width (DeepSeek-V3's hidden size) and its head counts (hc_mult)
ENGRAM_WIDTH, ENGRAM_HEADS = 7168, (1, 2, 4, 8)
#: heads of a multi-head example at the norm widths (qk_norm's query heads; the Engram gate at most 8)
DEFAULT_HEADS = 8
P = 128  # token rows per tile


@dataclass(frozen=True, eq=False)
class RowExample:
    """A row-reduction example spec, matched once, with the names of its rows, heads and width dims."""

    name: str
    spec: Path
    ir: KernelIR
    family: Family
    match: Any
    rows: str
    heads: str | None  # None: a [T, H] spec, or a fixed head count
    width: str


def row_examples(root: Path) -> list[RowExample]:
    """Every example spec under `root`/examples that the row-reduction family builds."""
    out = []
    for spec in sorted((root / "examples").glob("*.spec")):
        ir = rewrite(load_spec(str(spec))[0])
        family, match = select_family(ir, spec.read_text(encoding="utf-8"))
        if family.name == "rowreduce":
            names = [_name(d) for d in next(i for i in ir.inputs if len(i.shape) >= 2).shape]
            heads = names[1] if len(names) == 3 and names[1] not in ir.fixed_dims() else None
            out.append(RowExample(ir.name, spec, ir, family, match, names[0], heads, names[-1]))
    return out


def _name(dim: Any) -> str:
    """The symbol of a one-symbol dim (`T`)."""
    (((symbol,), _),) = dim.terms
    return str(symbol)


def shapes(ex: RowExample) -> list[tuple[str, int, int | None]]:
    """(label, width, heads) the table plans `ex` at: the norm widths (the softmax: the vocabularies too;
    the Engram gate: also H=7168 at every head count)."""
    heads = DEFAULT_HEADS if ex.heads else None
    out = [(f"H={w}", w, heads) for w in NORM_WIDTHS]
    if ex.name == "scaled_softmax":
        out += [(f"{model} vocab", v, None) for model, v in VOCABS]
    if ex.name.startswith("engram_gate") and ex.heads:
        out += [(f"H={ENGRAM_WIDTH} HC={hc}", ENGRAM_WIDTH, hc) for hc in ENGRAM_HEADS if hc != heads]
    return out


def dims_at(ex: RowExample, rows: int, width: int, heads: int | None) -> dict[str, int]:
    """The spec's dims at one table shape."""
    dims = {**ex.ir.fixed_dims(), ex.rows: rows, ex.width: width}
    if ex.heads and heads:
        dims[ex.heads] = heads
    return dims


def plan_rows(ex: RowExample, dims: dict[str, int], target: str, lnc: int) -> Planned:
    """The family planner's plan at `dims` (a PlanError becomes `error`) and its HBM roofline."""
    roof = roofline(sim.get_target(target), lnc, 0.0, min_hbm_bytes(ex.ir, dims))
    at = dataclasses.replace(ex.ir, checks=(CheckShape(tuple(sorted(dims.items())), ex.ir.checks[0].span),))
    try:
        return Planned(ex.family.plans(at, ex.match, target, lnc)[0], "", roof)
    except PlanError as err:
        return Planned(None, str(err), roof)


def min_hbm_bytes(ir: KernelIR, dims: dict[str, int]) -> int:
    """Every input read once and every output a default call returns (no optional ones) written once."""
    values = [(i.shape, i.dtype) for i in ir.inputs]
    values += [(o.shape, o.dtype) for o in ir.outputs if not o.optional]
    return sum(math.prod(eval_shape(shape, dims)) * DTYPE_BYTES[dtype] for shape, dtype in values)


@dataclass(frozen=True)
class TileTimes:
    """Modelled ns of one core's launch at 1 and at 128 rows (one token tile), and the bounding engine."""

    one_row: float
    one_tile: float
    bound: str


def modelled_ns(times: TileTimes, rows: int, lnc: int) -> float:
    """The busiest core's time at `rows` tokens: its token tiles, each modelled as one whole launch (an
    upper bound: a resident plan builds its weights once, not per tile, and tiles overlap in a launch)."""
    per_core = -(-rows // lnc)
    return times.one_row if per_core == 1 else -(-per_core // P) * times.one_tile


def tile_times(ex: RowExample, width: int, heads: int | None, target: str) -> TileTimes:
    """Run `ex`'s generated kernel on one core at 1 and 128 rows on the interpreter and schedule both."""
    return _tile_times(ex.spec.parents[1] / "generated" / ex.name / "kernel.py", ex, width, heads, target)


@cache
def _tile_times(kernel: Path, ex: RowExample, width: int, heads: int | None, target: str) -> TileTimes:
    module = _kernels(kernel, target)
    tgt = sim.get_target(target)
    times, bound = [], ""
    for rows in (1, P):
        dims = dims_at(ex, rows, width, heads)
        case = test_case(load_spec(str(ex.spec))[0], dims)
        args = make_inputs(case.inputs, case.shapes)
        with launches(module) as found:
            getattr(module, ex.name)(*args, lnc=1, target=target)
        scheds = [schedule(launch.result.trace, tgt) for launch in found]
        times.append(sum(s.time_ns for s in scheds))
        bound = max(scheds, key=lambda s: s.time_ns).bound
    return TileTimes(times[0], times[1], bound)


@cache
def _kernels(kernel: Path, target: str) -> Any:
    """A committed generated kernel module (generated/<name>/kernel.py), loaded once per target."""
    return sim.load_module(kernel, target=target)
