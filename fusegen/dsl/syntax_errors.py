"""Lark's parse errors rewritten as human diagnostics: what was expected, in words, never terminal names."""

from __future__ import annotations

import re
from collections.abc import Mapping

from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from fusegen.dsl.diagnostics import Diagnostic, Span
from fusegen.dsl.names import did_you_mean

#: how each terminal is named in a message (string terminals such as `kernel` speak for themselves).
_TERMINAL_WORDS = {
    "NAME": "a name",
    "NUMBER": "a number",
    "_NL": "end of line",
    "$END": "end of file",
    "TRUE": "`true`",
    "FALSE": "`false`",
    "NONE": "`None`",
    "MUL_OP": "`*`, `/`, `@` or `%`",
    "COMPARE_OP": "a comparison",
}
#: terminals that can start an expression; when all are expected we just say "an expression".
_EXPRESSION_START = frozenset({"NAME", "NUMBER", "LPAR"})
_EXPRESSION_WORDS = frozenset({"NAME", "NUMBER", "LPAR", "MINUS", "TRUE", "FALSE", "NONE"})
#: terminals that continue an expression; when several are expected we just say "an operator".
_OPERATORS = frozenset({"PLUS", "MINUS", "MUL_OP", "__ANON_0", "COMPARE_OP", "LSQB"})
_LINE_END = frozenset({"_NL", "$END"})
_DECLARATION_HINT = (
    "each line is `kernel NAME`, `dim`, `require`, `input`, `param`, `[optional] output`, `check`, "
    "or `name = expression`"
)
_CHARACTER_HINTS = {
    "?": "an optional output is written `optional output NAME: dtype[dims]`",
    ";": "write one item per line",
    '"': "the spec language has no strings",
    "'": "the spec language has no strings",
    "\\": "a statement is one line: split a long one into named steps",
    "^": "a power is written `x ** 2`",
    ".": "there are no methods or attributes (`x.T`), and no `...` in an index: give one item per dim, `:` "
    "for a whole one",
}
_LINE_KEYWORDS = ("kernel", "dim", "require", "input", "param", "output", "optional", "check")
#: hints for the lines whose items are not expressions, by their first word.
_PARAM_HINT = "a param is an f32 scalar with a number as its default: `param eps = 1e-6`"
_REQUIRE_LINE_HINT = "one comparison per `require` line, with `==` for equality: `require K % 128 == 0`"
#: the spec's tokens, roughly, for finding the token before an error.
_ROUGH_TOKEN = re.compile(r"\*\*|[<>=!]=|[A-Za-z_]\w*|\d+\.?\d*(?:[eE][+-]?\d+)?|\S")


def syntax_error(err: UnexpectedInput, text: str, path: str, literals: Mapping[str, str]) -> Diagnostic:
    """One diagnostic for a Lark parse error in `text`; `literals` maps string terminals to their text."""
    if isinstance(err, UnexpectedToken):
        return _unexpected_token(err, text, path, literals)
    if isinstance(err, UnexpectedCharacters):
        return _unexpected_character(err, text, path)
    line, col = max(err.line, 1), max(err.column, 1)  # UnexpectedEOF: we always end input with "\n"
    return Diagnostic(Span(path, line, col, line, col + 1), "unexpected end of file")


def _unexpected_character(err: UnexpectedCharacters, text: str, path: str) -> Diagnostic:
    char = err.char
    shown = f"`{char}`" if char.isprintable() and char != "`" else f"U+{ord(char):04X}"
    hint = _CHARACTER_HINTS.get(char)
    if hint is None and not char.isascii():
        hint = "names, numbers and operators are ASCII; other characters may appear only in comments"
    span = Span(path, err.line, err.column, err.line, err.column + 1)
    return Diagnostic(span, f"unexpected character {shown}", hint=hint)


def _unexpected_token(err: UnexpectedToken, text: str, path: str, literals: Mapping[str, str]) -> Diagnostic:
    token = err.token
    line, col = _token_position(err, text)
    expected = _acceptable(err)
    prefix = text.split("\n")[line - 1][: col - 1] if line >= 1 else ""
    span = Span(
        path, line, col, line, col + max(1, len(str(token))) if token.type not in _LINE_END else col + 1
    )
    if token.type in _LINE_END:
        return _early_line_end(expected, prefix, span, literals)
    described = _describe_token(token.type, str(token))
    message = f"unexpected {described}; expected {_expected(expected, literals)}"
    first_on_line = len(_ROUGH_TOKEN.findall(prefix)) == 1
    declaration = first_on_line and expected <= {"EQUAL"}
    hint = _declaration_hint(prefix) if declaration else _line_hint(prefix, str(token))
    return Diagnostic(span, message, hint=hint)


