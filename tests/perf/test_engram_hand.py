"""The hand-scheduled engram_gate experiment (bench/engram_hand_kernel.py) computes the Engram gate: checked
on the interpreter against a float64 formula written from the spec's math, with a ragged token tile."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch

from fusegen import sim

ROOT = Path(__file__).resolve().parents[2]


def _bench() -> ModuleType:
    """bench/engram_hand.py as a module (its float64 formula)."""
    path = ROOT / "bench" / "engram_hand.py"
    spec = importlib.util.spec_from_file_location("fusegen_bench_engram_hand", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: a ragged tile on two cores; one tile; four tiles on one core (epilogues interleaved with passes)
@pytest.mark.parametrize(("rows", "heads", "lnc"), [(300, 2, 2), (128, 3, 1), (512, 2, 1)])
def test_hand_kernel_matches_the_formula(rows: int, heads: int, lnc: int) -> None:
    """Every output within one bf16 ulp of the exact value, plus 2^-14 |v| where x + g*v cancels (the PE's
    g_hi + g_lo carries 16 bits of g; the generated kernel's fp32 g*v + x also errs there)."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn((rows, heads, 1024), generator=gen).bfloat16()
    kv = torch.randn((rows, heads + 1, 1024), generator=gen).bfloat16()
    w_h, w_e = ((1 + 0.1 * torch.randn((heads, 1024), generator=gen)).bfloat16() for _ in range(2))
    hand = sim.load_module(ROOT / "bench" / "engram_hand_kernel.py", target="trn2")
    out = hand.engram_gate_hand[lnc](x, kv, w_h, w_e, 1e-20, 1e-6, 1, 512).double()
    want = _bench().formula(x, kv, w_h, w_e)
    ulp = torch.exp2(torch.floor(torch.log2(want.abs().clamp_min(2.0**-100))) - 7)
    v = kv[:, heads:].double()
    assert ((out - want).abs() <= ulp + 2.0**-14 * v.abs()).all()
