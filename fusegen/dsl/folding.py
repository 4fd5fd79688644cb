"""Scalars of numbers and params as a kernel forms them when NKI traces it: Python code over floats, then
used as f32 immediates. One spelling serves the kernel's stage code (codegen/stage.py), the host's checks
of the params (files/signature.py) and the checker's values of number-only expressions (below)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from fusegen.dsl.ir import F32_MAX, Node

#: each scalar op as Python over its operands' code (a comparison is a 1.0 / 0.0 float, `where` mixes by it)
SCALAR_CODE = {
    "add": "({} + {})", "sub": "({} - {})", "mul": "({} * {})", "div": "({} / {})", "neg": "(-{})",
    "maximum": "max({}, {})", "minimum": "min({}, {})", "abs": "abs({})", "square": "({} ** 2)",
    "sqrt": "({} ** 0.5)", "rsqrt": "({} ** -0.5)", "cast": "{}",
    "where": "({0} * {1} + (1.0 - {0}) * {2})",
    **{op: f"float({{}} {sym} {{}})" for op, sym in (("lt", "<"), ("le", "<="), ("gt", ">"), ("ge", ">="),
                                                    ("eq", "=="), ("ne", "!="))},
}  # fmt: skip
EVAL_NAMES = {"__builtins__": {}, "max": max, "min": min, "abs": abs, "float": float,
               "inf": math.inf, "nan": math.nan}  # fmt: skip


def power_base(code: str) -> str:
    """`code` fit to be the base of `**`: a negative number in parentheses, since `-2.0 ** 2` is -4.0."""
    return f"({code})" if code.startswith("-") else code


def scalar_code(node: Node, codes: Sequence[str]) -> str | None:
    """Python for scalar op `node` over its operands' `codes`, or None for an op a kernel does not form."""
    if node.op == "pow":
        return f"({power_base(codes[0])} ** {float(node.attr('exponent'))!r})"  # type: ignore[arg-type]
    form = SCALAR_CODE.get(node.op)
    if form is None:
        return None
    return form.format(power_base(codes[0])) if "**" in form else form.format(*codes)


def literal_value(nodes: Sequence[Node], node_id: int) -> float | None:
    """The value of a scalar made of numbers alone (nan where Python cannot form it: the kernel's trace
    fails there), or None for anything else (a tensor, a dim, a param, an op not formed in Python)."""
    code = _literal_code(nodes, node_id)
    if code is None:
        return None
    try:
        value = eval(code, EVAL_NAMES)  # our own code over float literals: the kernel's trace forms it so
    except (ArithmeticError, ValueError):
        return math.nan
    return math.nan if isinstance(value, complex) else float(value)


def _literal_code(nodes: Sequence[Node], node_id: int) -> str | None:
    node = nodes[node_id]
    if node.shape != ():
        return None
    if node.op == "const":
        return repr(float(node.attr("value")))  # type: ignore[arg-type]
    codes = [_literal_code(nodes, a) for a in node.args]
    if any(c is None for c in codes):
        return None
    return scalar_code(node, codes)  # type: ignore[arg-type]


def f32_problem(value: float | None) -> str | None:
    """Why a number-only scalar cannot be the kernel's f32 immediate, or None when it can (or is no such)."""
    if value is None or (math.isfinite(value) and abs(value) <= F32_MAX):
        return None
    return "has no value" if math.isnan(value) else f"is {value:.6g}, past f32's range"
