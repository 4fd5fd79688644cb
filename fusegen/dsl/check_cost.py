"""A warning for `check` lines so large that the generated tests, which run every check on the CPU
interpreter, would take a long time: a production shape written where a test shape belongs."""

from __future__ import annotations

import math
from collections.abc import Sequence

from fusegen.dsl import ir
from fusegen.dsl.context import Context

#: the interpreter's pace, measured with `fusegen explain` on this project's 2-core machine: an RMSNorm
#: moved 128 MiB in 10 s, swiglu_ffn did 27 GFLOP (R=1024) in 15 s; rounded down to be conservative.
GIB_PER_MINUTE = 0.8
GFLOP_PER_MINUTE = 100.0
#: a check runs 4 times in its generated test: as given and a ragged neighbour, each at LNC 1 and 2.
RUNS_PER_CHECK = 4
#: a test past this many minutes is no test shape.
MAX_TEST_MINUTES = 10


def warn_heavy_checks(
    ctx: Context, checks: Sequence[ir.CheckShape], outputs: Sequence[ir.OutputDecl]
) -> None:
    """Warn at each check line whose generated test would run for more than MAX_TEST_MINUTES."""
    tensors = [n for n in ctx.nodes if n.op == "input"] + list(outputs)
    for check in checks:
        env = check.env()
        size = sum(math.prod(ir.eval_shape(t.shape, env)) * ir.DTYPE_BYTES[t.dtype] for t in tensors)
        flops = ir.matmul_flops(ctx.nodes, env)
        minutes = RUNS_PER_CHECK * (size / 2**30 / GIB_PER_MINUTE + flops / 1e9 / GFLOP_PER_MINUTE)
        if minutes <= MAX_TEST_MINUTES:
            continue
        work = f"{size / 2**30:,.1f} GiB of inputs and outputs" + (
            f" and {flops / 1e12:,.2f} TFLOP of matmuls" if flops else ""
        )
        ctx.warn(
            check.span,
            f"this check is {work}: its generated test would run about {_duration(minutes)} on the CPU "
            f"interpreter",
            "a check line is a test shape (the examples' largest is 0.3 GiB, 0.01 TFLOP); time a production "
            "shape with `fusegen explain SPEC --shape ...`",
        )


def _duration(minutes: float) -> str:
    """`25 minutes`, `3 hours`, `40 days`."""
    if minutes < 120:
        return f"{minutes:.0f} minutes"
    if minutes < 48 * 60:
        return f"{minutes / 60:.0f} hours"
    return f"{minutes / 60 / 24:,.0f} days"
