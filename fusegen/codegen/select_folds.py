"""Row-kernel folds that take full-width passes off the Vector engine without changing any value.

`exp(u) / c` for a per-row column c that is a sum of exponentials: one Scalar activation, exp(u - log c).

A softmax's normalisation `e / sum(e)` would otherwise materialise e (one Scalar pass) and scale it by
the reciprocal (one Vector `tensor_scalar` pass, fp32 so not in perf mode); folding log c into the
activation's bias leaves one Scalar pass and no Vector work, and the result is rounded once, as before.
c is positive (a sum of exponentials), so log c is defined; it lies in [1, H] for a max-shifted softmax,
inside the Scalar engine's log range [2^-64, 2^64] (shared/reference/nki.md §3).

`max(t * s)` for a trace-time scalar s: `s * max(t)` when s >= 0, else `s * min(t)` (rounding is monotone,
so fl(s * max t) is the largest fl(s * t_i): the same value). The reduction reads the loaded tile itself,
bf16 in SBUF, which tensor_reduce runs at N/2 cycles instead of a full-width scaling (N) and an fp32
reduction (N) (nki.md §6: "tensor_reduce N (N/2 bf16 add/max)"); the sign test runs when NKI traces the
kernel, where s is a Python float. A negative s takes the minimum, whose bf16 rate is not documented.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fusegen.codegen import select_affine as affine
from fusegen.codegen.stage import Expr, Operand

if TYPE_CHECKING:
    from fusegen.codegen.select import Selector


def sum_of_exponentials(c: Expr) -> bool:
    """Whether the column `c` is `sum(exp(...))` (or a leaf holding one, e.g. its accumulator), hence > 0."""
    if c.kind != "vec":
        return False
    if c.op == "leaf":
        return c.leaf is not None and c.leaf.positive
    return c.op == "sum" and bool(c.args) and c.args[0].op == "exp"


def exp_over_column(e: Expr) -> tuple[Expr, Expr] | None:
    """(the exponent u, the column c) when the full-width `e` is `exp(u) * recip(c)`, c a sum of exps."""
    if e.op != "mul" or e.kind != "tile":
        return None
    for num, den in (e.args, e.args[::-1]):
        if num.op == "exp" and num.kind == "tile" and den.op == "recip" and sum_of_exponentials(den.args[0]):
            return num.args[0], den.args[0]
    return None


def normalised_exp(sel: Selector, e: Expr, dtype: str) -> Operand | None:
    """`e` as one exp activation with log c folded into its bias, or None when `e` has another form."""
    found = exp_over_column(e)
    if found is None or sel.load is None:  # the row stages only: their column chains run off Vector
        return None
    u, c = found
    t, s, b, negate = affine.split(sel, u)
    log_c = sel.intern("log", (c,), "vec")  # e.g. the log a softmax's log-sum-exp takes anyway
    if b is None:
        bias = sel.intern("neg", (log_c,), "vec")
    elif negate:
        bias = sel.intern("neg", (sel.intern("add", (b, log_c), "vec"),), "vec")
    else:
        bias = sel.intern("sub", (b, log_c), "vec")
    data = sel.value(t)
    scale = None if s is None else sel._fp32(sel.value(s))
    bias_col = sel.value(bias)
    dst = sel._alloc(e.kind, dtype)
    kwargs = {"dst": dst.code, "op": "nl.exp", "data": data.code, "bias": bias_col.code}
    if scale is not None:
        kwargs["scale"] = scale.code
    reads = tuple(x for x in (data, scale, bias_col) if x is not None)
    sel._emit("activation", reads, **kwargs)
    return dst


def max_of_scaled(sel: Selector, e: Expr) -> Operand | None:
    """`max(t * s)` (s a scalar, t a full-width tile) as s times the max or min of t, else None."""
    arg = e.args[0]
    if arg.op != "mul" or arg.kind != "tile":
        return None
    t, s = arg.args if arg.args[1].kind == "scalar" else arg.args[::-1]
    if s.kind != "scalar" or t.kind != "tile":
        return None
    data = sel.value(t)
    extreme = sel._alloc("vec", "f32")
    op = f"(nl.maximum if {s.code} >= 0 else nl.minimum)"
    sel._emit("tensor_reduce", (data,), dst=extreme.code, op=op, data=data.code, axis="(1,)")
    return sel.value(Expr("mul", (Expr("leaf", leaf=extreme, kind="vec"), s), kind="vec"))
