"""Source spans and compiler-style diagnostics: `path:line:col: error: message`, the line, a caret."""

from __future__ import annotations

from dataclasses import dataclass


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

    def render(self, source: str) -> str:
        """The full text: location, message, the source line with a caret, the hint."""
        # split on "\n" only: that is how the lexer counts lines (str.splitlines also splits on U+2028)
        lines = source.split("\n")
        out = [f"{self.span}: {self.level}: {self.message}"]
        if 1 <= self.span.line <= len(lines):
            text = _printable(lines[self.span.line - 1].rstrip("\r"))
            width = self.span.end_col - self.span.col if self.span.end_line == self.span.line else 1
            out.append(f"    {text}")
            out.append("    " + " " * (self.span.col - 1) + "^" + "~" * max(0, width - 1))
        if self.hint:
            out.append(f"  hint: {self.hint}")
        return "\n".join(out)


def _printable(line: str) -> str:
    """The line with tabs and unprintable characters shown as one column each, so the caret lines up."""
    return "".join(" " if ch == "\t" else ch if ch.isprintable() else "?" for ch in line)


class SpecError(Exception):
    """A spec is wrong: one or more error diagnostics (never a fusegen bug)."""

    def __init__(self, diagnostics: tuple[Diagnostic, ...] | list[Diagnostic], source: str = "") -> None:
        self.diagnostics = tuple(diagnostics)
        self.source = source
        super().__init__(self.render())

    def render(self) -> str:
        """Every diagnostic, rendered against the spec source, then a count."""
        parts = [d.render(self.source) for d in self.diagnostics]
        errors = sum(d.level == "error" for d in self.diagnostics)
        if errors > 1:
            parts.append(f"{errors} errors")
        return "\n".join(parts)
