"""The SwiGLU FFN backward against its PE roofline: what the backward plan models, at two widths.

The backward's roofline: its gradient GEMMs (2x the forward's FLOPs: dA = dC @ B^T and dB = A^T @ dC per
forward GEMM) at the PE's dense bf16 peak, or reading x, dY and the weights and writing dX and the weight
and bias gradients (f32) once at HBM bandwidth, whichever is longer. The modelled time is the backward
plan's (fusegen/codegen/ffn/backward.py): the gradient GEMMs plus the chosen strategy's recomputation at
the PE peak and its saved traffic. This is the plan's bound, not the backward kernels' trace schedule
(they are not yet tiled for speed, and at these widths too large for the interpreter): a kernel adds its
elementwise work, DMA and PSUM evictions to it.
The forward kernel's modelled time (its planner's) is printed beside it.

Widths: Llama-3-8B-like (R=2048, K=4096, I=14336) and the seed's ViT-H (R=2048, K=1280, I=3416).
Run: .venv/bin/python bench/ffn_backward.py [--target trn2] [--lnc 2]   (< 5 s)
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from fusegen.codegen.autodiff import backward_ir
from fusegen.codegen.ffn.backward import plan_shape
from fusegen.codegen.ffn.family import FFN
from fusegen.codegen.ffn.match import match_ffn
from fusegen.codegen.rewrites import rewrite
from fusegen.dsl import load_spec
from fusegen.dsl.ir import CheckShape
from fusegen.perf.roofline import roofline
from fusegen.sim.targets import get_target

SPEC = Path(__file__).resolve().parents[1] / "examples" / "swiglu_ffn.spec"
SHAPES = (("Llama-3-8B", 2048, 4096, 14336), ("ViT-H (seed)", 2048, 1280, 3416))


def min_hbm_bytes(r: int, k: int, i: int) -> int:
    """x, dY and the three weights read once (bf16), dX (bf16) and the f32 weight and bias gradients
    written once."""
    return 2 * r * k * 3 + 2 * 3 * k * i + 4 * 3 * k * i + 4 * (2 * i + k)


def main(target: str, lnc: int) -> int:
    """Print one row per width: forward modelled, backward modelled, backward roofline, efficiency."""
    user_ir = load_spec(str(SPEC))[0]
    ir = rewrite(user_ir)
    m, back = match_ffn(ir), backward_ir(user_ir)
    print(f"swiglu_ffn backward on {target}, LNC={lnc} (the backward plan's bound, not a kernel trace)")
    print(f"{'width':>14} {'R':>5} {'K':>5} {'I':>6} {'fwd us':>9} {'bwd us':>9} {'roof us':>9} "
          f"{'bound':>5} {'eff':>6}  strategy")  # fmt: skip
    for label, r, k, i in SHAPES:
        dims = {"R": r, "K": k, "I": i}
        at = dataclasses.replace(ir, checks=(CheckShape(tuple(sorted(dims.items())), ir.outputs[0].span),))
        forward = FFN.plans(at, m, target, lnc)[0].modeled_ns
        plan = plan_shape(user_ir, m, back, dims, target, lnc)
        roof = roofline(get_target(target), lnc, plan.flops.gradients * r, min_hbm_bytes(r, k, i))
        modelled = roof.compute_ns + plan.chosen.ns * r
        print(f"{label:>14} {r:5} {k:5} {i:6} {forward / 1e3:9.1f} {modelled / 1e3:9.1f} "
              f"{roof.time_ns / 1e3:9.1f} {roof.bound:>5} {roof.efficiency(modelled):6.1%}  "
              f"{plan.chosen.strategy.name}")  # fmt: skip
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="trn2")
    parser.add_argument("--lnc", type=int, default=2)
    args = parser.parse_args()
    raise SystemExit(main(args.target, args.lnc))
