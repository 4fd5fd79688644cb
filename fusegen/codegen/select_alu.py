"""Instruction selection's ALU patterns: tensor_scalar chains and scalar_tensor_tensor fusions.

- `(t op0 s0) op1 s1`  -> nisa.tensor_scalar (s scalar or [P,1]; a [P,1] chain may stay off the Vector
                          engine, select_columns.py)
- `(t op0 s) op1 u`    -> nisa.scalar_tensor_tensor (u a tile)
- `recip(t)`           -> nisa.reciprocal
- `pow(t, p)`          -> nisa.tensor_tensor(op=nl.power) on GpSimd (p not an integer)
Called by `Selector._arith` (select.py), which falls back to nisa.tensor_tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fusegen.codegen import select_columns as columns
from fusegen.codegen import select_pe
from fusegen.codegen.engines import GPSIMD
from fusegen.codegen.select_tables import ALU, COMMUTATIVE, COMPARISONS
from fusegen.codegen.stage import Expr, Operand, scalar

if TYPE_CHECKING:
    from fusegen.codegen.select import Selector


@dataclass(frozen=True)
class ScalarOp:
    """One `op operand` step of a tensor_scalar chain (the operand materialised after the data, so a
    column computed for it lands next to its use)."""

    op: str
    operand: Expr
    reverse: bool


def stt(
    sel: Selector, e: Expr, inner: Expr, other: Expr, dtype: str, reverse: bool = False
) -> Operand | None:
    """`(t op0 s) op other` as one scalar_tensor_tensor, when `inner` is `t op0 s`."""
    if inner.kind != e.kind or other.kind != e.kind or inner.op not in ALU or inner.op == "pow":
        return None
    if inner.op in COMPARISONS or e.op in COMPARISONS:  # scalar_tensor_tensor takes arithmetic ops only
        return None
    t, s = split_tile(inner)
    if t is None or s is None or (reverse and e.op not in COMMUTATIVE):
        return None
    folded = select_pe.scaled_affine_then_row(sel, e, inner, t, s, other, dtype)
    if folded is not None:
        return folded
    step = _step(inner, s)
    data, operand1 = sel._not_both_psum(sel.value(t), sel.value(other))
    operand0 = sel._fp32(sel.value(step.operand))
    dst = sel._alloc(e.kind, dtype)
    sel._emit(
        "scalar_tensor_tensor",
        (data, operand0, operand1),
        dst=dst.code,
        data=data.code,
        op0=ALU[step.op],
        operand0=operand0.code,
        op1=ALU[e.op],
        operand1=operand1.code,
        **({"reverse0": "True"} if step.reverse else {}),
    )
    return dst


def scalar_chain(e: Expr) -> tuple[Expr, list[ScalarOp]] | None:
    """`e` as a tile (or column) followed by one or two scalar steps, innermost first."""
    steps: list[ScalarOp] = []
    base = e
    for _ in range(2):
        step_list = _scalar_steps(base)
        if step_list is None or len(steps) + len(step_list[1]) > 2:
            break
        base, new = step_list
        steps = new + steps
    return (base, steps) if steps else None


def _scalar_steps(e: Expr) -> tuple[Expr, list[ScalarOp]] | None:
    if e.op == "neg":
        return e.args[0], [ScalarOp("mul", scalar("-1.0"), False)]
    if e.op == "clamp":
        return None  # clamp is expanded by the checker into maximum/minimum
    if e.op not in ALU:
        return None
    t, s = _split_scalar(e)
    if t is None or s is None:
        return None
    return t, [_step(e, s)]


def _step(e: Expr, s: Expr) -> ScalarOp:
    return ScalarOp(e.op, s, reverse=(e.args[0] is s and e.op not in COMMUTATIVE))


def tensor_scalar(sel: Selector, base: Expr, ops: list[ScalarOp], kind: str, dtype: str) -> Operand:
    """`base` through the scalar steps `ops` as one nisa.tensor_scalar (or a column chain off Vector)."""
    data = sel.value(base)
    operands = [sel.value(step.operand) for step in ops]
    nl_ops = [ALU[step.op] for step in ops]
    if kind == "vec" and sel.column_engine == GPSIMD and columns.stays_off_vector(data, nl_ops, operands):
        return columns.chain(sel, data, nl_ops, operands, dtype)
    operands = [sel._fp32(operand) for operand in operands]
    dst = sel._alloc(kind, dtype)
    kwargs = {"dst": dst.code, "data": data.code}
    for i, (step, operand) in enumerate(zip(ops, operands, strict=True)):
        kwargs[f"op{i}"] = ALU[step.op]
        kwargs[f"operand{i}"] = operand.code
        if step.reverse:
            kwargs[f"reverse{i}"] = "True"
    sel._emit("tensor_scalar", (data, *operands), **kwargs)
    return dst


def split_tile(e: Expr) -> tuple[Expr | None, Expr | None]:
    """For a binary `e`, (the operand of e's own kind, the other operand if it is a column/scalar)."""
    a, b = e.args
    if a.kind == e.kind and b.kind != e.kind:
        return a, b
    if b.kind == e.kind and a.kind != e.kind:
        return b, a
    if e.kind == "vec" and b.kind == "scalar":
        return a, b
    if e.kind == "vec" and a.kind == "scalar":
        return b, a
    return None, None


def _split_scalar(e: Expr) -> tuple[Expr | None, Expr | None]:
    """For a binary `e`, (the tile/column operand, the scalar-like operand usable by tensor_scalar)."""
    a, b = e.args
    if e.kind == "tile":
        return split_tile(e)
    if b.kind == "scalar":
        return a, b
    if a.kind == "scalar":
        return b, a
    return None, None


def reciprocal(sel: Selector, e: Expr, dtype: str) -> Operand:
    """1 / t on the Vector engine (exact fp32 reciprocal; the Scalar engine's is range-limited)."""
    src = sel.value(e.args[0])
    dst = sel._alloc(e.kind, dtype)
    sel._emit("reciprocal", (src,), dst=dst.code, data=src.code)
    return dst


def power(sel: Selector, e: Expr, dtype: str) -> Operand:
    """t ** p for a non-integer p: tensor_tensor power, which runs on GpSimd only, so from SBUF (a PSUM
    operand copied there first)."""
    base = sel.value(e.args[0])
    base = sel.copy(base, base.kind, "f32") if base.memory == "psum" else base
    exponent = sel._alloc(e.kind, "f32")
    sel._emit("memset", dst=exponent.code, value=e.args[1].code)
    dst = sel._alloc(e.kind, dtype)
    sel._emit("tensor_tensor", (base, exponent), dst=dst.code, data1=base.code, data2=exponent.code,
              op="nl.power")  # fmt: skip
    return dst
