"""Shape rules: dim expressions, NumPy broadcasting, matmul, and the bounds of index items."""

from __future__ import annotations

from collections.abc import Mapping

from fusegen.dsl import ast
from fusegen.dsl.context import Context, article
from fusegen.dsl.ir import Dim, Shape, shape_str

#: larger dims are surely typos, and would overflow the int32 index math of generated kernels.
MAX_DIM_VALUE = 2**31 - 1
#: dims are kept expanded (`(A + B) * (A + B)` has 3 terms); products are capped before expanding, as
#: a line of such factors would otherwise expand to millions of terms.
MAX_DIM_TERMS = 64
_DIM_EXPR_HINT = "a dim expression is made of dim names, integers, `+`, `-` and `*`"


def to_dim(ctx: Context, expr: ast.Expr) -> Dim | None:
    """The dim polynomial `expr` spells, or None after reporting why it is not one."""
    if isinstance(expr, ast.Name):
        if expr.name in ctx.dims:
            return Dim.sym(expr.name)
        kind = ctx.kinds.get(expr.name)
        if kind in ("input", "param", "value"):
            hint = _not_a_dim_hint(kind, expr.name)
            ctx.error(expr.span, f"`{expr.name}` is {article(kind)}, not a dim", hint)
        else:
            ctx.unknown_name(expr.span, expr.name, "dim")
        return None
    if isinstance(expr, ast.Number):
        return _integer(ctx, expr)
    if isinstance(expr, ast.Neg):
        inner = to_dim(ctx, expr.operand)
        return None if inner is None else inner * -1
    if isinstance(expr, ast.BinOp) and expr.op in "+-*":
        lhs, rhs = to_dim(ctx, expr.lhs), to_dim(ctx, expr.rhs)
        if lhs is None or rhs is None:
            return None
        if expr.op == "*" and len(lhs.terms) * len(rhs.terms) > MAX_DIM_TERMS:  # before expanding it
            ctx.error(expr.span, f"this dim expression expands to more than {MAX_DIM_TERMS} terms")
            return None
        return lhs + rhs if expr.op == "+" else lhs - rhs if expr.op == "-" else lhs * rhs
    ctx.error(expr.span, "not a dim expression", _DIM_EXPR_HINT)
    return None


def _not_a_dim_hint(kind: str, name: str) -> str:
    """A param is a scalar each call passes: it can size no shape and pick no index."""
    if kind == "param":
        return (f"a param is a scalar each call passes; shapes, indices and `require` lines are made of "
                f"dims: declare `dim {name}` instead, or fix it with `dim {name} = 64`")  # fmt: skip
    return _DIM_EXPR_HINT


def _integer(ctx: Context, number: ast.Number) -> Dim | None:
    if not number.is_int:
        ctx.error(number.span, f"dims are integers; got `{number.text}`")
        return None
    if abs(number.value) > MAX_DIM_VALUE:
        ctx.error(number.span, f"`{number.text}` is too large for a dim (at most {MAX_DIM_VALUE})")
        return None
    return Dim.const(int(number.text))


def substitute(dim: Dim, fixed: Mapping[str, int]) -> Dim:
    """`dim` with the fixed dims replaced by their values."""
    total = Dim.const(0)
    for mono, coef in dim.terms:
        term = Dim.const(coef)
        for name in mono:
            term = term * (Dim.const(fixed[name]) if name in fixed else Dim.sym(name))
        total = total + term
    return total


def broadcast(shapes: tuple[Shape, ...]) -> Shape | None:
    """The NumPy broadcast of `shapes` (see ir.BROADCAST_RULE), or None if they do not broadcast."""
    rank = max(len(s) for s in shapes)
    result: list[Dim] = []
    for axis in range(-rank, 0):
        sizes = {s[axis] for s in shapes if len(s) >= -axis} - {Dim.const(1)}
        if len(sizes) > 1:
            return None
        result.append(sizes.pop() if sizes else Dim.const(1))
    return tuple(result)


def broadcast_hint(shapes: tuple[Shape, ...]) -> str:
    """Which aligned dims clash, for the hint of a broadcast error."""
    rank = max(len(s) for s in shapes)
    for axis in range(-1, -rank - 1, -1):
        sizes = [s[axis] for s in shapes if len(s) >= -axis]
        distinct = sorted({str(d) for d in sizes if d != Dim.const(1)})
        if len(distinct) > 1:
            return (
                f"shapes align at their last dim, and dim {axis} is {' vs '.join(distinct)}; "
                "aligned dims must be equal or 1"
            )
    return "shapes align at their last dim; aligned dims must be equal or 1"


def matmul_shape(lhs: Shape, rhs: Shape) -> Shape | None:
    """`[.., M, K] @ [K, N] -> [.., M, N]`, or None if the operands do not fit that pattern."""
    if len(rhs) != 2 or len(lhs) < 1 or lhs[-1] != rhs[0]:
        return None
    return (*lhs[:-1], rhs[1])


def matmul_hint(lhs: Shape, rhs: Shape) -> str:
    """The rule and the offending shapes."""
    return f"matmul needs [.., K] @ [K, N]; got {shape_str(lhs)} @ {shape_str(rhs)}"


def slice_problem(start: Dim, stop: Dim, size: Dim, fixed: Mapping[str, int]) -> str | None:
    """Why `start:stop` cannot lie within a dim of `size`, when that is known without concrete dims."""
    start, stop, size = (substitute(d, fixed) for d in (start, stop, size))
    for bound in (start, stop):  # NumPy's `-1` is `size - 1` here: say so, in this dim's terms
        if bound.constant is not None and bound.constant < 0:
            return f"slice bounds must not be negative: count from the start (`{size + bound}` for `{bound}`)"
    width = (stop - start).constant
    if width is not None and width <= 0:
        return f"the slice {start}:{stop} is empty"
    past_end = (stop - size).constant
    if past_end is not None and past_end > 0:
        return f"the slice {start}:{stop} runs past the end of a dim of size {size}"
    return None


def position_problem(position: Dim, size: Dim, fixed: Mapping[str, int]) -> str | None:
    """Why `position` cannot index a dim of `size`, when that is known without concrete dims."""
    position, size = substitute(position, fixed), substitute(size, fixed)
    if position.constant is not None and position.constant < 0:
        return f"indices must not be negative: count from the start (`{size + position}` for `{position}`)"
    past_end = (position - size).constant
    if past_end is not None and past_end >= 0:
        return f"index {position} is out of range for a dim of size {size}"
    return None
