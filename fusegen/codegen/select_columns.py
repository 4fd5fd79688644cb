"""[P, 1] column chains kept off the in-order Vector queue, on engines engines.py allows.

A row kernel's per-row math (rstd, a scale, a clamp...) is a chain of one-element-per-partition steps
that waits on the reduction passes; on the Vector engine each step would wait in the queue the
full-width work fills. `tensor_scalar` may not run on GpSimd (its docstring allows rsqrt only), so a
chain of adds and products becomes GpSimd `tensor_tensor` steps against columns, a constant operand
memset once per launch into a column (`Selector.constants`), and `max(x, c)` becomes `relu(x - c) + c`
when c >= 0 (the relu on the Scalar engine, whose bias takes a column; the maximum itself is Vector-only,
and exact, so a negative c, where x - c loses x, takes it: `_maximum`).
A step whose input the Scalar engine wrote (an rsqrt, a sigmoid, a reducing activation) stays there
instead when the kernel's full-width work leaves the Scalar engine the less busy one (`EngineLoad`):
`x * s` and `x + b` are one identity activation (scale s, bias b), the same fp32 rounding as the GpSimd
step, without the cross-engine hand-off (the producer's latency, each way) that a chain alternating
between the two engines pays per step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fusegen.codegen.engines import GPSIMD, gpsimd_allows
from fusegen.codegen.stage import Operand

if TYPE_CHECKING:
    from fusegen.codegen.select import Selector


def reads_psum(reads: tuple[Operand, ...]) -> bool:
    """Whether any operand lives in PSUM (which GpSimd cannot access)."""
    return any(r.memory == "psum" for r in reads)


def stays_off_vector(data: Operand, ops: list[str], operands: list[Operand]) -> bool:
    """Whether `(data op0 s0) op1 s1` on a column can run as `chain` emits it: every op an add or a
    multiply GpSimd may take (SBUF operands only), or a maximum with a scalar."""
    return all(
        gpsimd_allows("tensor_tensor", (op,), reads_psum((data, operand)))
        or (op == "nl.maximum" and operand.kind == "scalar")
        for op, operand in zip(ops, operands, strict=True)
    )


def chain(sel: Selector, data: Operand, ops: list[str], operands: list[Operand], dtype: str) -> Operand:
    """The column chain, one instruction per step off the Vector engine."""
    value = data
    for op, operand in zip(ops, operands, strict=True):
        if op == "nl.maximum":
            value = _maximum(sel, value, operand.code)
            continue
        operand = sel._fp32(operand)
        folded = on_scalar(sel, value, op, operand)
        if folded is not None:
            value = folded
            continue
        if operand.kind == "scalar":
            operand = constant(sel, operand.code)
        dst = sel._alloc("vec", "f32")
        sel._emit(
            "tensor_tensor", (value, operand), dst=dst.code, data1=value.code, data2=operand.code, op=op
        )
        value = dst
    return value if value.dtype == dtype else sel.copy(value, "vec", dtype)


def on_scalar(sel: Selector, data: Operand, op: str, operand: Operand, into: Operand | None = None
              ) -> Operand | None:  # fmt: skip
    """`data * operand` (scale) or `data + operand` (bias, a column) on [P, 1] columns as one identity
    activation, when the Scalar engine wrote `data` and the kernel's full-width work leaves it the less busy
    engine (row stages only, where [P, 1] work is kept off the Vector queue); None otherwise."""
    if sel.load is None or not sel.column_engine or data.kind != "vec" or data.memory == "psum":
        return None
    if sel.writers.get(data.code.split("[")[0]) != "act" or op not in ("nl.multiply", "nl.add"):
        return None
    fp32 = operand.kind == "scalar" or (operand.kind == "vec" and operand.dtype == "f32")
    if not fp32 or operand.memory == "psum" or not sel.load.scalar_lighter():
        return None
    if op == "nl.add" and operand.kind == "scalar":
        operand = constant(sel, operand.code)
    dst = into or sel._alloc("vec", "f32")
    role = "scale" if op == "nl.multiply" else "bias"
    sel._emit("activation", (data, operand), dst=dst.code, op="nl.copy", data=data.code,
              **{role: operand.code})  # fmt: skip
    return dst


def _maximum(sel: Selector, x: Operand, bound: str) -> Operand:
    """max(x, bound): `relu(x - bound) + bound` on the Scalar engine when bound >= 0 (exact where x <= bound,
    else within an ulp of x), else a Vector `tensor_scalar` maximum, since against a negative bound x - bound
    loses x (x = 0.5, bound = -1e10 gives 0) and bound = -inf gives nan. A bound known only when the kernel is
    traced (a param) takes both, under a trace-time `if` on its sign."""
    known = literal(bound)
    if known is not None and known < 0:
        return _vector_maximum(sel, x, bound)
    if known is not None:
        return _relu_maximum(sel, x, bound)
    dst = sel._alloc("vec", "f32")
    # the branch stays one unit of the per-row prefix (column_prefix): its Vector step does not end it
    with sel.block(f"if {bound} >= 0.0:", "vec", unit=True):
        _relu_maximum(sel, x, bound, into=dst)
    usual = sel.writers[dst.name]
    with sel.block("else:", "vec", unit=True):
        _vector_maximum(sel, x, bound, into=dst)
    sel.writers[dst.name] = usual  # what follows is planned for the usual branch, a bound >= 0
    return dst


def _relu_maximum(sel: Selector, x: Operand, bound: str, into: Operand | None = None) -> Operand:
    """relu(x - bound) + bound, the relu on the Scalar engine (whose bias takes a column)."""
    shifted = sel._alloc("vec", "f32")
    below = constant(sel, f"(-{bound})")
    sel._emit("activation", (x,), dst=shifted.code, op="nl.relu", data=x.code, bias=below.code)
    offset = constant(sel, bound)
    folded = on_scalar(sel, shifted, "nl.add", offset, into)
    if folded is not None:
        return folded
    dst = into or sel._alloc("vec", "f32")
    sel._emit("tensor_tensor", (shifted, offset), dst=dst.code, data1=shifted.code, data2=offset.code,
              op="nl.add")  # fmt: skip
    return dst


def _vector_maximum(sel: Selector, x: Operand, bound: str, into: Operand | None = None) -> Operand:
    """max(x, bound) exactly, on the Vector engine (the only one with a maximum)."""
    dst = into or sel._alloc("vec", "f32")
    sel._emit("tensor_scalar", (x,), dst=dst.code, data=x.code, op0="nl.maximum", operand0=bound)
    return dst


def literal(code: str) -> float | None:
    """The number a scalar's code spells, or None when it is an expression (a param, a dim's function)."""
    try:
        return float(code.strip("()"))
    except ValueError:
        return None


def constant(sel: Selector, value: str) -> Operand:
    """A [P, 1] fp32 column holding the launch-wide scalar `value` (a param, a dim's function): its lines
    go to `sel.constants`, which the kernel runs once before its loops (memset on GpSimd)."""
    if value not in sel.constant_columns:
        name = f"{sel.prefix}c{len(sel.constant_columns)}"
        sel.constants.append(f"{name} = nl.ndarray((_P, 1), dtype=nl.float32, buffer=nl.sbuf)")
        sel.constants.append(f"nisa.memset(dst={name}[0:_P, 0:1], value={value}, engine={GPSIMD})")
        sel.constant_columns[value] = Operand("vec", f"{name}[0:{sel.layout.part}, 0:1]")
    return sel.constant_columns[value]
