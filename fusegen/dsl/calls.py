"""Calls of built-in functions: bind arguments to the signature table, then lower by function family."""

from __future__ import annotations

import math
from collections.abc import Callable

from fusegen.dsl import ast, expressions  # mutual recursion: call `expressions.value` at run time
from fusegen.dsl.context import Context, article
from fusegen.dsl.diagnostics import Span
from fusegen.dsl.hints import function_hint, keyword_hint
from fusegen.dsl.ir import COMPUTE_DTYPE, Dim, shape_str
from fusegen.dsl.signatures import SIGNATURES, Signature

Bound = dict[str, ast.Expr]


def lower_call(ctx: Context, call: ast.Call) -> int | None:
    """The node for a call, or None after reporting a bad function, argument list or operand."""
    sig = SIGNATURES.get(call.func.name)
    if sig is None:
        ctx.error(call.func.span, f"unknown function `{call.func.name}`", _function_hint(ctx, call.func.name))
        return None
    bound = _bind(ctx, call, sig)
    if bound is None:
        return None
    return _FAMILIES[sig.family](ctx, call, sig, bound)


def _function_hint(ctx: Context, name: str) -> str | None:
    """A value called like a function says what it is; other names get hints.py's answer."""
    binding = ctx.scope.get(name)
    if binding is not None:
        return f"`{name}` is {article(binding.kind)}, not a function: multiply with `*`, project with `@`"
    return function_hint(name, SIGNATURES)


def _bind(ctx: Context, call: ast.Call, sig: Signature) -> Bound | None:
    """Match positional and keyword arguments to parameters, reporting every mismatch."""
    names = [p.name for p in sig.params]
    if call.keywords and any(_after(arg.span, call.keywords[0].span) for arg in call.args):
        ctx.error(call.span, "positional arguments must come before keyword arguments")
        return None
    if len(call.args) > len(names):
        message = f"`{sig.name}` takes {_arity(sig)}; got {len(call.args) + len(call.keywords)}"
        ctx.error(call.span, message, f"usage: {sig.usage()}")
        return None
    bound: Bound = dict(zip(names, call.args, strict=False))
    ok = True
    for kw in call.keywords:
        if kw.name.name not in names:
            hint = keyword_hint(kw.name.name, names) or f"usage: {sig.usage()}"
            ctx.error(kw.name.span, f"`{sig.name}` has no parameter `{kw.name.name}`", hint)
            ok = False
        elif kw.name.name in bound:
            ctx.error(kw.name.span, f"`{kw.name.name}` is given twice")
            ok = False
        else:
            bound[kw.name.name] = kw.value
    missing = [p.name for p in sig.params if not p.optional and p.name not in bound]
    if ok and missing:
        ctx.error(call.span, f"`{sig.name}` is missing `{missing[0]}`", f"usage: {sig.usage()}")
        ok = False
    return bound if ok else None


def _after(a: Span, b: Span) -> bool:
    return (a.line, a.col) > (b.line, b.col)


def _arity(sig: Signature) -> str:
    low = sum(not p.optional for p in sig.params)
    high = len(sig.params)
    count = str(low) if low == high else f"{low} to {high}"
    return f"{count} argument{'s' if high > 1 else ''}"


def _values(ctx: Context, bound: Bound, names: tuple[str, ...]) -> tuple[int, ...] | None:
    """Lower the arguments `names` (those given), or None if any fails."""
    nodes = [expressions.value(ctx, bound[n]) for n in names if n in bound]
    if any(n is None for n in nodes):
        return None
    return tuple(n for n in nodes if n is not None)


def _unary(ctx: Context, call: ast.Call, sig: Signature, bound: Bound) -> int | None:
    args = _values(ctx, bound, ("x",))
    if args is None:
        return None
    node = ctx.add_node(sig.op, args, (), ctx.nodes[args[0]].shape, COMPUTE_DTYPE, call.span)
    return expressions.in_f32(ctx, node)


def _binary(ctx: Context, call: ast.Call, sig: Signature, bound: Bound) -> int | None:
    args = _values(ctx, bound, ("a", "b"))
    return None if args is None else expressions.elementwise(ctx, sig.op, args, call.span, sig.name)


def _reduce(ctx: Context, call: ast.Call, sig: Signature, bound: Bound) -> int | None:
    args = _values(ctx, bound, ("x",))
    axis = _literal_int(ctx, bound["axis"], "axis")
    keepdim = _literal_bool(ctx, bound.get("keepdim"), "keepdim")
    if args is None or axis is None or keepdim is None:
        return None
    shape = ctx.nodes[args[0]].shape
    if not -len(shape) <= axis < len(shape):
        message = f"axis {axis} is out of range for {shape_str(shape)} ({len(shape)} dims)"
        ctx.error(bound["axis"].span, message, f"axes run from {-len(shape)} to {len(shape) - 1}")
        return None
    axis %= len(shape)
    kept = (*shape[:axis], *((Dim.const(1),) if keepdim else ()), *shape[axis + 1 :])
    attrs = (("axis", axis), ("keepdim", keepdim))
    return ctx.add_node(sig.op, args, attrs, kept, COMPUTE_DTYPE, call.span)


