"""Expressions -> IR nodes, inferring each node's shape and dtype; errors poison a subtree (None)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from fusegen.dsl import ast, ir
from fusegen.dsl.calls import lower_call
from fusegen.dsl.context import FAILED_NODE, Context
from fusegen.dsl.diagnostics import Span
from fusegen.dsl.folding import f32_problem, literal_value
from fusegen.dsl.ir import COMPUTE_DTYPE, F32_MAX, FP8_DTYPES, Dim, IndexItem, shape_str
from fusegen.dsl.shapes import (
    broadcast,
    broadcast_hint,
    matmul_hint,
    matmul_shape,
    position_problem,
    slice_problem,
    to_dim,
)

_ARITHMETIC = {"+": "add", "-": "sub", "*": "mul", "/": "div"}
_COMPARISONS = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne"}
_NOT_NUMBERS = {"inf", "nan", "Inf", "NaN", "infinity"}


def value(ctx: Context, expr: ast.Expr) -> int | None:
    """The node computing `expr`, which must be a number or tensor (comparisons feed only `where`)."""
    node = lower(ctx, expr)
    if node is not None and ctx.nodes[node].dtype == "bool":
        ctx.error(expr.span, "a comparison can only be the condition of `where`", "where(x > 0, x, 0)")
        return None
    return node


def lower(ctx: Context, expr: ast.Expr) -> int | None:
    """The node computing `expr`, or None once its errors are reported."""
    rule: Callable[[Context, Any], int | None] = _RULES[type(expr)]
    return rule(ctx, expr)


def literal_number(expr: ast.Expr) -> float | None:
    """The value of a (possibly negated) numeric literal, else None."""
    if isinstance(expr, ast.Number):
        return expr.value
    if isinstance(expr, ast.Neg):
        inner = literal_number(expr.operand)
        return None if inner is None else -inner
    return None


def elementwise(ctx: Context, op: str, args: tuple[int, ...], span: Span, what: str) -> int | None:
    """A broadcasting node over `args`; comparisons give bool, all other math f32."""
    shapes = tuple(ctx.nodes[a].shape for a in args)
    shape = broadcast(shapes)
    if shape is None:
        listed = ", ".join(shape_str(s) for s in shapes[:-1]) + f" and {shape_str(shapes[-1])}"
        ctx.error(span, f"shapes {listed} do not broadcast in `{what}`", _leading_hint(ctx, args) or
                  broadcast_hint(shapes))  # fmt: skip
        return None
    dtype = "bool" if op in ir.COMPARE_OPS else COMPUTE_DTYPE
    return in_f32(ctx, ctx.add_node(op, args, (), shape, dtype, span))


def in_f32(ctx: Context, node_id: int) -> int | None:
    """`node_id`, or None after an error when it is a scalar of numbers alone that f32 cannot hold: the
    kernel forms it in Python when traced and takes it as an f32 immediate (inf there), as a number is."""
    node = ctx.nodes[node_id]
    problem = f32_problem(literal_value(ctx.nodes, node_id))
    if problem is not None:
        hint = f"the kernel computes in f32: a constant's magnitude is at most {F32_MAX:.8g}"
        ctx.error(node.span, f"this expression of numbers {problem}", hint)
        return None
    return node_id


def _leading_hint(ctx: Context, args: tuple[int, ...]) -> str | None:
    """For a value shaped like the leading dims of another (a per-row [T] beside [T, H]): how to give it
    the trailing size-1 axes that make it broadcast over the rows, as torch needs too."""
    nodes = [ctx.nodes[a] for a in args]
    for short in nodes:
        for long in nodes:
            rank = len(short.shape)
            if 0 < rank < len(long.shape) and long.shape[:rank] == short.shape:
                name = short.name or "(...)"
                added = ", ".join([":"] * rank + ["None"] * (len(long.shape) - rank))
                return (f"broadcasting aligns the last dims, as in torch, so {shape_str(short.shape)} does "
                        f"not run along the rows of {shape_str(long.shape)}: write `{name}[{added}]`, or "
                        "reduce with keepdim=true")  # fmt: skip
    return None


def _name(ctx: Context, expr: ast.Name) -> int | None:
    binding = ctx.scope.get(expr.name)
    if binding is not None:
        ctx.reads.add(expr.name)
        return None if binding.node == FAILED_NODE else binding.node
    if expr.name in ctx.failed:
        return None
    if expr.name in ctx.dims:
        return ctx.add_leaf("dim", "dim", Dim.sym(expr.name), expr.span)
    later = ctx.pending.get(expr.name)
    if later is not None and later.line == expr.span.line:
        ctx.error(
            expr.span, f"`{expr.name}` is used in its own definition", "a value cannot depend on itself"
        )
    elif later is not None:
        message = f"`{expr.name}` is used before its definition at line {later.line}"
        ctx.error(expr.span, message, "statements run top to bottom; define values before using them")
    elif expr.name in _NOT_NUMBERS:
        ctx.error(expr.span, f"unknown name `{expr.name}`", "numbers in a spec must be finite")
    else:
        ctx.unknown_name(expr.span, expr.name)
    return None


def _number(ctx: Context, expr: ast.Number) -> int | None:
    if not math.isfinite(expr.value):
        ctx.error(expr.span, f"`{expr.text}` is not a finite number")
        return None
    if abs(expr.value) > F32_MAX:  # an fp32 immediate in the kernel, as a param is: it would be inf there
        hint = f"the kernel computes in f32: a number's magnitude is at most {F32_MAX:.8g}"
        ctx.error(expr.span, f"`{expr.text}` does not fit in f32", hint)
        return None
    return ctx.add_leaf("const", "value", expr.value, expr.span)


def _misplaced_literal(ctx: Context, expr: ast.Bool | ast.NoneLit) -> None:
    where = "a clamp bound" if isinstance(expr, ast.NoneLit) else "a keyword argument such as `keepdim=true`"
    ctx.error(expr.span, f"this literal is only allowed as {where}")


def _neg(ctx: Context, expr: ast.Neg) -> int | None:
    if isinstance(expr.operand, ast.Number):  # `-1` is a constant, not an op
        folded = ast.Number(-expr.operand.value, "-" + expr.operand.text, expr.operand.is_int, expr.span)
        return _number(ctx, folded)
    operand = value(ctx, expr.operand)
    if operand is None:
        return None
    node = ctx.add_node("neg", (operand,), (), ctx.nodes[operand].shape, COMPUTE_DTYPE, expr.span)
    return in_f32(ctx, node)


def _binop(ctx: Context, expr: ast.BinOp) -> int | None:
    if expr.op == "%":
        ctx.error(expr.op_span, "`%` is only allowed in `require` lines")
        return None
    lhs, rhs = value(ctx, expr.lhs), value(ctx, expr.rhs)
    if lhs is None or rhs is None:
        return None
    if expr.op == "@":
        return _matmul(ctx, expr, lhs, rhs)
    if expr.op == "/" and literal_value(ctx.nodes, rhs) == 0:
        # a kernel multiplies by the divisor's reciprocal, formed when it is traced: 1.0 / 0 fails there
        hint = "every value it gives is inf or nan: divide by a nonzero number"
        ctx.error(expr.rhs.span, "division by zero", hint)
        return None
    return elementwise(ctx, _ARITHMETIC[expr.op], (lhs, rhs), expr.span, expr.op)


def _matmul(ctx: Context, expr: ast.BinOp, lhs: int, rhs: int) -> int | None:
    a, b = ctx.nodes[lhs], ctx.nodes[rhs]
    if a.dtype != b.dtype and not mixed_fp8(a.dtype, b.dtype):
        message = f"dtype clash: `@` operands are {a.dtype} and {b.dtype}"
        ctx.error(expr.span, message, f"cast one side so both are the same, e.g. `{b.dtype}(...)`")
        return None
    shape = matmul_shape(a.shape, b.shape)
    if shape is None:
        ctx.error(expr.span, "matmul shapes do not fit", matmul_hint(a.shape, b.shape))
        return None
    return ctx.add_node("matmul", (lhs, rhs), (), shape, COMPUTE_DTYPE, expr.span)


def mixed_fp8(a: str, b: str) -> bool:
    """A 16-bit float times an fp8 one: the Tensor engine takes mixed fp8/bf16/fp16 inputs (only fp32
    must pair with fp32, ../nki.md nc_matmul), so fp8 weights need no cast of the activations."""
    return {a, b} & set(FP8_DTYPES) != set() and {a, b} - set(FP8_DTYPES) <= {"bf16", "f16"}


def _compare(ctx: Context, expr: ast.Compare) -> int | None:
    if len(expr.ops) > 1:
        ctx.error(expr.span, "chained comparisons are only allowed in `require` lines")
        return None
    lhs, rhs = value(ctx, expr.operands[0]), value(ctx, expr.operands[1])
    if lhs is None or rhs is None:
        return None
    return elementwise(ctx, _COMPARISONS[expr.ops[0]], (lhs, rhs), expr.span, expr.ops[0])


def _pow(ctx: Context, expr: ast.Pow) -> int | None:
    base = value(ctx, expr.base)
    exponent = literal_number(expr.exponent)
    if exponent is None or not math.isfinite(exponent):
        hint = "write the power as a number, e.g. `x ** 2` or `H ** -0.5`"
        ctx.error(expr.exponent.span, "the exponent of `**` must be a constant number", hint)
        return None
    if base is None:
        return None
    attrs = (("exponent", float(exponent)),)
    return in_f32(ctx, ctx.add_node("pow", (base,), attrs, ctx.nodes[base].shape, COMPUTE_DTYPE, expr.span))


def _index(ctx: Context, expr: ast.Index) -> int | None:
    base = value(ctx, expr.base)
    if base is None:
        return None
    source = ctx.nodes[base]
    if not source.shape:
        ctx.error(expr.span, "cannot index a scalar")
        return None
    picks = tuple(item for item in expr.items if not isinstance(item, ast.NoneLit))
    if len(picks) > len(source.shape):
        extra = picks[len(source.shape)]
        dims, got = len(source.shape), len(picks)
        ctx.error(extra.span, f"too many indices: {shape_str(source.shape)} has {dims} dims, got {got}")
        return None
    padded = picks + (None,) * (len(source.shape) - len(picks))  # omitted trailing dims: full
    items = tuple(_index_item(ctx, item, size) for item, size in zip(padded, source.shape, strict=True))
    if any(item is None for item in items):
        return None
    checked = tuple(item for item in items if item is not None)
    shape = tuple(i.stop - i.start for i in checked if i.kind == "slice" and i.stop is not None)
    node = base
    if not all(i.kind == "slice" and i.start == Dim.const(0) and i.stop == d for i, d in zip(
        checked, source.shape, strict=True
    )) or len(picks) == len(expr.items):  # fmt: skip
        node = ctx.add_node("index", (base,), (("index", checked),), shape, source.dtype, expr.span)
    if len(picks) == len(expr.items):
        return node
    return _new_axes(ctx, expr, node, shape)


def _new_axes(ctx: Context, expr: ast.Index, node: int, shape: tuple[Dim, ...]) -> int:
    """`a[:, None]`: the picked value with a size-1 axis where each `None` stands (NumPy's newaxis), as an
    `unindex` (the picked value placed at position 0 of each new axis)."""
    kept = iter(shape)
    items: list[IndexItem] = []
    for item in expr.items:
        if isinstance(item, ast.NoneLit):
            items.append(IndexItem("at", Dim.const(0)))
        elif isinstance(item, ast.Slice):  # a position drops its dim
            items.append(IndexItem("slice", Dim.const(0), next(kept)))
    items += [IndexItem("slice", Dim.const(0), size) for size in kept]  # omitted trailing dims
    result = tuple(i.stop if i.stop is not None else Dim.const(1) for i in items)
    attrs = (("index", tuple(items)),)
    return ctx.add_node("unindex", (node,), attrs, result, ctx.nodes[node].dtype, expr.span)


def _index_item(ctx: Context, item: ast.Expr | ast.Slice | None, size: Dim) -> IndexItem | None:
    """One dim of an index, bounds-checked as far as the fixed dims allow."""
    fixed = ctx.fixed_dims()
    if item is None:
        return IndexItem("slice", Dim.const(0), size)
    if isinstance(item, ast.Slice):
        start = Dim.const(0) if item.start is None else to_dim(ctx, item.start)
        stop = size if item.stop is None else to_dim(ctx, item.stop)
        if start is None or stop is None:
            return None
        problem = slice_problem(start, stop, size, fixed)
        result = IndexItem("slice", start, stop)
    else:
        position = to_dim(ctx, item)
        if position is None:
            return None
        problem = position_problem(position, size, fixed)
        result = IndexItem("at", position)
    if problem:
        ctx.error(item.span, problem)
        return None
    return result


_RULES: dict[type, Callable[[Context, Any], int | None]] = {
    ast.Name: _name,
    ast.Number: _number,
    ast.Bool: _misplaced_literal,
    ast.NoneLit: _misplaced_literal,
    ast.Neg: _neg,
    ast.BinOp: _binop,
    ast.Compare: _compare,
    ast.Pow: _pow,
    ast.Index: _index,
    ast.Call: lower_call,
}
