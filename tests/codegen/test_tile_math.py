"""The per-row math once per token tile for all heads (rowreduce/tile_math.py): the same values as the
per-head schedule, an SBUF plan that holds a tile's pending heads only where they fit, and the Selector's
chain over a column range (select_span.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from fusegen.codegen.engines import GPSIMD
from fusegen.codegen.select import Layout, Selector
from fusegen.codegen.select_span import Span
from fusegen.codegen.select_tables import EngineLoad
from fusegen.codegen.stage import Expr, Operand, scalar
from fusegen.sim import load_module

ROOT = Path(__file__).resolve().parents[2]


def _engram_inputs(tokens: int, heads: int, width: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(11)
    x = torch.randn((tokens, heads, width), generator=gen).bfloat16()
    kv = torch.randn((tokens, heads + 1, width), generator=gen).bfloat16()
    w_h, w_e = ((1 + 0.1 * torch.randn((heads, width), generator=gen)).bfloat16() for _ in range(2))
    return x, kv, w_h, w_e


def test_the_tile_schedule_gives_the_per_head_schedules_bits() -> None:
    """engram_gate over three token tiles (the last ragged) with every output saved: the per-tile chain
    (the first two tiles; the last runs per head) against the per-head schedule of the same kernel, and
    against the serial one, bit for bit; the interpreter's SBUF peak within the plan's."""
    module = load_module(ROOT / "generated" / "engram_gate" / "kernel.py", target="trn2")
    tokens, heads, width = 300, 4, 1024
    args = _engram_inputs(tokens, heads, width)
    budget = module._SBUF_BUDGET["trn2"]
    hb, resident, overlap, streamed = module._choose_rows(module._MODEL, width, heads, budget)
    assert (overlap, streamed) == (module._TILE, False)
    runs = {}
    for level in (module._TILE, module._HEADS, module._SERIAL):
        runs[level] = module.engram_gate_kernel[1](*args, 1e-20, 1e-6, hb, resident, level, False, True)
        peak = max(c["sbuf_peak_bytes"] for c in module.engram_gate_kernel.last_run.stats["cores"])
        assert 0 < peak <= module._sbuf_bytes(module._MODEL, width, heads, hb, resident, level) <= budget
    for level in (module._HEADS, module._SERIAL):
        for got, want in zip(runs[module._TILE], runs[level], strict=True):
            assert torch.equal(got, want), level


def test_the_planner_falls_back_to_overlapped_heads_where_a_tile_does_not_fit() -> None:
    """At widths where a tile's pending heads exceed SBUF, the heads still overlap one by one (the level
    before the per-tile chain), not the serial schedule."""
    module = load_module(ROOT / "generated" / "engram_gate" / "kernel.py", target="trn2")
    budget, heads = module._SBUF_BUDGET["trn2"], 4
    levels = {w: module._choose_rows(module._MODEL, w, heads, budget)[2] for w in range(1024, 8193, 512)}
    assert levels[1024] == levels[2048] == module._TILE
    wider = [w for w, level in levels.items() if level != module._TILE]
    assert wider and levels[wider[0]] == module._HEADS
    hb, resident, _, _ = module._choose_rows(module._MODEL, wider[0], heads, budget)
    model, width = module._MODEL, wider[0]
    assert module._sbuf_bytes(model, width, heads, hb, resident, module._TILE) > budget
    assert module._sbuf_bytes(model, width, heads, hb, resident, module._HEADS) <= budget


def test_a_spec_without_heads_keeps_the_per_head_schedule() -> None:
    """add_rmsnorm ([T, H], lifted to one head) has no per-tile chain: its model never plans a tile level."""
    module = load_module(ROOT / "generated" / "add_rmsnorm" / "kernel.py", target="trn2")
    assert module._MODEL.tile_heads == 0
    assert not hasattr(module, "_row_math") and not hasattr(module, "_tile_passes")
    budget = module._SBUF_BUDGET["trn2"]
    assert module._choose_rows(module._MODEL, 4096, 1, budget)[2] == module._HEADS


def _span_selector() -> tuple[Selector, Span]:
    span = Span("d_G", frozenset({"acc1", "acc2"}))
    layout = Layout(part="pt", free="d_H", free_alloc="d_H")
    return Selector(layout, prefix="e", column_engine=GPSIMD, load=EngineLoad(), span=span), span


def _column(code: str) -> Expr:
    return Expr("leaf", kind="vec", leaf=Operand("vec", code))


def test_the_selector_emits_the_chain_over_the_heads_and_one_column_where_an_operand_must_be_one() -> None:
    """rsqrt(acc1 + eps) over c0:c1 of the accumulator's [P, G] tile; sigmoid(r * acc2), whose scale must be
    one column, once per column j; the first full-width step ends the chain, and from there the head's
    column hc is read."""
    sel, span = _span_selector()
    rstd = Expr("rsqrt", (Expr("add", (_column("acc1[0:pt, 0:1]"), scalar("eps")), kind="vec"),), kind="vec")
    gate = Expr("sigmoid", (Expr("mul", (rstd, _column("acc2[0:pt, 0:1]")), kind="vec"),), kind="vec")
    sel.value(gate)
    row = Operand("tile", "x_ld[0:pt, 0:d_H]", dtype="bf16")
    sel.value(Expr("mul", (Expr("leaf", leaf=row), gate)))
    chain, epilogue = sel.lines[:span.end], sel.lines[span.end:]
    rsqrt = "nisa.activation(dst=e0[0:pt, c0:c1], op=nl.rsqrt, data=acc1_t[0:pt, c0:c1], bias=ec0[0:pt, 0:1])"
    sigmoid = ("nisa.activation(dst=e1[0:pt, j:j + 1], op=nl.sigmoid, data=e0[0:pt, j:j + 1], "
               "scale=acc2_t[0:pt, j:j + 1])")  # fmt: skip
    assert chain == [rsqrt, "for j in range(c0, c1):", "    " + sigmoid]
    alloc = "{} = nl.ndarray((_P, d_G), dtype=nl.float32, buffer=nl.sbuf)"
    assert span.allocs(span.heads) == (alloc.format("e0"), alloc.format("e1"))
    assert span.copies() == tuple(f"nisa.tensor_copy(dst={a}_t[0:pt, h:h + 1], src={a}[0:pt, 0:1], "
                                  "engine=nisa.engine.gpsimd)" for a in ("acc1", "acc2"))  # fmt: skip
    assert epilogue[0].startswith("e2 = nl.ndarray((_P, d_H)")
    assert "e1[0:pt, hc:hc + 1]" in epilogue[1] and "c0:c1" not in epilogue[1] and not span.foreign


def test_a_chain_reading_another_per_head_column_is_not_widened() -> None:
    """A column the span has no [P, G] tile for (a hoisted pass value) marks the span foreign: tile_math
    then keeps the per-head lowering."""
    sel, span = _span_selector()
    sel.value(Expr("rsqrt", (_column("k0_3[0:pt, 0:1]"),), kind="vec"))
    assert span.foreign
