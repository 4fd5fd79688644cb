"""`require` lines become Constraints; `check` lines become CheckShapes that satisfy them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fusegen.dsl import ast, ir
from fusegen.dsl.context import Context
from fusegen.dsl.declarations import positive_int
from fusegen.dsl.diagnostics import Span
from fusegen.dsl.ir import Constraint, Dim
from fusegen.dsl.shapes import to_dim

#: the comparison seen from the other side: `1 <= R` is `R >= 1`.
_FLIPPED = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_REQUIRE_HINT = "e.g. `require K % 128 == 0` or `require 1 <= R <= 65536`"

Side = tuple[Dim, int | None]  # a dim expression, and the modulus when it is `expr % m`


def declare_requires(ctx: Context, decls: Sequence[ast.RequireDecl]) -> tuple[Constraint, ...]:
    """One Constraint per comparison in each `require` line (a chain `a <= b <= c` gives two)."""
    constraints: list[Constraint] = []
    for decl in decls:
        condition = decl.condition
        if not isinstance(condition, ast.Compare):
            ctx.error(condition.span, "a `require` line must be a comparison", _REQUIRE_HINT)
            continue
        sides = [_side(ctx, operand) for operand in condition.operands]
        for op, lhs, rhs in zip(condition.ops, sides, sides[1:], strict=False):
            if lhs is not None and rhs is not None:
                constraint = _constraint(ctx, lhs, op, rhs, decl.span)
                if constraint is not None:
                    constraints.append(constraint)
    return tuple(constraints)


def _side(ctx: Context, expr: ast.Expr) -> Side | None:
    """`K % 128` -> (K, 128); `R + 1` -> (R + 1, None)."""
    if isinstance(expr, ast.BinOp) and expr.op == "%":
        dim, modulus = to_dim(ctx, expr.lhs), to_dim(ctx, expr.rhs)
        if dim is None or modulus is None:
            return None
        if modulus.constant is None or modulus.constant < 1:
            ctx.error(expr.rhs.span, "the modulus must be a positive integer")
            return None
        return dim, modulus.constant
    dim = to_dim(ctx, expr)
    return None if dim is None else (dim, None)


def _constraint(ctx: Context, lhs: Side, op: str, rhs: Side, span: Span) -> Constraint | None:
    """Normalize `lhs op rhs` to `expr [% m] op integer`, with the dims on the left."""
    if lhs[1] is None and (rhs[1] is not None or lhs[0].constant is not None):
        lhs, op, rhs = rhs, _FLIPPED[op], lhs
    (left, modulus), (right, right_modulus) = lhs, rhs
    if right_modulus is not None or (modulus is not None and right.constant is None):
        ctx.error(span, "a `%` constraint compares against an integer", "e.g. `require K % 128 == 0`")
        return None
    if modulus is not None:  # `K % 128 == 0`: the left side stays as written
        expr, rhs_value = left, right.constant or 0
    else:  # `R + 1 <= K` -> `R - K <= -1`: dims on the left, the integer on the right
        offset = _constant_term(left - right)
        expr, rhs_value = left - right - offset, -offset
    if not expr.symbols():
        ctx.error(span, "this constraint mentions no dim", _REQUIRE_HINT)
        return None
    constraint = Constraint(expr, modulus, op, rhs_value, span)
    fixed = ctx.fixed_dims()
    if set(expr.symbols()) <= set(fixed) and not constraint.holds(fixed):
        ctx.error(span, f"the fixed dims violate `{constraint}`")
    return constraint


def _constant_term(dim: Dim) -> int:
    return dict(dim.terms).get((), 0)


def check_lines(
    ctx: Context, decls: Sequence[ast.CheckDecl], constraints: Sequence[Constraint]
) -> tuple[ir.CheckShape, ...]:
    """Each `check` line as concrete dims: every free dim given, values positive, constraints met."""
    if not decls:
        ctx.error(Span.whole_file(ctx.path), "the spec has no `check` line", "add e.g. `check R=256 K=1280`")
    shapes = []
    for decl in decls:
        given = _check_values(ctx, decl)
        if given is None:
            continue
        env = {**given, **ctx.fixed_dims()}
        if _satisfies(ctx, decl, env, constraints) and _shapes_fit(ctx, decl, env):
            shapes.append(ir.CheckShape(tuple(sorted(env.items())), decl.span))
    return tuple(shapes)


def _check_values(ctx: Context, decl: ast.CheckDecl) -> dict[str, int] | None:
    """The `NAME=value` pairs of one check line, or None after reporting what is wrong with them."""
    given: dict[str, int] = {}
    ok = True
    for item in decl.items:
        name = item.name.name
        dim = ctx.dims.get(name)
        value = positive_int(ctx, item.value, f"`{name}`")
        if dim is None:
            ctx.error(item.name.span, f"unknown dim `{name}`", _unknown_dim_hint(ctx, name))
        elif name in given:
            ctx.error(item.span, f"`{name}` is given twice")
        elif value is not None and dim.value is not None and value != dim.value:
            ctx.error(
                item.span,
                f"`{name}` is fixed to {dim.value}",
                f"drop `{name}=` or write `{name}={dim.value}`",
            )
        elif value is not None:
            given[name] = value
            continue
        ok = False
    missing = [d.name for d in ctx.dims.values() if d.value is None and d.name not in given]
    if ok and missing:
        listed = ", ".join(missing)
        ctx.error(
            decl.span, f"this check gives no value for {listed}", "every dim without a fixed value needs one"
        )
        ok = False
    return given if ok else None


def _satisfies(
    ctx: Context, decl: ast.CheckDecl, env: Mapping[str, int], constraints: Sequence[Constraint]
) -> bool:
    """Report every constraint the check breaks, at the `NAME=value` of the dim it mentions."""
    items = {item.name.name: item for item in decl.items}
    fixed = ctx.fixed_dims()
    ok = True
    for constraint in constraints:
        symbols = set(constraint.expr.symbols())
        if symbols <= set(fixed):  # already judged against the fixed dims
            continue
        if symbols <= set(env) and not constraint.holds(env):
            culprit = next((items[s] for s in constraint.expr.symbols() if s in items), None)
            span = culprit.span if culprit else decl.span
            ctx.error(span, f"this check violates `{constraint}` (line {constraint.span.line})")
            ok = False
    return ok


def _shapes_fit(ctx: Context, decl: ast.CheckDecl, env: Mapping[str, int]) -> bool:
    """Report dims that the check makes non-positive, and indices it pushes out of range."""
    problems: list[tuple[str, str | None]] = []
    for node in ctx.nodes:
        if node.op == "input" and any(size < 1 for size in ir.eval_shape(node.shape, env)):
            sizes = ", ".join(str(size) for size in ir.eval_shape(node.shape, env))
            declared = ", ".join(str(d) for d in node.shape)
            fix = (f"every axis of an input needs at least 1 element: give this check larger dims, or fix "
                   f"`{node.name}`'s shape [{declared}] at line {node.span.line}")  # fmt: skip
            problems.append((f"input `{node.name}` gets shape [{sizes}]", fix))
        if node.op == "index":
            source = ctx.nodes[node.args[0]].shape
            items = node.attr("index")
            assert isinstance(items, tuple)
            for item, size in zip(items, source, strict=True):
                if not _item_fits(item, size, env):
                    problems.append(
                        (f"the index at line {node.span.line} is out of range for a dim of size {size}", None)
                    )
    for problem, fix_hint in problems:
        ctx.error(decl.span, f"under this check, {problem}", fix_hint)
    return not problems


def _item_fits(item: ir.IndexItem, size: Dim, env: Mapping[str, int]) -> bool:
    start, limit = item.start.eval(env), size.eval(env)
    stop = start + 1 if item.stop is None else item.stop.eval(env)
    return 0 <= start < stop <= limit


def _unknown_dim_hint(ctx: Context, name: str) -> str:
    """A param named on a check line runs at its default; any other name may be a misspelt dim."""
    if ctx.kinds.get(name) == "param":
        return f"`{name}` is a param: a check line gives dims, and every check runs with the params' defaults"
    return ctx.suggest(name, ctx.dims) or _dims_hint(ctx)


def _dims_hint(ctx: Context) -> str:
    """The dims a check line may give (the first few: a hint, not a listing of thousands)."""
    names = list(ctx.dims)
    shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
    return f"the spec's dims are {shown}" if names else "the spec declares no dims: add a `dim` line"
