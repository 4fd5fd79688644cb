"""Engram gate: HBM bytes moved per token, from the interpreter's trace, against the minimum.

The minimum reads every input byte once and writes every output once: with save at HC = 4 that is
x (8H) + kv (10H) + out (8H) + four fp32 [HC] saved tensors = 26 H + 64 bytes per token. The kernel also
reads w_h and w_e once per core (the fp32 fused weight stays resident in SBUF).

Run: .venv/bin/python bench/engram_bytes.py [T HC H [LNC]]   (default 4001 4 7168 2: ~15 s)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from fusegen.sim import load_module

KERNEL = Path(__file__).resolve().parents[1] / "generated" / "engram_gate" / "kernel.py"
GOAL = 1.05


def minimum_bytes(heads: int, width: int) -> int:
    """Bytes per token with each input read once and each output (saved tensors included) written once."""
    return 2 * heads * width + 2 * (heads + 1) * width + 2 * heads * width + 4 * 4 * heads


def main(tokens: int, heads: int, width: int, lnc: int) -> int:
    """Run the gate once with save=True; print the trace's HBM bytes per token and the ratio."""
    module = load_module(KERNEL)
    gen = torch.Generator().manual_seed(0)
    shapes = ((tokens, heads, width), (tokens, heads + 1, width), (heads, width), (heads, width))
    args = [torch.randn(s, generator=gen).bfloat16() for s in shapes]
    start = time.perf_counter()
    module.engram_gate(*args, save=True, lnc=lnc)
    seconds = time.perf_counter() - start
    dma = module.engram_gate_kernel.last_run.trace.totals()["dma"]
    moved = (dma["hbm_read"] + dma["hbm_write"]) / tokens
    minimum = minimum_bytes(heads, width)
    print(f"engram_gate T={tokens} HC={heads} H={width} lnc={lnc} save=True ({seconds:.1f} s interpreted)")
    print(f"  HBM read {dma['hbm_read']:,} B, written {dma['hbm_write']:,} B")
    ratio = moved / minimum
    print(
        f"  per token: {moved:,.1f} B moved, minimum {minimum:,} B (26*H + 16*HC): {ratio:.4f}x, goal {GOAL}x"
    )
    return 0 if moved <= GOAL * minimum else 1


if __name__ == "__main__":
    dims = [int(a) for a in sys.argv[1:]] or [4001, 4, 7168]
    sys.exit(main(*dims[:3], *(dims[3:] or [2])))
