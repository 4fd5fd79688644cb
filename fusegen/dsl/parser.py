"""Spec text -> AST: the Lark LALR parser plus a Transformer that builds ast.py's frozen dataclasses."""

from __future__ import annotations

import functools
import math
import re
from typing import Any

from lark import Lark, Token, Transformer_NonRecursive, v_args
from lark.exceptions import UnexpectedInput
from lark.tree import Meta

from fusegen.dsl import ast
from fusegen.dsl.diagnostics import Diagnostic, Span, SpecError
from fusegen.dsl.syntax_errors import syntax_error

#: specs are ~20 lines; anything this large is not a spec (and would slow every later stage).
MAX_SPEC_CHARS = 100_000
#: deeper bracket nesting than this is garbage, and would overflow Python's recursion limit later.
MAX_NESTING = 50
#: the same for expression trees: `x + x + ... + x` with more terms nests as deep.
MAX_DEPTH = 100
#: integer literals longer than this are no dim, axis or check value (and int() refuses 4,301 digits).
MAX_INT_DIGITS = 18


@functools.cache
def _lark() -> Lark:
    """The parser, built once per process."""
    return Lark.open(
        "grammar.lark",
        rel_to=__file__,
        parser="lalr",
        propagate_positions=True,
        strict=True,
        maybe_placeholders=True,
    )


@functools.cache
def _literals() -> dict[str, str]:
    """Each string terminal's text (`LPAR` -> `(`), for messages."""
    return {t.name: t.pattern.value for t in _lark().terminals if t.pattern.type == "str"}


def parse(text: str, path: str) -> ast.Spec:
    """Parse spec `text` (read from `path`, used in messages) into its AST, or raise SpecError."""
    text = text.removeprefix("\ufeff")  # a byte-order mark some editors write: not part of the spec
    _reject_unparseable(text, path)
    try:
        tree = _lark().parse(text if text.endswith("\n") else text + "\n")
    except UnexpectedInput as err:
        raise SpecError([syntax_error(err, text, path, _literals())], text) from None
    to_ast = _ToAst(path)  # non-recursive: a chain of any length becomes an AST, then a depth diagnostic
    items = to_ast.transform(tree)
    if to_ast.errors:
        raise SpecError(to_ast.errors, text)
    _reject_deep(items, text)
    end = text.count("\n") + 1
    return ast.Spec(path, text, tuple(items), leading_comment(text), Span(path, 1, 1, end, 1))


def _reject_unparseable(text: str, path: str) -> None:
    """Raise for inputs no grammar rule should see: empty, huge, NUL bytes, runaway nesting."""
    if not text.strip():
        raise _file_error(path, text, "the spec is empty", "a spec starts with `kernel NAME`")
    if len(text) > MAX_SPEC_CHARS:
        message = f"the spec is larger than {MAX_SPEC_CHARS} characters; this is where it passes the limit"
        raise SpecError([Diagnostic(_span_at(text, MAX_SPEC_CHARS, path), message)], text)
    nul = text.find("\0")
    if nul >= 0:
        raise SpecError([Diagnostic(_span_at(text, nul, path), "NUL byte in the spec")], text)
    lone_cr = re.search(r"\r(?!\n)", text)
    if lone_cr:
        message = "carriage return without a line feed: classic Mac (CR) line endings"
        hint = "save the spec with LF (or CRLF) line endings"
        raise SpecError([Diagnostic(_span_at(text, lone_cr.start(), path), message, hint=hint)], text)
    depth = 0
    for pos, ch in enumerate(_without_comments(text)):
        depth += (ch in "([") - (ch in ")]")
        if depth > MAX_NESTING:
            message = f"brackets nest more than {MAX_NESTING} deep"
            raise SpecError([Diagnostic(_span_at(text, pos, path), message)], text)


def _reject_deep(items: list[ast.Item], text: str) -> None:
    """Raise for a line whose expression tree would overflow the checker's recursion."""
    for item in items:
        if _depth(item) > MAX_DEPTH:
            message = f"this line nests more than {MAX_DEPTH} operations deep"
            hint = "split it into several statements"
            raise SpecError([Diagnostic(item.span, message, hint=hint)], text)


