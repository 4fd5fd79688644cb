"""The instruction figures a Selector hands the budget models: full-width passes per engine (nki.md §6)."""

from __future__ import annotations

import pytest

from fusegen.codegen.rowstage import block_selector
from fusegen.codegen.stage import Expr, Operand


def _leaf(code: str, memory: str) -> Expr:
    return Expr("leaf", kind="tile", leaf=Operand("tile", code, memory=memory))


@pytest.mark.parametrize(("memory", "passes"), [("sbuf", 2), ("psum", 1)])
def test_tensor_tensor_passes_follow_where_its_input_is(memory: str, passes: int) -> None:
    """`tensor_tensor` costs 2N Vector cycles, N with one input in PSUM (nki.md §6, the trace model's
    perf/cost.py): a PSUM eviction's add counts one pass, an add of two SBUF tiles two."""
    sel = block_selector("t")
    total = Expr("add", (_leaf("a[0:pr, 0:nb]", memory), _leaf("b[0:pr, 0:nb]", "sbuf")), kind="tile")
    sel.value(total)
    assert any(line.startswith("nisa.tensor_tensor(") for line in sel.lines)
    assert (sel.passes("dve"), sel.passes("act")) == (passes, 0)
    assert sel.passes("dve", start=len(sel.calls)) == 0  # nothing from a call number past the last
