"""Modelled small-batch gain of fp8 weights: generated swiglu_fp8 against the generated bf16 swiglu_ffn and
the seed kernel.

ViT-H SwiGLU widths (K=1280, I=3416; the seed needs I % 128 == 0 and runs zero-padded to 3456) at
R in {16, 64, 128, 256}, trn2, LNC 1 and 2; with --llama, Llama-3-8B's (K=4096, I=14336) at R in
{64, 256}, LNC 2 (each fp8 weight row is then 4 KiB, past the DMA packet rule's 2,450 B knee; at K=1280 it
is 1,280 B, below it). Each kernel runs on fusegen.sim with the plan its host (or, for the seed, its own
plan()) picks, and fusegen.perf schedules its trace: the model bench/ffn_perf.py uses. An fp8 matmul
costs the bf16 time per instruction (the documented rate without double_row, fusegen/perf/cost.py
FP8_DTYPES); the sensitivity lines reschedule the traces with that time x0.5 and x1.5, and with the DMA
packet figure x0.5 and x1.5. Run: .venv/bin/python bench/fp8_weights.py [--llama]   (a few min each)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import ffn_perf  # a sibling bench script: its runs, rows and table lines

from fusegen import sim
from fusegen.perf.capture import launches
from fusegen.perf.cost import FP8_SENSITIVITY, SENSITIVITY, assume

ROOT = Path(__file__).resolve().parents[1]
FP8 = ROOT / "generated" / "swiglu_fp8" / "kernel.py"
TARGET = "trn2"
#: (K, I, rows, LNC degrees) per width
WIDTHS = {"vit-h": (1280, 3416, (16, 64, 128, 256), (1, 2)), "llama3-8b": (4096, 14336, (64, 256), (2,))}


def fp8_inputs(rows: int) -> list[torch.Tensor]:
    """bf16_ffn's inputs with each weight quantised per output column to e5m2 and its scale inserted."""
    x, w1t, b1, wgt, bg, w2t, b2 = ffn_perf.inputs(rows, ffn_perf.I)
    out = [x]
    for w, bias in ((w1t, b1), (wgt, bg), (w2t, b2)):
        scale = w.float().abs().amax(dim=0).clamp(min=1e-12) / 57344.0
        out += [(w.float() / scale).to(torch.float8_e5m2), scale, bias]
    return out


def fp8_row(module: object, lnc: int, rows: int) -> ffn_perf.Row:
    """The generated fp8 kernel through its host function."""
    k, i = ffn_perf.K, ffn_perf.I
    plan = module._choose(module._MODEL, module._MACHINES[TARGET], rows, k, i, lnc)  # type: ignore[attr-defined]
    args = fp8_inputs(rows)

    def run() -> sim.RunResult:
        with launches(module) as found:  # type: ignore[arg-type]
            module.swiglu_fp8(*args, lnc=lnc, target=TARGET)  # type: ignore[attr-defined]
        return found[0].result

    result, seconds = ffn_perf.cached_run(("fp8", rows, lnc, tuple(plan)), run)
    label = " ".join(f"{k}={v}" for k, v in plan._asdict().items())
    return ffn_perf._row("fp8", label, result, seconds, TARGET, lnc, rows)


def main() -> int:
    """The table, the gains and the sensitivity."""
    k, i, all_rows, lncs = WIDTHS["llama3-8b" if "--llama" in sys.argv else "vit-h"]
    # ffn_perf's runs read its module-level widths; the seed needs I % 128 == 0 (zero-padded up to it)
    ffn_perf.K, ffn_perf.I, ffn_perf.I_SEED = k, i, -(-i // 128) * 128
    print(f"K={k} I={i}")
    bf16_module = sim.load_module(ffn_perf.GENERATED, target=TARGET)
    fp8_module = sim.load_module(FP8, target=TARGET)
    print(ffn_perf.HEADER)
    gains = []
    for lnc in lncs:
        seed_module = ffn_perf.seed_module(lnc) if ffn_perf.SEED.exists() else None
        for rows in all_rows:
            fp8 = fp8_row(fp8_module, lnc, rows)
            bf16 = ffn_perf.generated(bf16_module, TARGET, lnc, rows)
            seed = ffn_perf.seed(seed_module, TARGET, lnc, rows) if seed_module else None
            for r in (fp8, bf16, seed):
                if r is not None:
                    print(ffn_perf.line(TARGET, lnc, rows, r))
            gains.append((lnc, rows, fp8, bf16, seed))
    print("\nmodelled gain of fp8 weights (time of the other kernel / time of swiglu_fp8)")
    print(f"{'LNC':>4}{'R':>6}{'vs bf16':>10}{'vs seed':>10}{'HBM MB moved fp8/bf16':>24}")
    for lnc, rows, fp8, bf16, seed in gains:
        vs_seed = f"{seed.time_ns / fp8.time_ns:.2f}x" if seed and seed.sched else "n/a"
        mb = f"{fp8.hbm_moved / 1e6:.1f} / {bf16.hbm_moved / 1e6:.1f}"
        print(f"{lnc:>4}{rows:>6}{bf16.time_ns / fp8.time_ns:>9.2f}x{vs_seed:>10}{mb:>24}")
    print("\nsensitivity: the same traces rescheduled with one figure varied (fp8 and bf16 both)")
    for name, changes in (*FP8_SENSITIVITY, *SENSITIVITY[:2]):
        with assume(**changes):
            for lnc, rows, fp8, bf16, _ in gains:
                t = ffn_perf.rescheduled(fp8, TARGET).time_ns
                base = ffn_perf.rescheduled(bf16, TARGET).time_ns
                print(f"  {name:<22} LNC={lnc} R={rows:<4} fp8 {t / 1000:8.1f} us  vs bf16 {base / t:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
