"""Row kernels at real model widths: norms up to H=16384 and softmax over 256k vocabularies plan on both
targets, and rows too wide for SBUF run streamed on the interpreter, matching torch's own functions."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fusegen.cli import main
from fusegen.codegen.plan import TilePlan
from fusegen.perf.row_widths import VOCABS, RowExample, dims_at, plan_rows, row_examples, shapes
from fusegen.perf.widths import LAUNCHES, ROWS
from fusegen.sim import load_module
from fusegen.sim.targets import get_target

ROOT = Path(__file__).resolve().parents[2]
EPS_RMS, EPS_LN, SCALE = 1e-6, 1e-5, 0.125
EXAMPLES = row_examples(ROOT)


def test_the_table_covers_every_row_example() -> None:
    names = {e.name for e in EXAMPLES}
    assert {"add_rmsnorm", "layernorm", "qk_norm", "scaled_softmax", "engram_gate_hc8"} <= names


def _streamed(plan: TilePlan) -> bool:
    return dict(plan.summary)["row inputs"].startswith("streamed")


@pytest.mark.parametrize("ex", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_every_row_example_plans_at_every_width(ex: RowExample) -> None:
    """Every width of the table at R = 1 ... 65536 (no spec bounds its rows) on trn2 LNC 1 and 2 and trn1,
    within the budget, in 128-multiple reduction chunks that cover the width."""
    for label, width, heads in shapes(ex):
        for rows in ROWS:
            for target, lnc in LAUNCHES:
                p = plan_rows(ex, dims_at(ex, rows, width, heads), target, lnc)
                where = f"{ex.name} {label} R={rows} {target} LNC={lnc}"
                assert p.plan is not None, f"{where}: {p.error}"
                assert p.plan.sbuf_bytes <= p.plan.sbuf_budget == get_target(target).sbuf_usable_bytes, where
                hb = p.plan.tile("HB")
                assert hb % 128 == 0 and hb * -(-width // hb) >= width, where


@pytest.mark.parametrize("vocab", [v for _, v in VOCABS])
def test_softmax_streams_vocabularies_reading_the_logits_three_times(vocab: int) -> None:
    """Vocabularies from 128k stream; a 32k one fits SBUF whole (its epilogue holds only the bf16 output:
    the normalised exponential is one activation), so its logits are read once."""
    ex = next(e for e in EXAMPLES if e.name == "scaled_softmax")
    plan = plan_rows(ex, {"T": 2048, "H": vocab}, "trn2", 2).plan
    assert plan is not None and _streamed(plan) == (vocab > 32000)
    # max, then the sum of exponentials, then the normalised row: three reads of the logits, one write
    reads = 3 if vocab > 32000 else 1
    assert dict(plan.hbm_bytes)["per token"] == reads * 2 * vocab + 2 * vocab + 4


def test_the_resident_plan_stays_where_rows_fit() -> None:
    ex = next(e for e in EXAMPLES if e.name == "add_rmsnorm")
    plan = plan_rows(ex, {"T": 4096, "H": 4096}, "trn2", 2).plan
    assert plan is not None and not _streamed(plan)
    assert dict(plan.hbm_bytes)["per token"] == dict(plan.hbm_bytes)["minimum per token"]


#: streamed rows keep one head's fp32 prepared weights width-long: 4 B per column for the Engram gate's
#: w_h * w_e, so nothing fits at H=65536 on trn1 (that weight alone is 262,144 B > 180,224 B; the rest:
#: 128-column chunks, per-row columns and the Tensor engine's 768-byte identity)
LIMIT = ["T=8", "HC=2", "H=65536"]
LIMIT_MESSAGE = (
    r"width 65536 with 2 head\(s\) needs 266,?728 B/partition of SBUF even with rows streamed from HBM in "
    r"128-column chunks .*the budget is 180,?224 B"
)


def test_the_limit_is_one_heads_prepared_weights() -> None:
    ex = next(e for e in EXAMPLES if e.name == "engram_gate")
    at_limit = plan_rows(ex, {"T": 8, "HC": 2, "H": 65536}, "trn1", 1)
    said = LIMIT_MESSAGE + r", which fits width <= \d+ at 2 head\(s\) on trn1"
    assert at_limit.plan is None and re.search(said, at_limit.error), at_limit.error
    softmax = next(e for e in EXAMPLES if e.name == "scaled_softmax")
    plan = plan_rows(softmax, {"T": 8, "H": 1 << 20}, "trn1", 1).plan
    assert plan is not None and _streamed(plan)  # no weights: no limit


@pytest.mark.parametrize("name", ["add_rmsnorm", "t5_rmsnorm", "layernorm"])
@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_the_refusal_names_the_widest_width_that_fits(name: str, target: str) -> None:
    """A weighted norm past its limit (add_rmsnorm at H=53248 on trn2) said what it needs and the budget,
    not how far to shrink; the width it names now plans, and one column more does not."""
    ex = next(e for e in EXAMPLES if e.name == name)
    refused = plan_rows(ex, {"T": 1, "H": 1 << 17}, target, 1)
    found = re.search(rf"B, which fits width <= (\d+) at 1 head\(s\) on {target}$", refused.error)
    assert refused.plan is None and found, refused.error
    widest = int(found[1])
    assert plan_rows(ex, {"T": 1, "H": widest}, target, 1).plan is not None
    assert plan_rows(ex, {"T": 1, "H": widest + 1}, target, 1).plan is None


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_a_shape_past_the_limit_is_an_error_at_the_dim_line_with_a_hint_that_helps(
    target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--shape's plan error stood at the spec's first check line, which it has nothing to do with, and its
    hint sent a trn2 user to another --target (trn1, whose SBUF is smaller)."""
    spec = str(ROOT / "examples" / "add_rmsnorm.spec")
    assert main(["check", spec, "--target", target, "--shape", "T=1", "H=53248"]) == 2
    err = capsys.readouterr().err
    assert f"{spec}:6:5: error: --shape H=53248 T=1: no tile plan fits: width 53248" in err, err
    assert "    dim T, H\n        ^~~~\n" in err
    hint = {"trn1": "shrink this shape, or build for --target trn2 (212984 B of SBUF per partition)",
            "trn2": "shrink this shape"}[target]  # fmt: skip
    assert f"  hint: {hint}\n" in err


