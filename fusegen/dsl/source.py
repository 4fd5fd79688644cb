"""Reading a spec file: bytes -> text, with unreadable or non-UTF-8 files reported as SpecError."""

from __future__ import annotations

from fusegen.dsl.diagnostics import Diagnostic, Span, SpecError
from fusegen.dsl.parser import MAX_SPEC_CHARS


def read_spec(path: str) -> str:
    """The text of the spec at `path`."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_SPEC_CHARS + 1)
    except IsADirectoryError as err:
        hint = f"pass the spec files in it, e.g. `{path.rstrip('/')}/*.spec`"
        raise _file_error(path, f"cannot read the spec: {err.strerror}", hint) from None
    except OSError as err:
        raise _file_error(path, f"cannot read the spec: {err.strerror}") from None
    if len(data) > MAX_SPEC_CHARS:
        text = data[:MAX_SPEC_CHARS].decode("utf-8", errors="replace")
        line = text.count("\n") + 1
        col = len(text) - (text.rfind("\n") + 1) + 1
        message = f"the spec is larger than {MAX_SPEC_CHARS} bytes; this is where it passes the limit"
        raise SpecError([Diagnostic(Span(path, line, col, line, col + 1), message)], text) from None
    return decode_spec(data, path)


def _file_error(path: str, message: str, hint: str | None = None) -> SpecError:
    return SpecError([Diagnostic(Span.whole_file(path), message, hint=hint)])


def decode_spec(data: bytes, path: str) -> str:
    """`data` as UTF-8 text, or SpecError pointing at the first byte that is not UTF-8."""
    try:
        return data.decode("utf-8").removeprefix("\ufeff")  # a byte-order mark is not part of the spec
    except UnicodeDecodeError as err:
        good = data[: err.start].decode("utf-8")
        line = good.count("\n") + 1
        col = len(good) - (good.rfind("\n") + 1) + 1
        text = good + "\ufffd"  # enough source to show the line up to the bad byte
        message = f"the spec is not UTF-8 text (byte 0x{data[err.start]:02x})"
        utf16 = data.startswith((b"\xff\xfe", b"\xfe\xff"))  # the byte-order mark Windows editors write
        hint = "the file is UTF-16: save it as UTF-8" if utf16 else "save the spec as UTF-8"
        span = Span(path, line, col, line, col + 1)
        raise SpecError([Diagnostic(span, message, hint=hint)], text) from None
