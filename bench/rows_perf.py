"""Row-reduction kernels against the HBM roofline: modelled time, efficiency, bounding engine, goals.

engram_gate at T=4096 HC=4 H=2048 (goal >= 80% of the HBM roofline) and add_rmsnorm, layernorm and
scaled_softmax at T=4096 H=4096 (goal >= 70%), forward as `fusegen explain` models it (trn2, LNC 2:
the generated kernel on the interpreter, its trace scheduled by fusegen.perf); the engram_gate backward
kernels (the only row example with generated backward kernels) at the same shape, reported without a
goal. Each trace is scheduled again with the DMA packet-rate figure at 50% and 150% of its value, without
PE throttling, and with a 600 ns hardware-DGE issue per DMA (the sensitivity to the model's uncertain
figures), and with neither the DMA rule nor throttling (the cost model before issue 15: before/after).
Run: .venv/bin/python bench/rows_perf.py [--quick]   (--quick: T=512; the full run interprets ~1 GB of
row data and takes minutes)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fusegen import sim  # noqa: E402
from fusegen.perf.analysis import Modeled, analyse, model_launches, tensor_bytes  # noqa: E402
from fusegen.perf.capture import launches  # noqa: E402
from fusegen.perf.cost import MODEL_I, SENSITIVITY, assume  # noqa: E402

TARGET, LNC = "trn2", 2
#: (spec, dims, goal as a share of the HBM roofline)
CASES = (
    ("engram_gate", {"T": 4096, "HC": 4, "H": 2048}, 0.80),
    ("add_rmsnorm", {"T": 4096, "H": 4096}, 0.70),
    ("layernorm", {"T": 4096, "H": 4096}, 0.70),
    ("scaled_softmax", {"T": 4096, "H": 4096}, 0.70),
)
#: the model's uncertain figures, each varied alone, then the model before issue 15
VARIANTS = (*SENSITIVITY, ("model I (neither rule)", MODEL_I))


def report(label: str, modeled: Modeled, goal: float | None) -> bool:
    """One kernel's line: modelled time, roofline, efficiency, bounding engine, goal, sensitivity; whether
    the goal (if any) is met."""
    roof = modeled.roof
    eff = roof.efficiency(modeled.time_ns)
    bound = ", ".join(f"{name} {s.bound} {s.busy_pct(s.bound):.0f}%" for name, s in modeled.schedules)
    verdict = "reported" if goal is None else f"goal >= {goal:.0%}: {'met' if eff >= goal else 'NOT met'}"
    print(f"| {label} | {modeled.time_ns / 1e3:,.1f} | {roof.time_ns / 1e3:,.1f} ({roof.bound}) | "
          f"{eff:.1%} | {bound} | {modeled.hbm_moved / roof.min_hbm_bytes:.2f}x | {verdict} |")  # fmt: skip
    shifts = []
    for name, changes in VARIANTS:
        with assume(**changes):
            again = model_launches(list(modeled.launches), TARGET, LNC, roof.min_hbm_bytes)
        shifts.append(f"{name}: {again.time_ns / 1e3:,.1f} us ({roof.efficiency(again.time_ns):.1%})")
    print(f"|   sensitivity | {'; '.join(shifts)} | | | | | |")
    return goal is None or eff >= goal


def forward(spec: str, dims: dict[str, int], goal: float) -> bool:
    """The generated forward kernel at `dims`, as `fusegen explain` models it."""
    start = time.perf_counter()
    got = analyse(str(ROOT / "examples" / f"{spec}.spec"), dims, TARGET, LNC, alternatives=False)
    label = f"{spec} {' '.join(f'{k}={v}' for k, v in dims.items())} ({time.perf_counter() - start:.0f} s)"
    return report(label, got.modeled, goal)


def engram_backward(dims: dict[str, int]) -> None:
    """The generated engram_gate backward kernels (token pass + reduce) at `dims`, saved tensors from the
    reference forward."""
    folder = ROOT / "generated" / "engram_gate"
    reference = sim.load_module(folder / "reference.py")
    module = sim.load_module(folder / "backward_kernel.py", target=TARGET)
    t, hc, h = dims["T"], dims["HC"], dims["H"]
    gen = torch.Generator().manual_seed(0)
    shapes = ((t, hc, h), (t, hc + 1, h), (hc, h), (hc, h))
    x, kv, w_h, w_e = (torch.randn(s, generator=gen).bfloat16() for s in shapes)
    _, *saved = reference.engram_gate_reference(x, kv, w_h, w_e, save=True)
    d_out = torch.randn((t, hc, h), generator=gen).bfloat16()
    args = (x, kv, w_h, w_e, *saved, d_out)
    start = time.perf_counter()
    with launches(module) as found:
        outputs = module.engram_gate_backward(*args, lnc=LNC, target=TARGET)
    modeled = model_launches(found, TARGET, LNC, tensor_bytes(args) + tensor_bytes(outputs))
    label = f"engram_gate backward T={t} HC={hc} H={h} ({time.perf_counter() - start:.0f} s)"
    report(label, modeled, None)


def main() -> int:
    """Print the table and the goals (met or not; exit 0 either way, as bench/ffn_perf.py)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="T=512 instead of 4096 (goals still checked)")
    args = parser.parse_args()
    cases = [(s, {**d, "T": 512} if args.quick else d, g) for s, d, g in CASES]
    print(f"{TARGET}, LNC {LNC}; modelled (fusegen.perf); roofline: inputs read once, outputs written once")
    print("| kernel, shape | modelled us | roofline us | efficiency | bound (busiest engine, busy %) | "
          "HBM moved / min | goal |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | --- | ---: | --- |")
    met = [forward(spec, dims, goal) for spec, dims, goal in cases]
    engram_backward(cases[0][1])
    print(f"goals met: {sum(met)} of {len(met)} (modelled; the model is not tuned to meet them)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
