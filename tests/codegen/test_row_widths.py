"""Row kernels at real model widths: norms up to H=16384 and softmax over 256k vocabularies plan on both
targets, and rows too wide for SBUF run streamed on the interpreter, matching torch's own functions."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fusegen.codegen.build import select_family
from fusegen.codegen.plan import PlanError, TilePlan
from fusegen.codegen.rewrites import rewrite
from fusegen.dsl import load_spec
from fusegen.dsl.ir import CheckShape
from fusegen.sim import load_module

ROOT = Path(__file__).resolve().parents[2]
EPS_RMS, EPS_LN, SCALE = 1e-6, 1e-5, 0.125
TOKENS = 2048  # a prefill's worth of rows; the plan depends on the width, not on the row count
WIDTHS = (4096, 8192, 16384)  # Llama-3-8B, Llama-3-70B, Llama-3.1-405B hidden sizes
VOCABS = (32000, 128256, 152064, 256000)  # Llama-2, Llama-3, Qwen2.5, Gemma vocabularies
#: the dims of each row example at width `w` (qk_norm's width is its head dim)
ROW_DIMS: dict[str, Callable[[int], dict[str, int]]] = {
    "add_rmsnorm": lambda w: {"T": TOKENS, "H": w},
    "layernorm": lambda w: {"T": TOKENS, "H": w},
    "qk_norm": lambda w: {"T": TOKENS, "NH": 8, "D": w},
    "engram_gate": lambda w: {"T": TOKENS, "HC": 8, "H": w},
    "engram_gate_noresid": lambda w: {"T": TOKENS, "HC": 8, "H": w},
    "engram_gate_hc8": lambda w: {"T": TOKENS, "H": w},
}
TARGETS = (("trn2", 2), ("trn1", 1))


def plan_at(spec: str, dims: dict[str, int], target: str, lnc: int) -> TilePlan:
    """The family planner's plan for `spec` at `dims` (PlanError when none fits)."""
    path = ROOT / "examples" / f"{spec}.spec"
    ir = rewrite(load_spec(str(path))[0])
    family, match = select_family(ir, path.read_text())
    at = dataclasses.replace(ir, checks=(CheckShape(tuple(sorted(dims.items())), ir.checks[0].span),))
    return family.plans(at, match, target, lnc)[0]


def _streamed(plan: TilePlan) -> bool:
    return dict(plan.summary)["row inputs"].startswith("streamed")


@pytest.mark.parametrize(("target", "lnc"), TARGETS)
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("spec", sorted(ROW_DIMS))
def test_every_row_example_plans_at_model_widths(spec: str, width: int, target: str, lnc: int) -> None:
    plan = plan_at(spec, ROW_DIMS[spec](width), target, lnc)
    assert plan.sbuf_bytes <= plan.sbuf_budget
    hb = dict(plan.tiles)["HB"]
    assert hb % 128 == 0 and hb * -(-width // hb) >= width


@pytest.mark.parametrize(("target", "lnc"), TARGETS)
@pytest.mark.parametrize("vocab", VOCABS)
def test_softmax_plans_over_vocabularies(vocab: int, target: str, lnc: int) -> None:
    plan = plan_at("scaled_softmax", {"T": TOKENS, "H": vocab}, target, lnc)
    assert _streamed(plan) and plan.sbuf_bytes <= plan.sbuf_budget
    # max, then the sum of exponentials, then the normalised row: three reads of the logits, one write
    per_token = dict(plan.hbm_bytes)["per token"]
    assert per_token == 3 * 2 * vocab + 2 * vocab + 4


def test_the_limit_is_one_heads_prepared_weights() -> None:
    """Streamed rows keep one head's fp32 prepared weights width-long: 4 B per column for the Engram gate's
    w_h * w_e, so no plan fits at H=65536 on trn1 (that weight alone is 262,144 B > 180,224 B); the message
    gives the numbers."""
    message = r"width 65536 .* needs \d+ B/partition .* budget is 180224 B on trn1"
    with pytest.raises(PlanError, match=message):
        plan_at("engram_gate", {"T": 8, "HC": 2, "H": 65536}, "trn1", 1)
    assert _streamed(plan_at("scaled_softmax", {"T": 8, "H": 1 << 20}, "trn1", 1))  # no weights: no limit


def test_the_resident_plan_stays_where_rows_fit() -> None:
    plan = plan_at("add_rmsnorm", {"T": 4096, "H": 4096}, "trn2", 2)
    assert not _streamed(plan)
    assert dict(plan.hbm_bytes)["per token"] == dict(plan.hbm_bytes)["minimum per token"]


def add_rmsnorm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    s = x.float() + r.float()
    return F.rms_norm(s, (x.shape[-1],), w.float(), EPS_RMS).bfloat16(), s.bfloat16()


def layernorm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
    var, mu = torch.var_mean(x.float(), dim=-1, unbiased=False)
    y = F.layer_norm(x.float(), (x.shape[-1],), w, b, EPS_LN)
    return y.bfloat16(), mu, torch.rsqrt(var + EPS_LN)


def scaled_softmax(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    z = x.float() * SCALE
    return torch.softmax(z, dim=-1).bfloat16(), torch.logsumexp(z, dim=-1, keepdim=True)


def _inputs(name: str, rows: int, width: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(rows, width, generator=gen).bfloat16()
    if name == "add_rmsnorm":
        weight = 1 + 0.1 * torch.randn(width, generator=gen)
        return [x, torch.randn(rows, width, generator=gen).bfloat16(), weight.bfloat16()]
    if name == "layernorm":
        return [x + 3, 1 + 0.1 * torch.randn(width, generator=gen), 0.1 * torch.randn(width, generator=gen)]
    return [8 * x]  # logits spread wide enough that a few entries dominate each row


WIDE: dict[str, tuple[Callable[..., tuple[torch.Tensor, ...]], int, dict[str, bool]]] = {
    "add_rmsnorm": (add_rmsnorm, 16384, {}),
    "layernorm": (layernorm, 16384, {"save": True}),
    "scaled_softmax": (scaled_softmax, 128256, {}),
}


@pytest.mark.parametrize("name", sorted(WIDE))
def test_wide_rows_stream_and_match_torch(name: str) -> None:
    formula, width, options = WIDE[name]
    rows = 3
    module = load_module(ROOT / "generated" / name / "kernel.py", target="trn2")
    budget = module._SBUF_BUDGET["trn2"]
    hb, resident, overlap, streamed = module._choose_rows(module._MODEL, width, 1, budget)
    assert streamed and hb < width  # whole rows do not fit: this runs the streamed kernel
    args = _inputs(name, rows, width)
    got = getattr(module, name)(*args, **options, lnc=1, target="trn2")
    got = got if isinstance(got, tuple) else (got,)
    for i, (out, want) in enumerate(zip(got, formula(*args), strict=True)):
        assert out.shape == want.shape and out.dtype == want.dtype, i
        rtol = 2e-2 if out.dtype == torch.bfloat16 else 1e-5  # bf16 outputs: one rounding; f32: order only
        err = (out.float() - want.float()).abs().max().item()
        assert err <= 1e-6 + rtol * want.float().abs().max().item(), (name, i, err)
    peak = max(core["sbuf_peak_bytes"] for core in getattr(module, f"{name}_kernel").last_run.stats["cores"])
    assert 0 < peak <= module._sbuf_bytes(module._MODEL, width, 1, hb, resident, overlap, streamed) <= budget
