"""The heads left after a row kernel's loop (bench/fuzz.py --oracle, seed 3): their epilogues ran while the
stores of the two heads before them were still queued, three heads' epilogue tiles in SBUF where the plan
holds two, so a plan near the budget overflowed it on the interpreter."""

from __future__ import annotations

from pathlib import Path

import torch

from fusegen.cli import main
from fusegen.sim import load_module

SPEC = """kernel tail
dim T, G, H
input x: bf16[T, G, H]
param eps = 0.1
output o0: f32[T, G, H]
output o1: f32[T, G, H]
output o2: f32[T, G, H]
s1 = rmsnorm(x, eps)
o0 = x * 2.0
o1 = s1
o2 = relu(s1)
check T=3 G=4 H=7168
"""


def test_the_last_heads_epilogues_stay_within_the_plans_sbuf(tmp_path: Path) -> None:
    """Four heads of 7168 f32 columns times three outputs: the plan (98.9% of SBUF) holds two heads'
    epilogue tiles; the kernel's outputs against torch's formulas, its SBUF peak within the plan's."""
    spec = tmp_path / "tail.spec"
    spec.write_text(SPEC)
    assert main(["build", "--out", str(tmp_path / "out"), str(spec)]) == 0
    module = load_module(tmp_path / "out" / "tail" / "kernel.py", target="trn2")
    x = torch.randn((3, 4, 7168), generator=torch.Generator().manual_seed(3)).bfloat16()
    o0, o1, o2 = module.tail(x, lnc=2)
    xf = x.float()
    norm = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + 0.1)
    assert torch.equal(o0, xf * 2)
    torch.testing.assert_close(o1, norm, rtol=2e-6, atol=1e-6)
    torch.testing.assert_close(o2, norm.clamp(min=0), rtol=2e-6, atol=1e-6)
    width, heads, budget = 7168, 4, module._SBUF_BUDGET["trn2"]
    hb, resident, overlap, streamed = module._choose_rows(module._MODEL, width, heads, budget)
    planned = module._sbuf_bytes(module._MODEL, width, heads, hb, resident, overlap, streamed)
    peak = max(c["sbuf_peak_bytes"] for c in module.tail_kernel.last_run.stats["cores"])
    assert overlap and planned > 0.95 * budget and peak <= planned
