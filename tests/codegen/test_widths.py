"""Every FFN example plans at every published model width (planning only: fast)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fusegen.perf.widths import LAUNCHES, ROWS, WIDTHS, Example, ffn_examples, plan_at
from fusegen.sim.targets import get_target

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ffn_examples(ROOT)


def test_the_table_covers_every_ffn_example() -> None:
    assert len(EXAMPLES) >= 10 and {"swiglu_rmsnorm", "prenorm_swiglu", "swiglu_ffn_ln"} <= {
        e.name for e in EXAMPLES
    }


@pytest.mark.parametrize(("model", "k", "i"), WIDTHS, ids=[w[0] for w in WIDTHS])
def test_every_ffn_example_plans_at_every_width(model: str, k: int, i: int) -> None:
    """trn2 (LNC 1 and 2) and trn1 plan within their budgets (at K=16384 trn1 needs column blocks), each
    plan keeping at least 8 KiB of SBUF free (issue 15)."""
    for ex in EXAMPLES:
        for rows in ROWS:
            for target, lnc in LAUNCHES:
                p = plan_at(ex, rows, k, i, target, lnc)
                where = f"{ex.name} {model} R={rows} {target} LNC={lnc}"
                assert p.plan is not None, f"{where}: {p.error}"
                assert get_target(target).sbuf_usable_bytes - p.plan.sbuf_bytes >= 8 * 1024, where
                assert p.plan.tile("S") % 128 == 0 and p.plan.tile("CI") % 128 == 0, where


#: every FFN example at every width with K >= 4096: the modelled time stays within 85% of the PE
#: roofline at R=2048 on trn2 (bench/widths.py prints the table). The column-blocked kernel issues each
#: chunk's h^T writes behind the next chunk's loads and each column block's eviction behind the next
#: block's loads, so its chunks and blocks pipeline; at the DeepSeek-V3 expert width (K=7168, I=2048) its
#: h^T stays in SBUF (HT) and its down weights move a group of I-tiles per DMA (docs/performance.md,
#: "Column-blocked plans: the planner's price" and "The DeepSeek-V3 expert width").
WIDE = [pytest.param(*w, id=w[0]) for w in WIDTHS if w[1] >= 4096]


def _row_statistics(ex: Example) -> bool:
    """The column-blocked kernel's epilogue runs passes over its fp32 scratch (row statistics)."""
    return bool(ex.lowering.model.epi_cols.sweeps)  # type: ignore[attr-defined]


def _efficiencies(examples: list[Example], k: int, i: int) -> dict[str, float]:
    """Each example's worse modelled efficiency of LNC 1 and 2 at R=2048 on trn2 (PE-bound plans)."""
    worst = {}
    for ex in examples:
        for lnc in (1, 2):
            p = plan_at(ex, 2048, k, i, "trn2", lnc)
            assert p.plan is not None and p.roof.bound == "PE"
            worst[ex.name] = min(worst.get(ex.name, 1.0), p.roof.efficiency(p.plan.modeled_ns))
    return worst


@pytest.mark.parametrize(("model", "k", "i"), WIDE)
def test_ffns_stay_near_the_pe_roofline_at_2048_rows(model: str, k: int, i: int) -> None:
    plain = [ex for ex in EXAMPLES if not _row_statistics(ex)]
    assert len(plain) >= 9
    slow = {name: round(e, 3) for name, e in _efficiencies(plain, k, i).items() if e < 0.85}
    assert not slow, f"{model}: {slow}"


#: the examples whose epilogue has row statistics (LayerNorm, RMSNorm, the fp8 quantiser's amax): with
#: column blocks their passes over the fp32 scratch run after each super-block's blocks with the PE idle.
#: The evictions accumulate the first pass's statistics, the scratch is the f32 output the evictions compute
#: (x_new), and the combine tiles are one row slice wide, so h^T stays in SBUF (HT) at Mixtral-8x22B and
#: DeepSeek-V3 dense (docs/performance.md, "Row statistics after column blocks"). At the DeepSeek-V3
#: expert width (K=7168, I=2048) the passes after the last blocks stay in series: 66-80%.
STATS_SLOW = {"DeepSeek-V3 expert"}
IN_SERIES = pytest.mark.xfail(strict=True, raises=AssertionError, reason="statistics passes in series")


@pytest.mark.parametrize(
    ("model", "k", "i"),
    [pytest.param(*w, id=w[0], marks=[IN_SERIES] * (w[0] in STATS_SLOW)) for w in WIDTHS if w[1] >= 4096],
)
def test_ffns_with_row_statistics_stay_near_the_pe_roofline_at_2048_rows(model: str, k: int, i: int) -> None:
    stats = [ex for ex in EXAMPLES if _row_statistics(ex)]
    assert len(stats) >= 5
    slow = {name: round(e, 3) for name, e in _efficiencies(stats, k, i).items() if e < 0.85}
    assert not slow, f"{model}: {slow}"
