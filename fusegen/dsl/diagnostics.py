"""Source spans and compiler-style diagnostics: `path:line:col: error: message`, the line, a caret."""

from __future__ import annotations

from dataclasses import dataclass

#: how many diagnostics a report shows by default before "and K more".
MAX_ERRORS = 50
#: how many characters of a source line a diagnostic shows (a window around the caret on longer lines).
MAX_SHOWN = 200


@dataclass(frozen=True)
class Span:
    """A region of a spec file; lines and columns are 1-based, end exclusive; line 0 means the whole file."""

    path: str
    line: int
    col: int
    end_line: int
    end_col: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col}" if self.line else self.path

    @staticmethod
    def whole_file(path: str) -> Span:
        """A span for problems with the file itself (unreadable, empty)."""
        return Span(path, 0, 0, 0, 0)


@dataclass(frozen=True)
class Diagnostic:
    """One error or warning at a span, with an optional hint on how to fix it."""

    span: Span
    message: str
    level: str = "error"  # "error" | "warning"
    hint: str | None = None

    def render(self, source: str | list[str]) -> str:
        """The full text: location, message, the source line with a caret, the hint (`source` may come
        split into lines already, so that rendering many diagnostics stays linear)."""
        # split on "\n" only: that is how the lexer counts lines (str.splitlines also splits on U+2028)
        lines = source.split("\n") if isinstance(source, str) else source
        out = [f"{self.span}: {self.level}: {self.message}"]
        if 1 <= self.span.line <= len(lines):
            text = _printable(lines[self.span.line - 1].rstrip("\r"))
            width = self.span.end_col - self.span.col if self.span.end_line == self.span.line else 1
            start = 0 if len(text) <= MAX_SHOWN else max(0, self.span.col - 1 - MAX_SHOWN // 2)
            shown = text[start : start + MAX_SHOWN]  # a window of a very long line, around the caret
            caret = self.span.col - 1 - start
            out.append(f"    {shown}")
            out.append("    " + " " * caret + "^" + "~" * max(0, min(width, len(shown) - caret) - 1))
        if self.hint:
            out.append(f"  hint: {self.hint}")
        return "\n".join(out)


def _printable(line: str) -> str:
    """The line with tabs and unprintable characters shown as one column each, so the caret lines up."""
    return "".join(" " if ch == "\t" else ch if ch.isprintable() else "?" for ch in line)


class SpecError(Exception):
    """A spec is wrong: one or more error diagnostics (never a fusegen bug)."""

    #: at most this many diagnostics are rendered, then "and K more" (`--max-errors` sets it).
    max_errors = MAX_ERRORS

    def __init__(self, diagnostics: tuple[Diagnostic, ...] | list[Diagnostic], source: str = "") -> None:
        self.diagnostics = tuple(diagnostics)
        self.source = source
        super().__init__(f"{len(self.diagnostics)} diagnostic(s)")  # render() is the text users see

    def __str__(self) -> str:
        return self.render()

    def render(self) -> str:
        """The first `max_errors` diagnostics, rendered against the spec source, then a count."""
        lines = self.source.split("\n")
        shown = self.diagnostics[: max(1, self.max_errors)]
        parts = [d.render(lines) for d in shown]
        if len(self.diagnostics) > len(shown):
            parts.append(f"and {len(self.diagnostics) - len(shown)} more (raise --max-errors to see them)")
        errors = sum(d.level == "error" for d in self.diagnostics)
        if errors > 1:
            parts.append(f"{errors} errors")
        return "\n".join(parts)
