"""fusegen.sim speed: per-instruction overhead, and two SwiGLU kernels versus eager torch fp32.

Run: .venv/bin/python bench/sim_bench.py   (not a test; prints the best of interleaved repeats)
Kernels: generated/swiglu_ffn_ln and the seed kernel, both at R=512 K=1280 LNC=2, against the same math
in eager torch fp32 (goal: at most 2x). The generated kernel's host function runs inside its
`cached_layouts()` scope, as an inference loop over unchanged weights would: its up weights are laid out
by the first call, not on every call (the seed kernel takes them as given). Eager torch runs with its
default thread count; the interpreter, at LNC=2, overlaps one instance's GEMMs with the other's Python
work, so both use the machine's cores (docs/sim.md, Performance).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F

import fusegen.sim as sim

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / ".." / "shared" / "seeds" / "swiglu_stream_kernel.py"
GENERATED = ROOT / "generated" / "swiglu_ffn_ln" / "kernel.py"
REPEATS = 5
GOAL = 2.0  # issue 15: the interpreter within 2x of eager torch fp32
#: (run on the interpreter, the same math in eager torch, instruction count of the last run)
Case = tuple[Callable[[], object], Callable[[], object], Callable[[], int]]

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


def interleaved(fns: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Best-of-REPEATS seconds per function, repeats interleaved so machine-load drift hits all alike;
    also the least process CPU seconds per function, as "<name> cpu" (less sensitive to machine load)."""
    runs: dict[str, list[float]] = {name: [] for name in fns}
    cpu: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()  # warm-up (first BLAS calls are slow)
    for _ in range(REPEATS):
        for name, fn in fns.items():
            start = time.process_time()
            runs[name].append(seconds(fn))
            cpu[name].append(time.process_time() - start)
    return {name: min(times) for name, times in runs.items()} | {f"{n} cpu": min(t) for n, t in cpu.items()}


