"""Stage expressions: the elementwise / row-wise part of a kernel, expanded into engine-sized primitives.

A stage works on one tile layout (partitions x free elements). Every value in it is a full tile, a
per-partition column (`vec`, shape [P, 1]) or a trace-time Python scalar. Built-ins that are not one
instruction (mean, layernorm, rmsnorm, x ** 2) are expanded here so that instruction selection
(`select.py`) only sees primitives. Division, which no engine has as an instruction (NKI release notes),
becomes a multiplication by `1 / d` (folded at trace time for a scalar divisor, else a `recip` the
selector emits as nisa.reciprocal); integer powers become products of squares. `where(c, a, b)` becomes
`m * a + (1 - m) * b` over the comparison's 1.0 / 0.0 mask `m` (ALU comparisons, [ALU]): both products are
exact (a factor is 0 or 1), so the sum is the selected value bit for bit wherever the branch not taken is
finite (an infinity there gives NaN, 0 * inf); a zero branch drops its product.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from fusegen.dsl.folding import scalar_code
from fusegen.dsl.ir import Dim, KernelIR, Node


@dataclass(frozen=True, eq=False)
class Operand:
    """A value the generated code can already name: an access expression plus where it lives."""

    kind: str  # "tile" | "vec" | "scalar"
    code: str  # e.g. `y1[0:ph, 0:rw]`, `b1_sb[0:ph, hg:hg + 1]`, `eps`
    memory: str = "sbuf"  # "sbuf" | "psum" ("" for scalars)
    dtype: str = "f32"
    positive: bool = False  # known > 0 (a sum of exponentials): its log is defined (select_folds.py)
    scale: str = ""  # the value is this operand times the trace-time scalar `scale` (a deferred 1/n)

    @property
    def name(self) -> str:
        """The tile (or column, or scalar) the access expression reads, without its slice."""
        return self.code.split("[")[0]


@dataclass(eq=False)
class Expr:
    """One stage expression; identity is the node (shared subexpressions are the same object)."""

    op: str
    args: tuple[Expr, ...] = ()
    kind: str = "tile"  # "tile" | "vec" | "scalar"
    leaf: Operand | None = None  # op == "leaf"
    code: str = ""  # op == "scalar": a Python expression
    dtype: str = "f32"  # op == "cast": the target dtype
    users: int = field(default=0, compare=False)


def scalar(code: str) -> Expr:
    """A trace-time scalar expression."""
    return Expr("scalar", kind="scalar", code=code)


def dim_code(dim: Dim) -> str:
    """Python source of a dim's value as a float inside a kernel, where dim `K` is the local `d_K`."""
    return f"float({dim_source(dim)})" if dim.symbols() else repr(float(dim.eval({})))


def inverse_code(dim: Dim) -> str:
    """Python source of `1 / dim` as a float inside a kernel (a mean's scale)."""
    return f"(1.0 / {dim_code(dim)})"


def dim_source(dim: Dim) -> str:
    """Python source of a dim's integer value, symbols spelled as kernel locals `d_<name>`."""
    terms = []
    for mono, coef in dim.terms:
        factors = [f"d_{name}" for name in mono]
        if coef != 1 or not factors:
            factors.insert(0, str(coef))
        terms.append(" * ".join(factors))
    return "(" + " + ".join(terms) + ")" if len(terms) > 1 else (terms[0] if terms else "0")


