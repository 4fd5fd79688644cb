"""The FFN planner's closed-form price of a plan against the trace model's time for the same plan.

For each (example, K, I, R, LNC, plan) the generated kernel runs on fusegen.sim with that plan forced, and
fusegen.perf schedules its trace (the model bench/ffn_perf.py uses); beside it, the planner's closed-form
`cost` of the plan, and the ratio; "engines" is that closed form without what the kernel's program order
puts in series (`Cost.chain`: the fill, the chunks' and column blocks' chains, the drain): the busiest
engine alone, as the model priced every plan before issue 15's fix. Plans: the one the planner picks and
the best of the other structure (column-blocked KC > 0 against the SBUF accumulator KC = 0). trn2.
Run: .venv/bin/python bench/plan_price.py [--shapes NAME,...]   (seconds for the small shapes, minutes for
the Llama and DeepSeek ones)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from fusegen import sim
from fusegen.perf.capture import launches
from fusegen.perf.schedule import Schedule, schedule

ROOT = Path(__file__).resolve().parents[1]
TARGET = "trn2"
#: name: (example, K, I, R, LNC); EXTRA: plans traced besides (S, CI, SPLIT, KC, G)
#: swiglu_ffn's plan and the column blocks with h^T through HBM at llama-256 (issue 15); split 2 beside
#: split 3 at seed-256; the old model's column-blocked picks at cross and llama-2048; the column-blocked
#: pick at dsv3-expert-2048 before h^T was held (HT)
EXTRA = {
    "llama-256": [(256, 256, 1, 0, 0), (128, 128, 0, 2048, 0)],
    "seed-256": [(256, 896, 2, 0, 0)],
    "cross": [(256, 128, 0, 1024, 0)],
    "llama-2048": [(512, 128, 0, 512, 0)],
    "dsv3-expert-2048": [(256, 128, 0, 1024, 20)],
}
SHAPES = {
    "small": ("swiglu_fp8", 1536, 1024, 128, 2),
    "cross": ("swiglu_fp8", 1024, 256, 256, 1),
    "seed-256": ("swiglu_ffn", 1280, 3416, 256, 2),
    "seed-2048": ("swiglu_ffn", 1280, 3416, 2048, 2),
    "llama-64": ("swiglu_fp8", 4096, 14336, 64, 2),
    "llama-256": ("swiglu_fp8", 4096, 14336, 256, 2),
    "llama-2048": ("swiglu_ffn", 4096, 14336, 2048, 2),
    "dsv3-expert-256": ("swiglu_fp8", 7168, 2048, 256, 2),
    "dsv3-expert-2048": ("swiglu_ffn", 7168, 2048, 2048, 2),
    # an epilogue with row statistics (LayerNorm) after column blocks (docs/performance.md, "Row statistics
    # after column blocks")
    "ln-expert-2048": ("swiglu_ffn_ln", 7168, 2048, 2048, 2),
    "ln-mixtral-2048": ("swiglu_ffn_ln", 6144, 16384, 2048, 2),
}


def inputs(example: str, r: int, k: int, i: int) -> list[torch.Tensor]:
    """Random inputs of swiglu_ffn, swiglu_ffn_ln (and its residual) or swiglu_fp8 (weights cast to e5m2, unit
    scales)."""
    gen = torch.Generator().manual_seed(r + k + i)
    x = (torch.randn(r, k, generator=gen) * 0.1).bfloat16()
    w = lambda *shape: (torch.randn(*shape, generator=gen) * 0.02)  # noqa: E731
    if example in ("swiglu_ffn", "swiglu_ffn_ln"):
        ffn = [x, w(k, i).bfloat16(), w(i), w(k, i).bfloat16(), w(i), w(i, k).bfloat16(), w(k)]
        if example == "swiglu_ffn_ln":  # its residual
            ffn.append(torch.randn(r, k, generator=gen))
        return ffn
    fp8 = torch.float8_e5m2
    ones = torch.ones
    return [x, w(k, i).to(fp8), ones(i), w(i), w(k, i).to(fp8), ones(i), w(i), w(i, k).to(fp8), ones(k), w(k)]


def traced(module: object, example: str, r: int, k: int, i: int, lnc: int, plan: object) -> Schedule:
    """The trace model's time of `plan`: the host function run with its plan forced."""
    chosen = module._choose  # type: ignore[attr-defined]
    module._choose = lambda *_: plan  # type: ignore[attr-defined]
    try:
        with launches(module) as found:  # type: ignore[arg-type]
            getattr(module, example)(*inputs(example, r, k, i), lnc=lnc, target=TARGET)
    finally:
        module._choose = chosen  # type: ignore[attr-defined]
    return schedule(found[0].result.trace, sim.get_target(TARGET))


def plans(module: object, r: int, k: int, i: int, lnc: int) -> list[object]:
    """The planner's pick, then the best plan of the other structure (by the closed form)."""
    m, mach = module._MODEL, module._MACHINES[TARGET]  # type: ignore[attr-defined]
    pick = module._choose(m, mach, r, k, i, lnc)  # type: ignore[attr-defined]
    others = [p for p in module._candidates(m, r, k, i, lnc, mach.sbuf_budget) if bool(p.kc) != bool(pick.kc)]  # type: ignore[attr-defined]
    key = lambda p: module._rank_key(m, mach, r, k, i, lnc, p)  # type: ignore[attr-defined]  # noqa: E731
    return [pick, *([min(others, key=key)] if others else [])]


def extra(module: object, name: str) -> list[object]:
    """The plans EXTRA names for shape `name`."""
    return [module._Plan(*p) for p in EXTRA.get(name, [])]  # type: ignore[attr-defined]


def main(argv: list[str]) -> int:
    """One line per (shape, plan)."""
    names = argv[argv.index("--shapes") + 1].split(",") if "--shapes" in argv else list(SHAPES)
    print(f"{'shape':<16}{'plan (S CI SPLIT KC G)':<26}{'engines us':>11}{'closed us':>10}{'trace us':>10}"
          f"{'trace/closed':>13}")
    for name in names:
        example, k, i, r, lnc = SHAPES[name]
        module = sim.load_module(ROOT / "generated" / example / "kernel.py", target=TARGET)
        for n, plan in enumerate(dict.fromkeys([*plans(module, r, k, i, lnc), *extra(module, name)])):
            c = module._cost(module._MODEL, module._MACHINES[TARGET], r, k, i, lnc, plan)
            start = time.perf_counter()
            sched = traced(module, example, r, k, i, lnc, plan)
            label = ("pick " if n == 0 else "     ") + " ".join(str(v) for v in plan)
            busy = [sched.engine_busy_ns(e) * lnc / 1000 for e in ("tensor", "scalar", "vector", "dma")]
            engines = max(c.pe, c.act, c.dve, c.dma)  # the closed form without the chain: the busiest engine
            times = f"{engines / 1000:>11.1f}{c.total / 1000:>10.1f}{sched.time_ns / 1000:>10.1f}"
            print(f"{name:<16}{label:<26}{times}"
                  f"{sched.time_ns / c.total:>12.2f}x   closed PE/ACT/DVE/DMA "
                  + "/".join(f"{v / 1000:.0f}" for v in (c.pe, c.act, c.dve, c.dma))
                  + "  trace busy " + "/".join(f"{v:.0f}" for v in busy)
                  + f"   ({time.perf_counter() - start:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
