"""Every FFN example plans at every published model width (planning only: fast)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fusegen.perf.widths import LAUNCHES, ROWS, WIDTHS, ffn_examples, plan_at
from fusegen.sim.targets import get_target

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ffn_examples(ROOT)


def test_the_table_covers_every_ffn_example() -> None:
    assert len(EXAMPLES) >= 10 and {"swiglu_rmsnorm", "prenorm_swiglu", "swiglu_ffn_ln"} <= {
        e.name for e in EXAMPLES
    }


@pytest.mark.parametrize(("model", "k", "i"), WIDTHS, ids=[w[0] for w in WIDTHS])
def test_every_ffn_example_plans_at_every_width(model: str, k: int, i: int) -> None:
    """trn2 (LNC 1 and 2) always plans within its budget; trn1 plans, or says which K would fit."""
    for ex in EXAMPLES:
        for rows in ROWS:
            for target, lnc in LAUNCHES:
                p = plan_at(ex, rows, k, i, target, lnc)
                where = f"{ex.name} {model} R={rows} {target} LNC={lnc}"
                if p.plan is None:
                    assert target == "trn1", f"{where}: {p.error}"
                    assert f"K={k}, I={i}" in p.error and "fits K <= " in p.error, p.error
                    continue
                assert p.plan.sbuf_bytes <= get_target(target).sbuf_usable_bytes, where
                assert p.plan.tile("S") % 128 == 0 and p.plan.tile("CI") % 128 == 0, where


#: gated FFNs at the dense models' widths: the modelled time stays within 85% of the PE roofline at
#: R=2048. Not yet: K=16384 (the accumulator and x^T leave room for 128-row super-blocks only, so the
#: weights stream too often: DMA-bound, ~59%), single-projection MLPs at K >= 7168 and small I (the
#: Vector engine's PSUM evictions at CI=128 bound them, ~75-80%); bench/widths.py reports those.
#: Since cost model II (issue 15) none of these widths meets it: the weights stream as [128, CI] K-tiles,
#: CI * 2 = 256-512 B per partition row, which the documented DMA packet rate holds to 10-21% of the DMA
#: peak (docs/performance.md, "Cost model II"); strict, so the test fails once a kernel change meets it.
DENSE = [w for w in WIDTHS if 4096 <= w[1] <= 8192 and w[2] >= 14336]


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="DMA packet-bound weight K-tiles (issue 15)")
@pytest.mark.parametrize(("model", "k", "i"), DENSE, ids=[w[0] for w in DENSE])
def test_gated_ffns_stay_near_the_pe_roofline_at_2048_rows(model: str, k: int, i: int) -> None:
    for ex in EXAMPLES:
        if ex.lowering.model.n_up != 2:  # type: ignore[attr-defined]
            continue
        for lnc in (1, 2):
            p = plan_at(ex, 2048, k, i, "trn2", lnc)
            assert p.plan is not None and p.roof.bound == "PE"
            assert p.roof.efficiency(p.plan.modeled_ns) >= 0.85, f"{ex.name} {model} LNC={lnc}"