def _without_comments(text: str) -> str:
    """`text` with comment bodies blanked out, offsets unchanged."""
    return re.sub(r"#[^\n]*", lambda match: " " * len(match[0]), text)


def _depth(node: Any) -> int:
    """How deeply AST `node` nests (iteratively: the point is to avoid deep recursion)."""
    deepest, stack = 0, [(node, 1)]
    while stack:
        current, depth = stack.pop()
        deepest = max(deepest, depth)
        stack += [(child, depth + 1) for child in ast.children(current)]
    return deepest


def _file_error(path: str, text: str, message: str, hint: str | None = None) -> SpecError:
    return SpecError([Diagnostic(Span.whole_file(path), message, hint=hint)], text)


def _span_at(text: str, offset: int, path: str) -> Span:
    """The one-character span at string offset `offset`."""
    line = text.count("\n", 0, offset) + 1
    col = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return Span(path, line, col, line, col + 1)


_COMMENT_LINE = re.compile(r"[ \t]*#(?P<body>[^\n]*)")
#: the doc may reach generated docstrings and comments: printable ASCII without `\` or `"` only.
_UNSAFE_DOC_CHAR = re.compile(r'[^\x20-\x7e]|[\\"]')


def leading_comment(text: str) -> str:
    """The comment block at the top of the file, `#` markers removed, made safe to embed in source."""
    lines = []
    for line in text.split("\n"):
        match = _COMMENT_LINE.fullmatch(line.rstrip("\r"))
        if not match:
            break
        body = match["body"]
        lines.append(_UNSAFE_DOC_CHAR.sub("?", body[1:] if body.startswith(" ") else body).rstrip())
    return "\n".join(lines).strip("\n")


def _token_span(path: str, token: Token) -> Span:
    return Span(path, token.line or 0, token.column or 0, token.end_line or 0, token.end_column or 0)


def _number(token: Token, span: Span, negative: bool = False) -> tuple[ast.Number, Diagnostic | None]:
    """The literal, and a diagnostic when it is too long an integer or over/underflows a float."""
    text = ("-" if negative else "") + str(token)
    is_int = not any(ch in token for ch in ".eE")
    shown = text if len(text) <= 24 else f"{text[:10]}...{text[-6:]}"
    if is_int and len(token.lstrip("0")) > MAX_INT_DIGITS:
        problem = f"integer literal `{shown}` has more than {MAX_INT_DIGITS} digits"
        return ast.Number(0.0, "0", True, span), Diagnostic(span, problem)
    value = float(text)
    if math.isinf(value):
        problem = f"`{shown}` overflows: the largest number is about 1.8e308"
        return ast.Number(0.0, "0", True, span), Diagnostic(span, problem)
    if value == 0 and re.search(r"[1-9]", text.partition("e")[0].partition("E")[0]):
        problem = f"`{shown}` underflows to 0: the smallest number is about 5e-324"
        return ast.Number(0.0, "0", True, span), Diagnostic(span, problem, hint="write 0 if you mean 0")
    return ast.Number(value, text, is_int, span), None


