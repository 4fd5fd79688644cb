"""The SwiGLU FFN backward against its PE roofline: the backward plan's bound and the kernels' trace.

The backward's roofline: its gradient GEMMs (2x the forward's FLOPs: dA = dC @ B^T and dB = A^T @ dC per
forward GEMM) at the PE's dense bf16 peak, or reading x, dY and the weights and writing dX and the weight
and bias gradients (f32) once at HBM bandwidth, whichever is longer. The modelled time is the backward
plan's (fusegen/codegen/ffn/backward.py): the gradient GEMMs plus the chosen strategy's recomputation at
the PE peak and its saved traffic: a bound, which a kernel's elementwise work, DMA and PSUM evictions add
to. Beside it, the generated backward program's own figure: generated/swiglu_ffn/backward_kernel.py run on
the interpreter at the width, every launch's trace scheduled by the cost model (fusegen/perf/schedule.py)
and the launches' times added (one after another, as the host runs them), with the kernels' shares.
The forward kernel's modelled time (its planner's) is printed beside it.

Widths: Llama-3-8B-like (R=2048, K=4096, I=14336) and the seed's ViT-H (R=2048, K=1280, I=3416).
Run: .venv/bin/python bench/ffn_backward.py [--target trn2] [--lnc 2] [--plan-only]
(--plan-only: < 5 s; the traces take ~20 s at the seed's width and several minutes and ~5 GB at Llama's)
"""

from __future__ import annotations

import argparse
import dataclasses
from collections import defaultdict
from pathlib import Path

import torch

from fusegen import sim
from fusegen.codegen.autodiff import backward_ir
from fusegen.codegen.ffn.backward import plan_shape
from fusegen.codegen.ffn.family import FFN
from fusegen.codegen.ffn.match import match_ffn
from fusegen.codegen.rewrites import rewrite
from fusegen.dsl import load_spec
from fusegen.dsl.ir import CheckShape
from fusegen.perf.analysis import Modeled, model_launches, progress
from fusegen.perf.capture import launches
from fusegen.perf.roofline import roofline
from fusegen.sim.targets import get_target
from fusegen.testing import TORCH_DTYPES

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "swiglu_ffn.spec"
KERNELS = ROOT / "generated" / "swiglu_ffn" / "backward_kernel.py"
SHAPES = (("Llama-3-8B", 2048, 4096, 14336), ("ViT-H (seed)", 2048, 1280, 3416))


def min_hbm_bytes(r: int, k: int, i: int) -> int:
    """x, dY and the three weights read once (bf16), dX (bf16) and the f32 weight and bias gradients
    written once."""
    return 2 * r * k * 3 + 2 * 3 * k * i + 4 * 3 * k * i + 4 * (2 * i + k)


def traced(back_inputs: list[tuple[str, tuple[int, ...]]], target: str, lnc: int) -> Modeled:
    """The generated backward program run on the interpreter at the inputs' shapes, its launches modelled."""
    kernels = sim.load_module(KERNELS, target=target, force=True)
    gen = torch.Generator().manual_seed(0)
    args = [(torch.randn(shape, generator=gen) / 4).to(TORCH_DTYPES[dtype]) for dtype, shape in back_inputs]
    with launches(kernels) as found:
        kernels.swiglu_ffn_backward(*args, lnc=lnc, target=target)
    progress(f"scheduling {sum(len(f.result.trace) for f in found)} instructions")
    return model_launches(found, target, lnc, min_hbm_bytes=0)  # the roofline is the plan's, below


def shares(modeled: Modeled) -> str:
    """Each kernel's share of the summed launch times, largest first."""
    by_kernel: dict[str, float] = defaultdict(float)
    for name, sched in modeled.schedules:
        by_kernel[name.removeprefix("_").removesuffix("_kernel")] += sched.time_ns
    ranked = sorted(by_kernel.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{name} {ns / modeled.time_ns:.0%}" for name, ns in ranked)


def main(target: str, lnc: int, trace: bool) -> int:
    """Print one row per width: forward modelled, the backward's bound and trace, roofline, efficiency."""
    user_ir = load_spec(str(SPEC))[0]
    ir = rewrite(user_ir)
    m, back = match_ffn(ir), backward_ir(user_ir)
    print(f"swiglu_ffn backward on {target}, LNC={lnc}: the backward plan's bound and the kernels' trace")
    print(f"{'width':>14} {'R':>5} {'K':>5} {'I':>6} {'fwd us':>9} {'bound us':>9} {'trace us':>9} "
          f"{'roof us':>9} {'bound':>5} {'eff':>6} {'trace eff':>9}  strategy")  # fmt: skip
    notes = []
    for label, r, k, i in SHAPES:
        dims = {"R": r, "K": k, "I": i}
        at = dataclasses.replace(ir, checks=(CheckShape(tuple(sorted(dims.items())), ir.outputs[0].span),))
        forward = FFN.plans(at, m, target, lnc)[0].modeled_ns
        plan = plan_shape(user_ir, m, back, dims, target, lnc)
        roof = roofline(get_target(target), lnc, plan.flops.gradients * r, min_hbm_bytes(r, k, i))
        modelled = roof.compute_ns + plan.chosen.ns * r
        trace_us, trace_eff = "-", "-"
        if trace:
            progress(f"running swiglu_ffn_backward at {label} R={r} K={k} I={i} on the interpreter")
            run = traced([(d.dtype, tuple(x.eval(dims) for x in d.shape)) for d in back.inputs], target, lnc)
            trace_us, trace_eff = f"{run.time_ns / 1e3:.1f}", f"{roof.efficiency(run.time_ns):.1%}"
            notes.append(f"{label}: {len(run.schedules)} launches, {run.instructions} instructions; "
                         f"{shares(run)}")  # fmt: skip
        print(f"{label:>14} {r:5} {k:5} {i:6} {forward / 1e3:9.1f} {modelled / 1e3:9.1f} {trace_us:>9} "
              f"{roof.time_ns / 1e3:9.1f} {roof.bound:>5} {roof.efficiency(modelled):6.1%} {trace_eff:>9}  "
              f"{plan.chosen.strategy.name}")  # fmt: skip
    for note in notes:
        print(note)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="trn2")
    parser.add_argument("--lnc", type=int, default=2)
    parser.add_argument("--plan-only", action="store_true", help="the plan's bound only, no interpreter runs")
    args = parser.parse_args()
    raise SystemExit(main(args.target, args.lnc, not args.plan_only))