def eager_swiglu(x: torch.Tensor, w1t: torch.Tensor, b1: torch.Tensor, wgt: torch.Tensor, bg: torch.Tensor,
                 w2t: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """The SwiGLU FFN's up projections and combine in eager fp32, rounded to bf16 as the kernels store it."""
    xf = x.float()
    return (F.silu(xf @ w1t.float() + b1) * (xf @ wgt.float() + bg)).bfloat16()


def weights(R: int, K: int, I: int) -> tuple[torch.Tensor, ...]:
    """Seeded bf16 x and weights (scaled by 1/sqrt(fan-in)), fp32 biases."""
    torch.manual_seed(0)
    x = torch.randn(R, K).bfloat16()
    w1t, wgt = ((torch.randn(K, I) / K**0.5).bfloat16() for _ in range(2))
    w2t = (torch.randn(I, K) / I**0.5).bfloat16()
    return x, w1t, torch.randn(I) * 0.1, wgt, torch.randn(I) * 0.1, w2t, torch.randn(K) * 0.1


def seed_case(R: int, K: int, I: int, lnc: int) -> Case:
    """The seed kernel on the interpreter, the same math in eager fp32, and its instruction count."""
    seed = sim.load_module(SEED)
    x, w1t, b1, wgt, bg, w2t, b2 = weights(R, K, I)
    S, CI, _ = seed.plan(K, I, R // lnc)
    packed = (b1.reshape(-1, 128).t().contiguous(), bg.reshape(-1, 128).t().contiguous())
    args = (x, w1t, packed[0], wgt, packed[1], w2t, b2, S, CI)
    kernel = seed.swiglu_stream_kernel

    def run_torch() -> object:
        return eager_swiglu(x, w1t, b1, wgt, bg, w2t).float() @ w2t.float() + b2

    return lambda: kernel[lnc](*args), run_torch, lambda: len(kernel.last_run.trace)


def generated_case(module: ModuleType, R: int, K: int, I: int, lnc: int) -> Case:
    """generated/swiglu_ffn_ln through its host function (argument checks included), the same math in
    eager fp32 (residual add, LayerNorm, bf16 output), and the kernel's instruction count."""
    x, w1t, b1, wgt, bg, w2t, b2 = weights(R, K, I)
    a = torch.randn(R, K)

    def run_torch() -> object:
        x_new = eager_swiglu(x, w1t, b1, wgt, bg, w2t).float() @ w2t.float() + b2 + a
        return x_new, F.layer_norm(x_new, (K,), eps=1e-6).bfloat16()

    return (lambda: module.swiglu_ffn_ln(x, w1t, b1, wgt, bg, w2t, b2, a, lnc=lnc), run_torch,
            lambda: len(module.swiglu_ffn_ln_kernel.last_run.trace))  # fmt: skip


def compare(label: str, case: Case) -> float:
    """Print sim vs eager torch fp32 (default threads; single-threaded for reference); returns the ratio."""
    run_sim, run_torch, count = case

    def run_torch_1thread() -> None:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        run_torch()
        torch.set_num_threads(threads)

    times = interleaved({"sim": run_sim, "torch": run_torch, "torch1": run_torch_1thread})
    ratio = times["sim"] / times["torch"]
    verdict = "met" if ratio <= GOAL else "NOT met"
    if busy():  # eager torch's threads wait for each other when cores are taken: the ratio flatters the sim
        verdict += ", but not conclusive: the machine is loaded"
    elif times["torch"] > times["torch1"]:  # on free cores two threads never lose to one: one core is taken
        verdict += ", but not conclusive: eager torch on all threads was slower than on one (a core is busy)"
    print(
        f"{label}: sim {times['sim'] * 1e3:.0f} ms ({count()} instructions), eager torch fp32 "
        f"{times['torch'] * 1e3:.0f} ms ({torch.get_num_threads()} threads), ratio {ratio:.2f}x "
        f"(goal <= {GOAL:g}x: {verdict})"
    )
    print(f"  for reference: eager torch fp32 single-threaded {times['torch1'] * 1e3:.0f} ms, "
          f"ratio {times['sim'] / times['torch1']:.2f}x")  # fmt: skip
    cpu_ms = {name: f"{times[f'{name} cpu'] * 1e3:.0f} ms" for name in ("sim", "torch", "torch1")}
    cpu_ratios = [times["sim cpu"] / times[f"{name} cpu"] for name in ("torch", "torch1")]
    print(f"  CPU time per run (both cores): sim {cpu_ms['sim']}, eager torch fp32 {cpu_ms['torch']} "
          f"(2 threads), {cpu_ms['torch1']} (1 thread); CPU ratios {cpu_ratios[0]:.2f}x, "
          f"{cpu_ratios[1]:.2f}x "
          f"(eager torch's CPU on 1 thread is its work alone: loaded, its 2 threads spin while waiting); "
          f"load average now {load_average()}")  # fmt: skip
    return ratio


def load_average() -> str:
    """The 1-, 5- and 15-minute load averages."""
    return ", ".join(f"{v:.1f}" for v in os.getloadavg())


def busy() -> bool:
    """True when other processes keep the cores busy (1-minute load average above the core count)."""
    return os.getloadavg()[0] > (os.cpu_count() or 1)


def main() -> None:
    """Print the figures."""
    print(f"per-instruction overhead: {per_instruction_us():.1f} us (tensor_tensor on [128, 4])")
    cores = os.cpu_count()
    print(f"best of {REPEATS} interleaved runs each; LNC=2; load average {load_average()} on {cores} cores")
    os.environ["NEURON_LOGICAL_NC_CONFIG"] = "2"
    module = sim.load_module(GENERATED)
    with module.swiglu_ffn_ln.cached_layouts():  # steady-state inference: weights laid out by the first call
        compare("generated swiglu_ffn_ln R=512 K=1280 I=3416", generated_case(module, 512, 1280, 3416, 2))
    if not SEED.exists():
        print(f"seed kernel not found at {SEED}; skipping it")
        return
    compare("seed swiglu_stream_kernel R=512 K=1280 I=3456", seed_case(512, 1280, 3456, 2))


if __name__ == "__main__":
    main()
