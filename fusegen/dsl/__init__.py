"""The spec front end: spec text -> AST (parse) -> checked, typed KernelIR (check)."""

from fusegen.dsl.check import check, check_with_warnings, load_spec
from fusegen.dsl.diagnostics import Diagnostic, Span, SpecError
from fusegen.dsl.format import format_ast, format_ir
from fusegen.dsl.names import RESERVED_NAMES
from fusegen.dsl.parser import parse

__all__ = [
    "RESERVED_NAMES",
    "Diagnostic",
    "Span",
    "SpecError",
    "check",
    "check_with_warnings",
    "format_ast",
    "format_ir",
    "load_spec",
    "parse",
]
