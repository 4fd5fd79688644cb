"""Published model widths, and the FFN examples planned at them against the roofline.

The table is shared by tests/codegen/test_widths.py (every FFN example plans at every row) and
bench/widths.py (plan, SBUF, modelled time, efficiency). Widths are from the models' public configs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from fusegen.codegen.build import select_family
from fusegen.codegen.ffn.lower import lower_ffn
from fusegen.codegen.plan import PlanError, TilePlan, plan_ffn
from fusegen.codegen.rewrites import rewrite
from fusegen.dsl import load_spec
from fusegen.dsl.ir import DTYPE_BYTES, KernelIR, eval_shape
from fusegen.perf.roofline import Roofline, roofline
from fusegen.sim.targets import get_target

#: (model, K hidden, I intermediate)
WIDTHS = (
    ("ViT-H/14 (seed)", 1280, 3416),
    ("Qwen2.5-7B", 3584, 18944),
    ("Llama-3-8B / Mistral-7B / Mixtral-8x7B", 4096, 14336),
    ("Gemma-2-27B", 4608, 36864),
    ("Mixtral-8x22B", 6144, 16384),
    ("DeepSeek-V3 dense", 7168, 18432),
    ("DeepSeek-V3 expert", 7168, 2048),
    ("Llama-3-70B", 8192, 28672),
    ("Qwen2.5-72B", 8192, 29568),
    ("Llama-3.1-405B", 16384, 53248),
)
#: rows (tokens) per call; the examples put no upper bound on R, so the last is a long prefill
ROWS = (1, 128, 2048, 8192, 65536)
#: (target, LNC) pairs: LNC=2 pairs trn2 cores; trn1 has no LNC=2
LAUNCHES = (("trn2", 2), ("trn2", 1), ("trn1", 1))


@dataclass(frozen=True)
class Example:
    """An FFN example spec, matched and lowered once."""

    name: str
    ir: KernelIR
    lowering: object
    roles: tuple[str, str, str]


@dataclass(frozen=True)
class Planned:
    """One example at one width, row count and launch: its plan (None when none fits) and roofline."""

    plan: TilePlan | None
    error: str
    roof: Roofline


def ffn_examples(root: Path) -> list[Example]:
    """Every example spec under `root`/examples that the FFN family builds."""
    out = []
    for spec in sorted((root / "examples").glob("*.spec")):
        ir = rewrite(load_spec(str(spec))[0])
        family, match = select_family(ir, spec.read_text(encoding="utf-8"))
        if family.name == "ffn":
            roles = (str(match.rows), str(match.hidden), str(match.inter))  # type: ignore[attr-defined]
            out.append(Example(ir.name, ir, lower_ffn(ir, match), roles))  # type: ignore[arg-type]
    return out


def plan_at(ex: Example, rows: int, k: int, i: int, target: str, lnc: int) -> Planned:
    """Plan `ex` at one shape; a PlanError becomes `error`."""
    dims = {**ex.ir.fixed_dims(), ex.roles[0]: rows, ex.roles[1]: k, ex.roles[2]: i}
    model = ex.lowering.model  # type: ignore[attr-defined]
    flops = 2.0 * rows * k * i * (model.n_up + 1)
    roof = roofline(get_target(target), lnc, flops, min_hbm_bytes(ex.ir, dims))
    try:
        return Planned(plan_ffn(model, get_target(target), lnc, dims, ex.roles), "", roof)
    except PlanError as err:
        return Planned(None, str(err), roof)


def min_hbm_bytes(ir: KernelIR, dims: dict[str, int]) -> int:
    """Every input read once and every output written once."""
    shapes = [(v.shape, v.dtype) for v in ir.inputs] + [(o.shape, o.dtype) for o in ir.outputs]
    return sum(math.prod(eval_shape(shape, dims)) * DTYPE_BYTES[dtype] for shape, dtype in shapes)
