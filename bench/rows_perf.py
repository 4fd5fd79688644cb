"""Row-reduction kernels against the HBM roofline: modelled time, efficiency, bounding engine, goals.

engram_gate at T=4096 HC=4 H=2048 (goal >= 80% of the HBM roofline) and add_rmsnorm, layernorm and
scaled_softmax at T=4096 H=4096 (goal >= 70%), forward as `fusegen explain` models it (trn2, LNC 2:
the generated kernel on the interpreter, its trace scheduled by fusegen.perf); the engram_gate backward
kernels (the only row example with generated backward kernels) at the same shape, reported without a
goal. Each trace is scheduled again with the DMA packet-rate figure at 50% and 150% of its value, without
PE throttling, and with a 600 ns hardware-DGE issue per DMA (the sensitivity to the model's uncertain
figures), and with neither the DMA rule nor throttling (the cost model before issue 15: before/after).
Each forward kernel's `floor` line is its bound under the documented rates: the full-width passes per token
tile and head that no documented instruction choice avoids (`FLOORS`), on the Vector and Scalar engines,
against the HBM roofline, whole (each pass on one engine) and split (a pass's columns shared by both, the
true bound); where even the split bound is below the goal, the goal is impossible in this model. engram_gate's
floor is also priced instruction by instruction (`INSTRUCTION_FLOORS`): per-instruction overheads, the
diagonals of its PSUM-formed output and its Scalar-only per-tile activations, for the best known design.
Run: .venv/bin/python bench/rows_perf.py [--quick]   (--quick: T=512; the full run interprets ~1 GB of
row data and takes minutes)
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fusegen import sim  # noqa: E402
from fusegen.perf.analysis import Modeled, analyse, model_launches, tensor_bytes  # noqa: E402
from fusegen.perf.capture import launches  # noqa: E402
from fusegen.perf.cost import DMA_FIXED_NS, MODEL_I, SENSITIVITY, assume, instruction_ns  # noqa: E402
from fusegen.perf.roofline import Roofline  # noqa: E402
from fusegen.sim.targets import get_target  # noqa: E402

TARGET, LNC = "trn2", 2
#: (spec, dims, goal as a share of the HBM roofline)
CASES = (
    ("engram_gate", {"T": 4096, "HC": 4, "H": 2048}, 0.80),
    ("add_rmsnorm", {"T": 4096, "H": 4096}, 0.70),
    ("layernorm", {"T": 4096, "H": 4096}, 0.70),
    ("scaled_softmax", {"T": 4096, "H": 4096}, 0.70),
)
#: Full-width passes per 128-token tile and head that no documented instruction choice avoids (N elements
#: per partition each; shared/reference/nki.md §6): (what, Vector passes, Scalar passes), None where the
#: engine cannot take the step. A two-tile step is N Vector cycles at best (tensor_tensor is 2N, N with one
#: input in PSUM or in all-bf16 perf mode: never less); a sum of squares on Vector is a product and a
#: reduction (2N); a bf16 tensor_reduce add/max is N/2; a PSUM eviction (DMA cannot read PSUM) is N on
#: either engine. The floor takes the best assignment; the Tensor engine and DMA (the roofline) aside.
FLOORS: dict[str, tuple[tuple[str, float | None, float | None], ...]] = {
    "engram_gate": (("x*k and (x*k)*w, reading PSUM", 2, None), ("sum(x^2)", 2, 1), ("sum(k^2)", 2, 1),
                    ("sum(x*k*w)", 1, 1), ("out = x + g*v, evicted from PSUM", 1, 1)),
    "add_rmsnorm": (("s*w, reading PSUM", 1, None), ("sum(s^2)", 2, 1), ("h = bf16(s), evicted", 1, 1),
                    ("y = (s*w)*rstd, evicted", 1, 1)),
    "layernorm": (("z*w and +b, reading PSUM", 2, None), ("sum((x - mean)^2)", 2, 1), ("sum(x)", 0.5, 1),
                  ("z = (x - mean)*rstd", 1, 1)),
    "scaled_softmax": (("max of the bf16 row", 0.5, None), ("exp with its sum; the normalised exp", None, 2)),
}  # fmt: skip


def engram_instructions(width: int, heads: int) -> list[tuple[float, float]]:
    """engram_gate's work per token tile and head priced instruction by instruction (ns on Vector, Scalar;
    inf where the engine cannot), for the best known design (bench/engram_hand_kernel.py): the two
    Vector-only products reading PSUM; the sums of squares as reducing activations (N + 64 cycles); the
    x*k*W sum and the eviction of the PSUM-formed out on either engine; two diagonal stationaries (g_hi,
    g_lo) per head, 64 Vector cycles at best in perf mode; sign, relu (the max with clamp) and sigmoid on
    [P, HC] columns once per tile, Scalar-only activations."""
    target = get_target(TARGET)

    def vector(op: str, n: int, dtype: str = "bfloat16", **details: bool) -> float:
        return instruction_ns(target, "vector", op, 128, n, dtype, **details)

    def scalar(n: int, **details: bool) -> float:
        return instruction_ns(target, "scalar", "activation", 128, n, "bfloat16", **details)

    return [
        (2 * vector("tensor_tensor", width, psum_input=True), math.inf),
        (math.inf, 2 * scalar(width, reduce=True)),
        (math.inf, 3 * scalar(heads) / heads),
        (vector("tensor_reduce", width, dtype="float32"), scalar(width, reduce=True)),
        (vector("tensor_copy", width, dtype="float32"), scalar(width)),
        (2 * vector("tensor_scalar", 128, perf_mode=True), 2 * scalar(128)),
    ]


#: kernels whose floor is also priced instruction by instruction (per token tile and head)
INSTRUCTION_FLOORS = {"engram_gate": lambda dims: engram_instructions(dims["H"], dims["HC"])}
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


def floor(spec: str, dims: dict[str, int], roof: Roofline, goal: float) -> None:
    """The kernel's bound under the documented rates (`FLOORS`): its unavoidable passes on the Vector and
    Scalar engines at best, whole (each pass on one engine) and split (a pass's columns shared by both: the
    true bound), the µs per core that leaves on each, the efficiency at most."""
    target = get_target(TARGET)
    pass_ns = (instruction_ns(target, "vector", "tensor_tensor", 128, dims["H"], psum_input=True),
               instruction_ns(target, "scalar", "activation", 128, dims["H"]))  # fmt: skip
    units = -(-dims["T"] // 128) // LNC * dims.get("HC", 1)  # token tiles and heads per core
    steps = [(_ns(v, pass_ns[0] * units), _ns(s, pass_ns[1] * units)) for _, v, s in FLOORS[spec]]
    picks = itertools.product(*[[c for c in ((v, 0.0), (0.0, s)) if math.inf not in c] for v, s in steps])
    whole = min(picks, key=lambda pick: max(sum(c[0] for c in pick), sum(c[1] for c in pick)))
    vector, scalar = sum(c[0] for c in whole), sum(c[1] for c in whole)
    bound, split = max(vector, scalar, roof.time_ns), max(split_bound(steps), roof.time_ns)
    engine = "HBM" if bound == roof.time_ns else ("Vector" if vector >= scalar else "Scalar")
    verdict = "goal reachable"
    if roof.time_ns / bound < goal:
        verdict = "goal impossible under the documented rates"
        if roof.time_ns / split >= goal:
            verdict = "goal reachable only with passes split between the engines"
    passes = f"Vector {vector / pass_ns[0] / units:g} + Scalar {scalar / pass_ns[1] / units:g} whole passes"
    named = "; ".join(what for what, _, _ in FLOORS[spec])
    print(f"|   floor | {bound / 1e3:,.1f} us ({engine}; {passes} per tile and head: {vector / 1e3:,.1f} / "
          f"{scalar / 1e3:,.1f} us); split: {split / 1e3:,.1f} us | | <= {roof.time_ns / bound:.1%}, split "
          f"<= {roof.time_ns / split:.1%} | {named} | | {verdict} |")  # fmt: skip
    if spec in INSTRUCTION_FLOORS:
        priced = instruction_floor_ns(spec, dims)
        eff = roof.time_ns / priced
        verdict = "goal above this bound" if eff < goal else "goal within this bound"
        where = "docs/performance.md: engram_gate scheduled by hand"
        print(f"|   instruction floor | {priced / 1e3:,.1f} us (priced per instruction, best known design) | "
              f"| <= {eff:.2%} | {where} | | {verdict} |")  # fmt: skip


def instruction_floor_ns(spec: str, dims: dict[str, int]) -> float:
    """The split bound of the kernel's instructions priced per token tile and head, times the tiles and
    heads per core, plus one DMA's fixed latency before the first instruction (nothing to compute yet) and
    one after the last (the last store)."""
    units = -(-dims["T"] // 128) // LNC * dims.get("HC", 1)
    return split_bound(INSTRUCTION_FLOORS[spec](dims)) * units + 2 * DMA_FIXED_NS


def _ns(passes: float | None, pass_ns: float) -> float:
    """A step's time on one engine (inf where that engine cannot take it)."""
    return math.inf if passes is None else passes * pass_ns


