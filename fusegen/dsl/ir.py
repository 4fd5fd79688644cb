"""Typed IR: the checked form of a spec, every value with a shape over symbolic dims and a dtype.

The IR is a flat tuple of SSA nodes in topological order (`KernelIR.nodes[i].id == i`).
Math is f32 unless a cast says otherwise; inputs keep their declared dtype.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fusegen.dsl.diagnostics import Span

#: dtypes a spec may name; the fp8 ones are the OCP formats (e4m3 is the "fn" variant: no inf, max 448).
DTYPES = ("bf16", "f16", "f32", "fp8_e4m3", "fp8_e5m2")
#: 8-bit float dtypes: storage and matmul inputs only (every computed value is f32 unless cast).
FP8_DTYPES = ("fp8_e4m3", "fp8_e5m2")
#: dtype of every computed value unless a cast says otherwise.
COMPUTE_DTYPE = "f32"
#: the largest finite f32: a param or a constant is an fp32 immediate in the kernel (docs/spec-language.md)
F32_MAX = 3.4028234663852886e38
#: bytes per element of each dtype.
DTYPE_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "fp8_e4m3": 1, "fp8_e5m2": 1, "bool": 1}

Monomial = tuple[str, ...]  # sorted symbol names; () is the constant term


@dataclass(frozen=True)
class Dim:
    """A dim expression as a canonical polynomial over symbols: `HC + 1` == `1 + HC`."""

    terms: tuple[tuple[Monomial, int], ...]  # sorted, no zero coefficients

    @staticmethod
    def sym(name: str) -> Dim:
        """The dim named `name`."""
        return Dim((((name,), 1),))

    @staticmethod
    def const(value: int) -> Dim:
        """A literal dim."""
        return Dim((((), value),) if value else ())

    def _combine(self, other: Dim | int, sign: int) -> Dim:
        acc = dict(self.terms)
        for mono, coef in _as_dim(other).terms:
            acc[mono] = acc.get(mono, 0) + sign * coef
        return Dim(tuple(sorted((m, c) for m, c in acc.items() if c)))

    def __add__(self, other: Dim | int) -> Dim:
        return self._combine(other, 1)

    def __sub__(self, other: Dim | int) -> Dim:
        return self._combine(other, -1)

    def __mul__(self, other: Dim | int) -> Dim:
        acc: dict[Monomial, int] = {}
        for m1, c1 in self.terms:
            for m2, c2 in _as_dim(other).terms:
                mono = tuple(sorted(m1 + m2))
                acc[mono] = acc.get(mono, 0) + c1 * c2
        return Dim(tuple(sorted((m, c) for m, c in acc.items() if c)))

    @property
    def constant(self) -> int | None:
        """The value when the expression has no symbols, else None."""
        if not self.terms:
            return 0
        if len(self.terms) == 1 and self.terms[0][0] == ():
            return self.terms[0][1]
        return None

    def symbols(self) -> tuple[str, ...]:
        """Symbols the expression mentions, sorted."""
        return tuple(sorted({s for mono, _ in self.terms for s in mono}))

    def eval(self, env: Mapping[str, int]) -> int:
        """The value under concrete dims `env`."""
        total = 0
        for mono, coef in self.terms:
            value = coef
            for name in mono:
                value *= env[name]
            total += value
        return total

    def __str__(self) -> str:
        if not self.terms:
            return "0"
        parts = []
        # symbols first, constant last: `HC + 1`
        for i, (mono, coef) in enumerate(sorted(self.terms, key=lambda t: (t[0] == (), t[0]))):
            body = "*".join(mono)
            mag = abs(coef)
            text = body if mono and mag == 1 else (f"{mag}*{body}" if mono else str(mag))
            sign = "-" if coef < 0 else "+"
            parts.append(("-" + text if sign == "-" else text) if i == 0 else f" {sign} {text}")
        return "".join(parts)


def _as_dim(value: Dim | int) -> Dim:
    return value if isinstance(value, Dim) else Dim.const(value)


Shape = tuple[Dim, ...]


def shape_str(shape: Shape) -> str:
    """`[R, K]` for printing in messages and dumps."""
    return "[" + ", ".join(str(d) for d in shape) + "]"


def eval_shape(shape: Shape, env: Mapping[str, int]) -> tuple[int, ...]:
    """Concrete sizes of `shape` under `env`."""
    return tuple(d.eval(env) for d in shape)


# ---- declarations -------------------------------------------------------------------------------


@dataclass(frozen=True)
class DimDecl:
    """A symbolic dim, optionally fixed (`HC = 4`)."""

    name: str
    value: int | None
    span: Span


@dataclass(frozen=True)
class Constraint:
    """`expr % modulus op rhs` (modulus None: `expr op rhs`), e.g. `K % 128 == 0`, `R >= 1`."""

    expr: Dim
    modulus: int | None
    op: str  # one of == != < <= > >=
    rhs: int
    span: Span

    def holds(self, env: Mapping[str, int]) -> bool:
        """Whether concrete dims `env` satisfy the constraint."""
        value = self.expr.eval(env)
        if self.modulus is not None:
            value %= self.modulus
        return _COMPARE[self.op](value, self.rhs)

    def __str__(self) -> str:
        lhs = f"{self.expr} % {self.modulus}" if self.modulus is not None else str(self.expr)
        return f"{lhs} {self.op} {self.rhs}"


_COMPARE = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


@dataclass(frozen=True)
class TensorDecl:
    """A kernel input or output tensor."""

    name: str
    dtype: str
    shape: Shape
    span: Span
    finite: bool = False  # an input declared `finite`: the host refuses inf and nan in it


@dataclass(frozen=True)
class ParamDecl:
    """A scalar parameter with its default (`eps = 1e-6`)."""

    name: str
    default: float
    span: Span


@dataclass(frozen=True)
class OutputDecl:
    """A kernel output: which node it returns, its declared dtype and shape, and whether it is optional."""

    name: str
    node: int
    dtype: str
    shape: Shape
    optional: bool
    span: Span


@dataclass(frozen=True)
class CheckShape:
    """A `check` line: concrete dims the generated tests run."""

    dims: tuple[tuple[str, int], ...]  # sorted by name
    span: Span

    def env(self) -> dict[str, int]:
        """The dims as a mapping."""
        return dict(self.dims)


# ---- values -------------------------------------------------------------------------------------

#: Node ops, with their operands (args) and attributes:
#:   input    ()                      attrs: index (position among inputs)
#:   param    ()                      attrs: default (float)            scalar, shape ()
#:   const    ()                      attrs: value (float)              scalar, shape ()
#:   dim      ()                      attrs: dim (Dim)                  a dim used as a scalar value
#:   matmul   (a [.., M, K], b [K, N]) -> [.., M, N]
#:   add sub mul div maximum minimum  (a, b) broadcast (see BROADCAST_RULE)
#:   lt le gt ge eq ne                (a, b) -> dtype "bool"
#:   pow      (a,)                    attrs: exponent (float)
#:   UNARY ops                        (a,)
#:   sum mean max                     (a,)   attrs: axis (int >= 0), keepdim (bool)
#:   clamp    (a,)                    attrs: lo (float | None), hi (float | None)
#:   where    (cond, a, b)
#:   layernorm (x, eps[, gamma[, beta]])   over the last axis
#:   rmsnorm   (x, eps[, gamma])           over the last axis
#:   cast     (a,)                    attrs: to (dtype); node dtype == to
#:   index    (a,)                    attrs: index (tuple of IndexItem, one per source dim)
#:   unindex  (a,)                    attrs: index (one IndexItem per result dim): zeros of the node's shape
#:                                    with `a` placed at index; a spec's `a[:, None]` is one whose `at 0`
#:                                    items are the new size-1 axes (the backward IR's scatter, autodiff.py)
UNARY_OPS = (
    "neg",
    "silu",
    "gelu",
    "gelu_tanh",
    "relu",
    "sigmoid",
    "tanh",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "abs",
    "sign",
    "square",
)
BINARY_OPS = ("add", "sub", "mul", "div", "maximum", "minimum")
COMPARE_OPS = ("lt", "le", "gt", "ge", "eq", "ne")
REDUCE_OPS = ("sum", "mean", "max")
NORM_OPS = ("layernorm", "rmsnorm")

BROADCAST_RULE = (
    "shapes align at their last dim; each pair of dims must be equal, or one of them is 1 or missing "
    "(NumPy's rule)"
)


@dataclass(frozen=True)
class IndexItem:
    """One dim of an index: `start:stop` (kind 'slice') or a single position (kind 'at', dim dropped)."""

    kind: str  # "slice" | "at"
    start: Dim
    stop: Dim | None = None  # slices only


AttrValue = int | float | bool | str | None | Dim | tuple[IndexItem, ...]


@dataclass(frozen=True)
class Node:
    """One SSA value: op over earlier nodes, with its inferred shape and dtype and its source span."""

    id: int
    op: str
    args: tuple[int, ...]
    attrs: tuple[tuple[str, AttrValue], ...]
    shape: Shape
    dtype: str
    span: Span
    name: str | None = None  # the spec's name, when a statement or declaration binds it

    def attr(self, key: str) -> AttrValue:
        """The attribute `key` (KeyError if absent: a bug in the caller)."""
        return dict(self.attrs)[key]


@dataclass(frozen=True)
class KernelIR:
    """A checked spec: declarations plus the value graph."""

    name: str
    path: str
    source_sha256: str
    dims: tuple[DimDecl, ...]
    constraints: tuple[Constraint, ...]
    inputs: tuple[TensorDecl, ...]
    params: tuple[ParamDecl, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[OutputDecl, ...]
    checks: tuple[CheckShape, ...]
    doc: str = field(default="")  # the spec's leading comment block, if any

    def node(self, node_id: int) -> Node:
        """The node with id `node_id`."""
        return self.nodes[node_id]

    def operands(self, node: Node) -> tuple[Node, ...]:
        """The nodes `node` reads."""
        return tuple(self.nodes[a] for a in node.args)

    def users(self, node_id: int) -> tuple[Node, ...]:
        """The nodes that read `node_id`, in order."""
        return tuple(n for n in self.nodes if node_id in n.args)

    def fixed_dims(self) -> dict[str, int]:
        """Dims the spec fixes (`HC = 4`)."""
        return {d.name: d.value for d in self.dims if d.value is not None}


def matmul_flops(nodes: Sequence[Node], env: Mapping[str, int]) -> int:
    """FLOPs of the matmuls among `nodes` (indexed by id) under `env`: 2 x K per output element."""
    total = 0
    for node in nodes:
        if node.op == "matmul":
            contracted = eval_shape(nodes[node.args[0]].shape, env)[-1]
            total += 2 * contracted * math.prod(eval_shape(node.shape, env))
    return total