class StageBuilder:
    """Expands IR nodes of one stage into `Expr`s over given leaves."""

    def __init__(
        self,
        ir: KernelIR,
        leaves: Mapping[int, Operand],
        kind_of: Callable[[Node], str],
        free_size: Callable[[Node], Dim],
    ) -> None:
        self.ir = ir
        self.kind_of = kind_of
        self.free_size = free_size  # size of the reduced (free) axis of a node's operand
        self.exprs: dict[int, Expr] = {nid: _leaf_expr(op) for nid, op in leaves.items()}
        self._recips: dict[int, Expr] = {}  # divisor identity -> its reciprocal, computed once

    def expr(self, node_id: int) -> Expr:
        """The stage expression of IR node `node_id` (built once)."""
        todo = [node_id]  # depth first without recursion: a long chain of statements is a deep graph
        while todo:
            node = self.ir.node(todo[-1])
            missing = [a for a in node.args if a not in self.exprs]
            if node.id in self.exprs or not missing:
                todo.pop()
                if node.id not in self.exprs:
                    self.exprs[node.id] = self._build(node, [self.exprs[a] for a in node.args])
            else:
                todo += missing
        return self.exprs[node_id]

    def _build(self, node: Node, args: list[Expr]) -> Expr:
        kind = self.kind_of(node)
        if kind == "scalar":
            return scalar(self._scalar_code(node, args))
        expand = _EXPANSIONS.get(node.op)
        if expand is not None:
            return expand(self, node, args)
        if node.op == "cast":
            return _mk("cast", args, kind, dtype=node.dtype)
        return _mk(node.op, args, kind)

    def _scalar_code(self, node: Node, args: list[Expr]) -> str:
        if node.op == "param":
            return f"{node.name}_arg"  # the kernel's argument for the param
        if node.op == "const":
            return repr(float(node.attr("value")))  # type: ignore[arg-type]
        if node.op == "dim":
            return dim_code(node.attr("dim"))  # type: ignore[arg-type]
        code = scalar_code(node, [a.code for a in args])
        if code is not None:
            return code
        raise StageError(node, f"`{node.op}` of scalars is not supported in a kernel")

    def reciprocal(self, den: Expr) -> Expr:
        """`1 / den` (one instruction per divisor however often it divides)."""
        if den.kind == "scalar":
            return scalar(f"(1.0 / {den.code})")
        if id(den) not in self._recips:
            self._recips[id(den)] = _mk("recip", [den], den.kind)
        return self._recips[id(den)]

    def reduce_scale(self, node: Node) -> Expr:
        """1 / (size of the reduced axis), as a scalar."""
        return scalar(inverse_code(self.free_size(node)))


class StageError(Exception):
    """A node the stage cannot express (reported as a spec error by the family matcher)."""

    def __init__(self, node: Node, message: str) -> None:
        super().__init__(message)
        self.node = node
        self.message = message


def _leaf_expr(op: Operand) -> Expr:
    if op.scale:  # read as `operand * scale`, which a consuming activation can take in its scale
        held = Operand(op.kind, op.code, op.memory, op.dtype, op.positive)
        return _mk("mul", [_leaf_expr(held), scalar(op.scale)], op.kind)
    return Expr("leaf", kind=op.kind, leaf=op, dtype=op.dtype)


def _mk(op: str, args: list[Expr] | tuple[Expr, ...], kind: str, dtype: str = "f32") -> Expr:
    for a in args:
        a.users += 1
    return Expr(op, tuple(args), kind=kind, dtype=dtype)


def _expand_pow(b: StageBuilder, node: Node, args: list[Expr]) -> Expr:
    exponent = float(node.attr("exponent"))  # type: ignore[arg-type]
    named = {2.0: "square", 0.5: "sqrt", -0.5: "rsqrt"}.get(exponent)
    if exponent == 1.0:
        return args[0]
    if named:
        return _mk(named, args, b.kind_of(node))
    if exponent.is_integer() and 0 < abs(exponent) <= MAX_INT_POWER:
        power = _int_power(args[0], int(abs(exponent)), b.kind_of(node))
        return power if exponent > 0 else b.reciprocal(power)
    return _mk("pow", [args[0], scalar(repr(exponent))], b.kind_of(node))


#: Integer exponents up to this are products of squares (a few exact-ish fp32 multiplies instead of
#: nl.power, which only GpSimd runs and which needs its exponent as a tile).
MAX_INT_POWER = 8


