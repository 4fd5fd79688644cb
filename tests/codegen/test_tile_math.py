"""The per-row math once per token tile for all heads (rowreduce/tile_math.py): the same values as the
per-head schedule, and an SBUF plan that holds a tile's pending heads only where they fit."""

from __future__ import annotations

from pathlib import Path

import torch

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
