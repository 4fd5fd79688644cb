"""The spec's syntax tree: frozen dataclasses mirroring grammar.lark's rules, each carrying its Span.

The tree says only what was written; meaning (names, shapes, dtypes) is the checker's job.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fusegen.dsl.diagnostics import Span

# ---- expressions --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ident:
    """A name as written, with its own span (declarations point errors at it)."""

    name: str
    span: Span


@dataclass(frozen=True)
class Name:
    """A reference to a dim, input, param or earlier statement."""

    name: str
    span: Span


@dataclass(frozen=True)
class Number:
    """A numeric literal; `text` is the source spelling (`1e-6`), `is_int` when it has no `.` or exponent."""

    value: float
    text: str
    is_int: bool
    span: Span


@dataclass(frozen=True)
class Bool:
    """`true` or `false` (keyword arguments such as `keepdim=true`)."""

    value: bool
    span: Span


@dataclass(frozen=True)
class NoneLit:
    """`None` (an absent clamp bound)."""

    span: Span


@dataclass(frozen=True)
class Neg:
    """Unary minus."""

    operand: Expr
    span: Span


@dataclass(frozen=True)
class BinOp:
    """`lhs op rhs` for op in + - * / @ %."""

    op: str
    lhs: Expr
    rhs: Expr
    span: Span
    op_span: Span


@dataclass(frozen=True)
class Compare:
    """`a < b` or a chain `1 <= R <= 65536` (chains only make sense in `require` lines)."""

    operands: tuple[Expr, ...]
    ops: tuple[str, ...]
    span: Span


@dataclass(frozen=True)
class Pow:
    """`base ** exponent`."""

    base: Expr
    exponent: Expr
    span: Span


@dataclass(frozen=True)
class Keyword:
    """`name=value` inside a call."""

    name: Ident
    value: Expr
    span: Span


@dataclass(frozen=True)
class Call:
    """`func(args..., key=value...)`: a built-in function or a cast."""

    func: Ident
    args: tuple[Expr, ...]
    keywords: tuple[Keyword, ...]
    span: Span


@dataclass(frozen=True)
class Slice:
    """`start:stop` inside an index; a missing bound is None."""

    start: Expr | None
    stop: Expr | None
    span: Span


@dataclass(frozen=True)
class Index:
    """`base[item, ...]`, each item a position or a Slice."""

    base: Expr
    items: tuple[Expr | Slice, ...]
    span: Span


Expr = Name | Number | Bool | NoneLit | Neg | BinOp | Compare | Pow | Call | Index

# ---- items (one per line) -----------------------------------------------------------------------


@dataclass(frozen=True)
class TensorType:
    """`bf16[R, K]`: a dtype name and dim expressions."""

    dtype: Ident
    dims: tuple[Expr, ...]
    span: Span


@dataclass(frozen=True)
class KernelDecl:
    """`kernel NAME`."""

    name: Ident
    span: Span


@dataclass(frozen=True)
class DimItem:
    """One dim of a `dim` line, optionally fixed (`HC = 4`)."""

    name: Ident
    value: Number | None
    span: Span


@dataclass(frozen=True)
class DimDecl:
    """`dim R, K, HC = 4`."""

    items: tuple[DimItem, ...]
    span: Span


@dataclass(frozen=True)
class RequireDecl:
    """`require K % 128 == 0`."""

    condition: Expr
    span: Span


@dataclass(frozen=True)
class InputDecl:
    """`input x: bf16[R, K]`, or `... finite`: the caller promises no inf or nan in it."""

    name: Ident
    type: TensorType
    span: Span
    finite: bool = False


@dataclass(frozen=True)
class ParamDecl:
    """`param eps = 1e-6`."""

    name: Ident
    default: Number
    span: Span


@dataclass(frozen=True)
class OutputDecl:
    """`[optional] output y: bf16[R, K]`, naming a computed value."""

    name: Ident
    type: TensorType
    optional: bool
    span: Span


@dataclass(frozen=True)
class Assign:
    """`name = expr`."""

    target: Ident
    value: Expr
    span: Span


@dataclass(frozen=True)
class CheckItem:
    """`R=256` in a check line."""

    name: Ident
    value: Number
    span: Span


@dataclass(frozen=True)
class CheckDecl:
    """`check R=256 K=1280 I=3416`."""

    items: tuple[CheckItem, ...]
    span: Span


Item = KernelDecl | DimDecl | RequireDecl | InputDecl | ParamDecl | OutputDecl | Assign | CheckDecl


@dataclass(frozen=True)
class Spec:
    """A parsed spec file: its items in source order, the source text, and its leading comment block."""

    path: str
    source: str
    items: tuple[Item, ...]
    doc: str
    span: Span


@functools.cache
def child_fields(cls: type) -> tuple[str, ...]:
    """The fields of AST class `cls` that may hold AST nodes (spans and plain values never do)."""
    plain = (str, bool, float, int, "str", "bool", "float", "int", "Span")
    return tuple(f.name for f in dataclasses.fields(cls) if f.type not in plain)


def children(node: Any) -> Iterator[Any]:
    """The AST nodes directly inside `node`."""
    for name in child_fields(node.__class__):
        value = getattr(node, name)
        for child in value if isinstance(value, tuple) else (value,):
            if dataclasses.is_dataclass(child):
                yield child


def names(node: Any) -> Iterator[str]:
    """Every name written anywhere inside `node` (iteratively: specs may nest deeply)."""
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, Name):
            yield current.name
        stack += children(current)