def _int_power(x: Expr, n: int, kind: str) -> Expr:
    """x ** n by squaring: x ** 3 = square(x) * x."""
    if n == 1:
        return x
    squared = _mk("square", [_int_power(x, n // 2, kind)], kind)
    return _mk("mul", [squared, x], kind) if n % 2 else squared


def _expand_div(b: StageBuilder, node: Node, args: list[Expr]) -> Expr:
    num, den = args
    return _mk("mul", [num, b.reciprocal(den)], b.kind_of(node))


def _expand_mean(b: StageBuilder, node: Node, args: list[Expr]) -> Expr:
    total = _mk("sum", args, "vec")
    return _mk("mul", [total, b.reduce_scale(node)], "vec")


def _expand_reduce(b: StageBuilder, node: Node, args: list[Expr]) -> Expr:
    return _mk(node.op, args, "vec")


def _expand_clamp(b: StageBuilder, node: Node, args: list[Expr]) -> Expr:
    kind, out = b.kind_of(node), args[0]
    for op, key in (("maximum", "lo"), ("minimum", "hi")):
        bound = node.attr(key)
        if bound is not None:
            out = _mk(op, [out, scalar(repr(float(bound)))], kind)  # type: ignore[arg-type]
    return out


def _expand_layernorm(b: StageBuilder, node: Node, args: list[Expr]) -> Expr:
    x, eps, *affine = args
    inv_n = b.reduce_scale(node)
    neg_mu = _mk("mul", [_mk("sum", [x], "vec"), scalar(f"(-{inv_n.code})")], "vec")
    centred = _mk("add", [x, neg_mu], "tile")
    var = _mk("mul", [_mk("sum", [_mk("square", [centred], "tile")], "vec"), inv_n], "vec")
    return _affine(_mk("mul", [centred, _rstd(var, eps)], "tile"), affine)


def _expand_rmsnorm(b: StageBuilder, node: Node, args: list[Expr]) -> Expr:
    x, eps, *affine = args
    mean_sq = _mk("mul", [_mk("sum", [_mk("square", [x], "tile")], "vec"), b.reduce_scale(node)], "vec")
    return _affine(_mk("mul", [x, _rstd(mean_sq, eps)], "tile"), affine)


def _rstd(var: Expr, eps: Expr) -> Expr:
    return _mk("rsqrt", [_mk("add", [var, eps], "vec")], "vec")


def _affine(y: Expr, affine: list[Expr]) -> Expr:
    if affine:
        y = _mk("mul", [y, affine[0]], "tile")
    if len(affine) > 1:
        y = _mk("add", [y, affine[1]], "tile")
    return y


def _expand_where(b: StageBuilder, node: Node, args: list[Expr]) -> Expr:
    mask, chosen, other = args
    if mask.kind == "scalar":  # a comparison of scalars is a trace-time 1.0 / 0.0
        inverse = scalar(f"(1.0 - {mask.code})")
    else:
        inverse = _mk("sub", [scalar("1.0"), mask], mask.kind)
    parts = [_product(m, v) for m, v in ((mask, chosen), (inverse, other)) if not _is_zero(v)]
    if not parts:
        return _product(mask, scalar("0.0"))
    return parts[0] if len(parts) == 1 else _mk("add", parts, b.kind_of(node))


def _product(mask: Expr, value: Expr) -> Expr:
    """`mask * value`, of the wider of the two kinds (a column mask over a tile is a tile)."""
    kinds = ("scalar", "vec", "tile")
    kind = max(mask.kind, value.kind, key=kinds.index)
    if kind == "scalar":
        return scalar(f"({mask.code} * {value.code})")
    return _mk("mul", [mask, value], kind)


def _is_zero(e: Expr) -> bool:
    return e.kind == "scalar" and e.code in ("0.0", "-0.0")


def _expand_broadcast(b: StageBuilder, node: Node, args: list[Expr]) -> Expr:
    return args[0]  # a column broadcasts over the free axis wherever it is an operand


_EXPANSIONS: dict[str, Callable[[StageBuilder, Node, list[Expr]], Expr]] = {
    "expand": _expand_broadcast,
    "pow": _expand_pow,
    "div": _expand_div,
    "mean": _expand_mean,
    "sum": _expand_reduce,
    "max": _expand_reduce,
    "clamp": _expand_clamp,
    "where": _expand_where,
    "layernorm": _expand_layernorm,
    "rmsnorm": _expand_rmsnorm,
}
