"""fusegen.sim speed: per-instruction overhead, and the seed SwiGLU kernel versus eager torch fp32.

Run: .venv/bin/python bench/sim_bench.py   (not a test; prints medians of interleaved repeats)
Eager torch runs with its default thread count; the interpreter, at LNC=2, overlaps one instance's
GEMMs with the other's Python work, so both use the machine's cores (docs/sim.md, Performance).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

import fusegen.sim as sim

SEED = Path(__file__).resolve().parents[1] / ".." / "shared" / "seeds" / "swiglu_stream_kernel.py"
REPEATS = 7

with sim.installed():
    import nki
    import nki.isa as nisa
    import nki.language as nl


@nki.jit
def tiny_ops(x, n):
    """n small Vector-engine instructions on a [128, 4] tile."""
    a = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x)
    for _ in range(n):
        nisa.tensor_tensor(dst=a, data1=a, data2=a, op=nl.maximum)
    out = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=a)
    return out


def seconds(fn: Callable[[], object]) -> float:
    """Wall time of one call."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def per_instruction_us(n: int = 2000) -> float:
    """Median microseconds per small instruction."""
    x = torch.randn(128, 4)
    tiny_ops(x, 10)
    return statistics.median(seconds(lambda: tiny_ops(x, n)) for _ in range(REPEATS)) / (n + 2) * 1e6


def swiglu_times(R: int = 512, K: int = 1280, I: int = 3456, lnc: int = 2) -> tuple[dict[str, float], int]:
    """Median seconds of the seed kernel ('sim') and the same math in eager fp32 ('torch' with all
    threads, 'torch1' single-threaded), and the kernel's instruction count."""
    os.environ["NEURON_LOGICAL_NC_CONFIG"] = str(lnc)
    seed = sim.load_module(SEED)
    torch.manual_seed(0)
    x = torch.randn(R, K).bfloat16()
    w1t, wgt = ((torch.randn(K, I) / K**0.5).bfloat16() for _ in range(2))
    w2t = (torch.randn(I, K) / I**0.5).bfloat16()
    b1, bg, b2 = torch.randn(I) * 0.1, torch.randn(I) * 0.1, torch.randn(K) * 0.1
    S, CI, _ = seed.plan(K, I, R // lnc)
    packed = (b1.reshape(-1, 128).t().contiguous(), bg.reshape(-1, 128).t().contiguous())
    args = (x, w1t, packed[0], wgt, packed[1], w2t, b2, S, CI)

    def run_sim() -> None:
        seed.swiglu_stream_kernel[lnc](*args)

    def run_torch() -> None:
        xf = x.float()
        (F.silu(xf @ w1t.float() + b1) * (xf @ wgt.float() + bg)) @ w2t.float() + b2

    def run_torch_1thread() -> None:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        run_torch()
        torch.set_num_threads(threads)

    runs: dict[str, list[float]] = {"sim": [], "torch": [], "torch1": []}
    fns = {"sim": run_sim, "torch": run_torch, "torch1": run_torch_1thread}
    for fn in fns.values():
        fn()  # warm-up (first BLAS calls are slow)
    for _ in range(REPEATS):  # interleaved, so machine-load drift hits all alike
        for name, fn in fns.items():
            runs[name].append(seconds(fn))
    instructions = len(seed.swiglu_stream_kernel.last_run.trace)
    return {name: statistics.median(times) for name, times in runs.items()}, instructions


def main() -> None:
    """Print the figures."""
    print(f"per-instruction overhead: {per_instruction_us():.1f} us (tensor_tensor on [128, 4])")
    if not SEED.exists():
        print(f"seed kernel not found at {SEED}; skipping the SwiGLU comparison")
        return
    times, count = swiglu_times()
    sim_s, torch_s = times["sim"], times["torch"]
    print(
        f"swiglu_stream_kernel K=1280 I=3456 R=512 LNC=2: sim {sim_s * 1e3:.0f} ms ({count} instructions), "
        f"eager torch fp32 {torch_s * 1e3:.0f} ms ({torch.get_num_threads()} threads), "
        f"ratio {sim_s / torch_s:.2f}x (goal <= 3x)"
    )
    print(
        f"  for reference: eager torch fp32 single-threaded {times['torch1'] * 1e3:.0f} ms, "
        f"ratio {sim_s / times['torch1']:.2f}x"
    )


if __name__ == "__main__":
    main()