def _declaration_hint(prefix: str) -> str:
    """The line kinds, led by the keyword a misspelt first word means (`outputs` for `output`)."""
    close = did_you_mean(prefix.split()[0], _LINE_KEYWORDS) if prefix.split() else None
    return f"{close} {_DECLARATION_HINT}" if close else _DECLARATION_HINT


def _line_hint(prefix: str, token: str) -> str | None:
    """How to fix a token a line of its kind cannot hold: `finite` off an input line, a `check` item that
    is not `NAME=INT` (the message alone names only the token)."""
    words = _ROUGH_TOKEN.findall(prefix)
    first = words[0] if words else ""
    if token == "finite" and first in ("output", "optional", "param"):
        return "only an `input` line ends in `finite`: it promises the values the caller passes in"
    if token == "finite":
        return "write `finite` once, at the end of the input line"
    if first == "input" and prefix.rstrip().endswith("]"):  # `finit` where `finite` may stand
        return did_you_mean(token, ["finite"])
    if first == "check":
        return "a check line lists `NAME=INT` items separated by spaces, e.g. `check T=4 H=128`"
    if first == "param":
        return _PARAM_HINT
    if first == "require":
        return _REQUIRE_LINE_HINT
    if token == ":" and _unclosed(prefix, "[") is not None:
        return "a slice is `start:stop`: there is no step"
    return None


def _acceptable(err: UnexpectedToken) -> set[str]:
    """Terminals that could really come next; LALR's `expected` includes lookaheads of merged states."""
    if err.interactive_parser is None:
        return set(err.expected)
    return set(err.interactive_parser.accepts()) or set(err.expected)


def _early_line_end(expected: set[str], prefix: str, span: Span, literals: Mapping[str, str]) -> Diagnostic:
    """The line ended before the item did: a dangling operator or an unclosed bracket."""
    words = _ROUGH_TOKEN.findall(prefix)
    if expected >= _EXPRESSION_START and words:
        open_bracket = _unclosed(prefix, "(") is not None or _unclosed(prefix, "[") is not None
        split = "a statement ends at its line, inside brackets too: split it into named steps"
        hint = split if open_bracket else None
        return Diagnostic(span, f"expected an expression after `{words[-1]}`", hint=hint)
    for opener, closer in (("(", "RPAR"), ("[", "RSQB")):
        where = _unclosed(prefix, opener)
        if closer in expected and where is not None:
            at = Span(span.path, span.line, where + 1, span.line, where + 2)
            return Diagnostic(at, f"unterminated `{opener}`", hint="close it on the same line")
    hint = _PARAM_HINT if words[:1] == ["param"] else None
    return Diagnostic(span, f"unexpected end of line; expected {_expected(expected, literals)}", hint=hint)


def _unclosed(prefix: str, opener: str) -> int | None:
    """Offset of the innermost bracket `opener` left open in `prefix`, if any."""
    stack: list[tuple[str, int]] = []
    for pos, ch in enumerate(prefix.split("#")[0]):
        if ch in "([":
            stack.append((ch, pos))
        elif ch in ")]" and stack:
            stack.pop()
    return stack[-1][1] if stack and stack[-1][0] == opener else None


def _token_position(err: UnexpectedToken, text: str) -> tuple[int, int]:
    """Line and column of the offending token; Lark gives `$END` no position of its own."""
    if err.token.type == "$END" or err.line < 1:
        lines = text.split("\n")
        return len(lines), len(lines[-1]) + 1
    return err.line, err.column


def _describe_token(kind: str, value: str) -> str:
    """`name `x``, `number `3``, or the token's own text."""
    if kind in ("NAME", "NUMBER"):
        return f"{kind.lower()} `{value}`"
    return _TERMINAL_WORDS[kind] if kind in _LINE_END else f"`{value}`"


def _expected(expected: set[str], literals: Mapping[str, str]) -> str:
    """`an expression`, `a name or `=``, ... from a set of terminal names."""
    words: set[str] = set()
    if expected >= _EXPRESSION_START:
        expected = expected - _EXPRESSION_WORDS
        words.add("an expression")
    if len(expected & _OPERATORS) > 1:
        expected = expected - _OPERATORS
        words.add("an operator")
    words |= {_TERMINAL_WORDS.get(kind) or f"`{literals.get(kind, kind)}`" for kind in expected}
    ordered = sorted(words)
    return ordered[0] if len(ordered) == 1 else ", ".join(ordered[:-1]) + " or " + ordered[-1]