def split_bound(steps: list[tuple[float, float]]) -> float:
    """The least max(Vector, Scalar) time when each step's columns may be shared by the engines that can
    run it (steps as (Vector, Scalar) time, inf where an engine cannot): a two-engine linear programme,
    solved by moving steps from Vector to Scalar, the most Scalar-favoured first, the last one in part."""
    vector = sum(v for v, s in steps if v < math.inf)
    scalar = sum(s for v, s in steps if v == math.inf)
    for v, s in sorted(((v, s) for v, s in steps if math.inf not in (v, s)), key=lambda c: c[1] / c[0]):
        # the share moved that balances the engines: vector - share * v = scalar + share * s
        share = min(1.0, max(0.0, (vector - scalar) / (v + s)))
        vector, scalar = vector - share * v, scalar + share * s
    return max(vector, scalar)


def forward(spec: str, dims: dict[str, int], goal: float) -> bool:
    """The generated forward kernel at `dims`, as `fusegen explain` models it, and its floor."""
    start = time.perf_counter()
    got = analyse(str(ROOT / "examples" / f"{spec}.spec"), dims, TARGET, LNC, alternatives=False)
    label = f"{spec} {' '.join(f'{k}={v}' for k, v in dims.items())} ({time.perf_counter() - start:.0f} s)"
    met = report(label, got.modeled, goal)
    floor(spec, dims, got.modeled.roof, goal)
    return met


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
