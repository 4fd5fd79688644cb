"""Values of scalar expressions of numbers alone, as a kernel forms them when NKI traces it: in Python floats,
then used as f32 immediates (codegen/stage.py's scalar code; files/signature.py checks the params' own)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from fusegen.dsl.ir import F32_MAX, Node

_OPS: dict[str, Callable[..., float]] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b, "neg": lambda a: -a, "maximum": max, "minimum": min, "abs": abs,
    "square": lambda a: a * a, "sqrt": lambda a: a**0.5, "rsqrt": lambda a: a**-0.5, "cast": float,
}  # fmt: skip


def literal_value(nodes: Sequence[Node], node_id: int) -> float | None:
    """The value of a scalar made of numbers alone (nan where Python cannot form it: the kernel's trace
    fails there), or None for anything else (a tensor, a dim, a param, an op not formed in Python)."""
    node = nodes[node_id]
    if node.shape != ():
        return None
    if node.op == "const":
        return float(node.attr("value"))  # type: ignore[arg-type]
    fn = _OPS.get(node.op) if node.op != "pow" else (lambda a: a ** float(node.attr("exponent")))  # type: ignore[arg-type]
    args = [literal_value(nodes, a) for a in node.args]
    if fn is None or any(a is None for a in args):
        return None
    try:
        value = fn(*args)
    except (ArithmeticError, ValueError):
        return math.nan
    return math.nan if isinstance(value, complex) else float(value)


def f32_problem(value: float | None) -> str | None:
    """Why a number-only scalar cannot be the kernel's f32 immediate, or None when it can (or is no such)."""
    if value is None or (math.isfinite(value) and abs(value) <= F32_MAX):
        return None
    return "has no value" if math.isnan(value) else f"is {value:.6g}, past f32's range"
