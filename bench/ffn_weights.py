"""Weight bytes streamed and SBUF used: the generated swiglu_ffn against the user's hand-written seed kernel.

Both run on fusegen.sim at K=1280, I=3456, R=2048, LNC=2, trn2, each with its own tile plan; the bytes
come from the interpreter's instruction trace (HBM reads of the three weight tensors by DMA), the SBUF
figure from its liveness analysis (peak bytes per partition). Goal: generated <= seed on weight bytes,
and within the same SBUF budget. Run: .venv/bin/python bench/ffn_weights.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from fusegen import sim

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT.parent / "shared" / "seeds" / "swiglu_stream_kernel.py"
K, I, R, LNC = 1280, 3456, 2048, 2
WEIGHT_ARGS = (1, 3, 5)  # w1t, wgt, w2t in both kernels' argument order


def inputs() -> list[torch.Tensor]:
    """x, w1t, b1, wgt, bg, w2t, b2 in the seed op's layout."""
    gen = torch.Generator().manual_seed(0)
    w = lambda *s: (torch.randn(*s, generator=gen) / s[0] ** 0.5).bfloat16()  # noqa: E731
    return [
        torch.randn(R, K, generator=gen).bfloat16(),
        w(K, I),
        torch.randn(I, generator=gen),
        w(K, I),
        torch.randn(I, generator=gen),
        w(I, K),
        torch.randn(K, generator=gen),
    ]


def weight_bytes(result: sim.RunResult) -> int:
    """HBM bytes DMA'd from the weight arguments; arguments are allocated first, in order, so the
    k-th smallest HBM allocation id read is argument k."""
    reads = [
        (op[1], rec) for rec in result.trace for op in rec.operands if op[0] == "r" and op[2] == "shared_hbm"
    ]
    arg_ids = sorted({alloc for alloc, _ in reads})
    weights = {arg_ids[i] for i in WEIGHT_ARGS}
    return sum(rec.hbm_read for alloc, rec in reads if alloc in weights and rec.engine == "dma")


def sbuf_peak(result: sim.RunResult) -> int:
    """Peak live SBUF bytes per partition over the cores."""
    return max(core["sbuf_peak_bytes"] for core in result.stats["cores"])


def run_generated(args: list[torch.Tensor]) -> tuple[sim.RunResult, tuple[int, int]]:
    """The generated kernel with the plan its host function would choose."""
    module = sim.load_module(ROOT / "generated" / "swiglu_ffn" / "kernel.py", target="trn2")
    plan = module._choose(module._MODEL, module._MACHINES["trn2"], R, K, I, LNC)
    x, w1t, b1, wgt, bg, w2t, b2 = args
    tiles = (plan.s, plan.ci, plan.split, plan.kc)
    packed = (x, w1t, module._columns(b1, bg), wgt, w2t, b2, *tiles)
    return sim.run(module.swiglu_ffn_kernel, *packed, grid=LNC), (plan.s, plan.ci)


def run_seed(args: list[torch.Tensor]) -> tuple[sim.RunResult, tuple[int, int]]:
    """The seed kernel with its own plan()."""
    os.environ["NEURON_LOGICAL_NC_CONFIG"] = str(LNC)
    module = sim.load_module(SEED, target="trn2")
    s, ci, _ = module.plan(K, I, R // LNC)
    x, w1t, b1, wgt, bg, w2t, b2 = args
    pack = lambda b: b.reshape(-1, 128).t().contiguous()  # noqa: E731
    result = sim.run(module.swiglu_stream_kernel, x, w1t, pack(b1), wgt, pack(bg), w2t, b2, s, ci, grid=LNC)
    return result, (s, ci)


def main() -> int:
    """Print both kernels' figures and the ratios."""
    if not SEED.exists():
        print(f"seed kernel not found at ../shared/seeds/{SEED.name}; nothing to compare")
        return 1
    args = inputs()
    gen, gen_plan = run_generated(args)
    seed, seed_plan = run_seed(args)
    total = 3 * K * I * 2
    print(f"swiglu FFN K={K} I={I} R={R} LNC={LNC} trn2; weights are {total:,} B")
    for label, result, (s, ci) in (("generated", gen, gen_plan), ("seed", seed, seed_plan)):
        wb = weight_bytes(result)
        print(
            f"  {label:<9} S={s:<5} CI={ci:<5} weight bytes streamed {wb:>12,} ({wb / total:.2f}x)"
            f"  SBUF peak {sbuf_peak(result):>7,} B/partition  {len(result.trace):>6} instructions"
        )
    print(
        f"ratio generated/seed: weight bytes {weight_bytes(gen) / weight_bytes(seed):.3f}, "
        f"SBUF peak {sbuf_peak(gen) / sbuf_peak(seed):.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