@pytest.mark.parametrize("command", ["check", "explain"])
def test_the_cli_states_the_limit_without_a_traceback(command: str, capsys: pytest.CaptureFixture[str]
                                                      ) -> None:  # fmt: skip
    spec = str(ROOT / "examples" / "engram_gate.spec")
    code = main([command, spec, "--target", "trn1", "--shape", *LIMIT])
    err = capsys.readouterr().err
    assert code == 2 and re.search(LIMIT_MESSAGE, err), err
    assert "Traceback" not in err and "fusegen bug" not in err


def test_the_host_function_states_the_limit() -> None:
    module = load_module(ROOT / "generated" / "engram_gate" / "kernel.py", target="trn1")
    x, kv, w = torch.zeros(1, 2, 65536), torch.zeros(1, 3, 65536), torch.zeros(2, 65536)
    with pytest.raises(ValueError, match=LIMIT_MESSAGE):
        module.engram_gate(x.bfloat16(), kv.bfloat16(), w.bfloat16(), w.bfloat16(), lnc=1, target="trn1")


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


def test_overlapped_heads_with_rebuilt_weights_fit_their_budget() -> None:
    """qk_norm at D=16384 rebuilds its weights per head (four heads' would not fit) and overlaps heads: the
    pending head keeps its prepared weights, so the budget counts two copies (it once counted one, and
    the interpreter's peak went 49 KB past trn2's SBUF)."""
    module = load_module(ROOT / "generated" / "qk_norm" / "kernel.py", target="trn2")
    budget, width = module._SBUF_BUDGET["trn2"], 16384
    hb, resident, overlap, streamed = module._choose_rows(module._MODEL, width, 4, budget)
    assert not resident and not streamed
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, width, generator=gen).bfloat16()
    w = (1 + 0.1 * torch.randn(width, generator=gen)).bfloat16()
    got = module.qk_norm(q, w, lnc=1, target="trn2")
    want = F.rms_norm(q.float(), (width,), w.float(), EPS_RMS)
    assert (got.float() - want).abs().max().item() <= 2e-2 * want.abs().max().item()
    peak = max(core["sbuf_peak_bytes"] for core in module.qk_norm_kernel.last_run.stats["cores"])
    assert 0 < peak <= module._sbuf_bytes(module._MODEL, width, 4, hb, resident, overlap, streamed) <= budget