@v_args(meta=True)
class _ToAst(Transformer_NonRecursive[Token, Any]):
    """Parse tree -> AST; one method per grammar rule or alias; literals that no number can hold are
    collected in `errors` (the checker does the semantic checks)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        self.errors: list[Diagnostic] = []

    def _literal(self, number: tuple[ast.Number, Diagnostic | None]) -> ast.Number:
        literal, problem = number
        if problem:
            self.errors.append(problem)
        return literal

    def _span(self, meta: Meta) -> Span:
        return Span(self.path, meta.line, meta.column, meta.end_line, meta.end_column)

    def _ident(self, token: Token) -> ast.Ident:
        return ast.Ident(str(token), _token_span(self.path, token))

    def start(self, meta: Meta, children: list[Any]) -> list[Any]:
        return children

    def kernel_decl(self, meta: Meta, children: list[Any]) -> ast.KernelDecl:
        return ast.KernelDecl(self._ident(children[0]), self._span(meta))

    def dim_decl(self, meta: Meta, children: list[Any]) -> ast.DimDecl:
        return ast.DimDecl(tuple(children), self._span(meta))

    def dim_item(self, meta: Meta, children: list[Any]) -> ast.DimItem:
        return ast.DimItem(self._ident(children[0]), children[1], self._span(meta))

    def require_decl(self, meta: Meta, children: list[Any]) -> ast.RequireDecl:
        return ast.RequireDecl(children[0], self._span(meta))

    def input_decl(self, meta: Meta, children: list[Any]) -> ast.InputDecl:
        name, type_, finite = children
        return ast.InputDecl(self._ident(name), type_, self._span(meta), finite is not None)

    def param_decl(self, meta: Meta, children: list[Any]) -> ast.ParamDecl:
        return ast.ParamDecl(self._ident(children[0]), children[1], self._span(meta))

    def output_decl(self, meta: Meta, children: list[Any]) -> ast.OutputDecl:
        optional, name, type_ = children
        return ast.OutputDecl(self._ident(name), type_, optional is not None, self._span(meta))

    def assign(self, meta: Meta, children: list[Any]) -> ast.Assign:
        return ast.Assign(self._ident(children[0]), children[1], self._span(meta))

    def check_decl(self, meta: Meta, children: list[Any]) -> ast.CheckDecl:
        return ast.CheckDecl(tuple(children), self._span(meta))

    def check_item(self, meta: Meta, children: list[Any]) -> ast.CheckItem:
        return ast.CheckItem(self._ident(children[0]), children[1], self._span(meta))

    def tensor_type(self, meta: Meta, children: list[Any]) -> ast.TensorType:
        dims = tuple(c for c in children[1:] if c is not None)
        return ast.TensorType(self._ident(children[0]), dims, self._span(meta))

    def signed_number(self, meta: Meta, children: list[Any]) -> ast.Number:
        minus, token = children
        return self._literal(_number(token, self._span(meta), negative=minus is not None))

    def compare(self, meta: Meta, children: list[Any]) -> ast.Compare:
        return ast.Compare(tuple(children[0::2]), tuple(str(op) for op in children[1::2]), self._span(meta))

    def binop(self, meta: Meta, children: list[Any]) -> ast.BinOp:
        lhs, op, rhs = children
        return ast.BinOp(str(op), lhs, rhs, self._span(meta), _token_span(self.path, op))

    def neg(self, meta: Meta, children: list[Any]) -> ast.Neg:
        return ast.Neg(children[1], self._span(meta))

    def pow(self, meta: Meta, children: list[Any]) -> ast.Pow:
        return ast.Pow(children[0], children[1], self._span(meta))

    def index(self, meta: Meta, children: list[Any]) -> ast.Index:
        return ast.Index(children[0], tuple(children[1:]), self._span(meta))

    def slice(self, meta: Meta, children: list[Any]) -> ast.Slice:
        start, _colon, stop = children
        return ast.Slice(start, stop, self._span(meta))

    def call(self, meta: Meta, children: list[Any]) -> ast.Call:
        arguments = [c for c in children[1:] if c is not None]
        args = tuple(a for a in arguments if not isinstance(a, ast.Keyword))
        keywords = tuple(a for a in arguments if isinstance(a, ast.Keyword))
        return ast.Call(self._ident(children[0]), args, keywords, self._span(meta))

    def keyword(self, meta: Meta, children: list[Any]) -> ast.Keyword:
        return ast.Keyword(self._ident(children[0]), children[1], self._span(meta))

    def name(self, meta: Meta, children: list[Any]) -> ast.Name:
        return ast.Name(str(children[0]), self._span(meta))

    def number(self, meta: Meta, children: list[Any]) -> ast.Number:
        return self._literal(_number(children[0], self._span(meta)))

    def boolean(self, meta: Meta, children: list[Any]) -> ast.Bool:
        return ast.Bool(children[0] == "true", self._span(meta))

    def none(self, meta: Meta, children: list[Any]) -> ast.NoneLit:
        return ast.NoneLit(self._span(meta))
