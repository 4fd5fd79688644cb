"""Instruction selection's affine operands: a value seen as `t * scale ± bias`, which one Scalar-engine
activation computes through its `scale=` and `bias=` (bias a [P,1] column, scale a scalar or an fp32
column), and a full-width affine step moved to the Scalar engine when that engine is the less loaded.
Called by the Selector's activations (select.py) and by the folds that reuse the split (select_folds.py,
select_pe.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fusegen.codegen import select_alu as alu
from fusegen.codegen import select_columns as columns
from fusegen.codegen.select_tables import CALL_COST
from fusegen.codegen.stage import Expr, Operand

if TYPE_CHECKING:
    from fusegen.codegen.select import Selector


def operands(sel: Selector, e: Expr) -> tuple[Operand, Operand | None, Operand | None]:
    """`e` as the data, scale and bias operands of one activation."""
    t, s, b, negate = split(sel, e)
    bias = None if b is None else sel.value(_negated(sel, b) if negate else b)
    if bias is not None and bias.kind == "scalar":
        bias = columns.constant(sel, bias.code)
    scale = None if s is None else sel._fp32(sel.value(s))
    return sel.value(t), scale, bias


def split(sel: Selector, e: Expr) -> tuple[Expr, Expr | None, Expr | None, bool]:
    """(t, scale, bias, whether the bias is subtracted) of `e` as `t * scale ± bias` (bias a column;
    `t - b` only with a load, i.e. in the row stages, whose column chains can negate b off Vector)."""
    bias, negate = None, False
    if e.kind == "tile" and (e.op == "add" or (e.op == "sub" and sel.load is not None)):
        t, b = alu.split_tile(e)
        if t is not None and b is not None and b.kind == "vec" and (e.op == "add" or e.args[0] is t):
            e, bias, negate = t, b, e.op == "sub"
    elif e.kind == "vec" and e.op == "add" and sel.load is not None and sel.column_engine:
        # a row stage's per-row `act(c + b)` (rstd = rsqrt(mean + eps)): the add rides in the
        # activation's bias, a scalar b memset once into a column, instead of a step of its own
        t, b = alu.split_tile(e)
        if t is not None and b is not None and b.kind in ("vec", "scalar"):
            e, bias = t, b  # and a product in t rides in the scale (below): rsqrt(sum * 1/n + eps)
    scale = None
    if e.op == "mul" and e.kind == "tile":
        t, s = alu.split_tile(e)
        if t is not None and s is not None:
            e, scale = t, s
    elif e.op == "mul" and e.kind == "vec" and sel.load is not None and sel.column_engine:
        # a row stage's per-row `act(c * s)` (sigmoid(sign * sqrt)): the product rides in the
        # activation's scale (a scalar or an fp32 column) instead of a step of its own
        t, s = alu.split_tile(e)
        t, s = (t, s) if t is not None else e.args
        if s is not None and s.kind in ("vec", "scalar"):
            e, scale = t, s
    return e, scale, bias, negate


def _negated(sel: Selector, column: Expr) -> Expr:
    """-column as an expression, one per column (memoised by `value` like any other)."""
    key = (id(column), "neg")
    if key not in sel._memo_neg:
        sel._memo_neg[key] = Expr("neg", (column,), kind=column.kind)
    return sel._memo_neg[key]


def on_scalar(sel: Selector, e: Expr, dtype: str) -> Operand | None:
    """A full-width `t * s ± b` as one identity activation, when a load says the Scalar engine is the
    less busy and the Vector engine would not run it in its bf16 perf mode."""
    if sel.load is None or e.kind != "tile":
        return None
    t = split(sel, e)[0]
    if t is e:
        return None
    data = sel.value(t)
    fast = data.dtype in ("bf16", "f16") and dtype in ("bf16", "f16") and data.memory != "psum"
    if fast or not sel.load.prefers_scalar(CALL_COST["tensor_scalar"][1]):
        return None
    data, scale, bias = operands(sel, e)
    dst = sel._alloc(e.kind, dtype)
    sel._emit("activation", present(data, scale, bias), dst=dst.code, op="nl.copy", data=data.code,
              **keywords(scale, bias))  # fmt: skip
    return dst


def present(*operands: Operand | None) -> tuple[Operand, ...]:
    """The operands an instruction reads (a missing scale or bias reads nothing)."""
    return tuple(o for o in operands if o is not None)


def keywords(scale: Operand | None, bias: Operand | None) -> dict[str, str]:
    """An activation's `bias=` and `scale=` arguments, where given."""
    found = {}
    if bias is not None:
        found["bias"] = bias.code
    if scale is not None:
        found["scale"] = scale.code
    return found