def _clamp(ctx: Context, call: ast.Call, sig: Signature, bound: Bound) -> int | None:
    args = _values(ctx, bound, ("x",))
    lo, lo_ok = _bound_value(ctx, bound.get("min"))
    hi, hi_ok = _bound_value(ctx, bound.get("max"))
    if args is None or not (lo_ok and hi_ok):
        return None
    if lo is None and hi is None:
        ctx.error(call.span, "`clamp` needs a `min` or a `max` bound", "clamp(x, min=0.0)")
        return None
    if lo is not None and hi is not None and lo > hi:
        ctx.error(call.span, f"`clamp`'s min {lo} is above its max {hi}")
        return None
    attrs = (("lo", lo), ("hi", hi))
    return ctx.add_node("clamp", args, attrs, ctx.nodes[args[0]].shape, COMPUTE_DTYPE, call.span)


def _where(ctx: Context, call: ast.Call, sig: Signature, bound: Bound) -> int | None:
    cond = expressions.lower(ctx, bound["cond"])
    if cond is not None and ctx.nodes[cond].dtype != "bool":
        ctx.error(bound["cond"].span, "`where`'s condition must be a comparison", "where(x > 0, x, 0)")
        cond = None
    branches = _values(ctx, bound, ("a", "b"))
    if cond is None or branches is None:
        return None
    return expressions.elementwise(ctx, "where", (cond, *branches), call.span, "where")


def _norm(ctx: Context, call: ast.Call, sig: Signature, bound: Bound) -> int | None:
    if "beta" in bound and "gamma" not in bound:
        ctx.error(bound["beta"].span, "`beta` needs `gamma`", "pass gamma too, e.g. a ones vector")
        return None
    args = _values(ctx, bound, ("x", "eps", "gamma", "beta"))
    if args is None:
        return None
    x, eps, *affine = (ctx.nodes[a] for a in args)
    if not x.shape:
        ctx.error(bound["x"].span, f"`{sig.name}` normalizes over the last dim; got a scalar")
        return None
    ok = True
    if eps.shape:
        usage = f"usage: {sig.usage()}"  # `rmsnorm(x, w)`: torch's order, the weight taken for eps
        ctx.error(bound["eps"].span, f"`eps` must be a scalar; got {shape_str(eps.shape)}", usage)
        ok = False
    for name, node in zip(("gamma", "beta"), affine, strict=False):
        if node.shape != x.shape[-1:]:
            message = f"`{name}` must have shape {shape_str(x.shape[-1:])} (the last dim of x)"
            ctx.error(bound[name].span, f"{message}; got {shape_str(node.shape)}")
            ok = False
    return ctx.add_node(sig.op, args, (), x.shape, COMPUTE_DTYPE, call.span) if ok else None


def _cast(ctx: Context, call: ast.Call, sig: Signature, bound: Bound) -> int | None:
    args = _values(ctx, bound, ("x",))
    if args is None:
        return None
    return ctx.add_node("cast", args, (("to", sig.name),), ctx.nodes[args[0]].shape, sig.name, call.span)


def _literal_int(ctx: Context, expr: ast.Expr, what: str) -> int | None:
    negated = isinstance(expr, ast.Neg)
    literal = expr.operand if isinstance(expr, ast.Neg) else expr
    if not (isinstance(literal, ast.Number) and literal.is_int):
        ctx.error(expr.span, f"`{what}` must be an integer literal")
        return None
    return -int(literal.text) if negated else int(literal.text)


def _literal_bool(ctx: Context, expr: ast.Expr | None, what: str) -> bool | None:
    if expr is None:
        return False
    if not isinstance(expr, ast.Bool):
        spelt = expr.name if isinstance(expr, ast.Name) and expr.name in ("True", "False") else None
        hint = f"write `{spelt.lower()}`: the spec's booleans are lower case" if spelt else None
        ctx.error(expr.span, f"`{what}` must be `true` or `false`", hint)
        return None
    return expr.value


def _bound_value(ctx: Context, expr: ast.Expr | None) -> tuple[float | None, bool]:
    """A clamp bound: a constant number or None; (value, ok)."""
    if expr is None or isinstance(expr, ast.NoneLit):
        return None, True
    number = expressions.literal_number(expr)
    if number is None or not math.isfinite(number):
        hint = "for a param bound use maximum(x, eps) or minimum(x, eps)"
        ctx.error(expr.span, "clamp bounds must be constant numbers or `None`", hint)
        return None, False
    return number, True


_FAMILIES: dict[str, Callable[[Context, ast.Call, Signature, Bound], int | None]] = {
    "unary": _unary,
    "binary": _binary,
    "reduce": _reduce,
    "clamp": _clamp,
    "where": _where,
    "norm": _norm,
    "cast": _cast,
}
