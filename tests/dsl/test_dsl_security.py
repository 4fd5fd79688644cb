"""A spec is untrusted: whatever is injected into any field, the IR holds only safe identifiers and finite
numbers (or the spec is rejected with a SpecError)."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import pytest

from fusegen.dsl import RESERVED_NAMES, SpecError, check, parse
from fusegen.dsl.diagnostics import Span
from fusegen.dsl.ir import KernelIR
from fusegen.dsl.names import is_safe_identifier

TEMPLATE = """\
# {comment}
kernel {kernel}
dim {dim}, K
input {input}: f32[{dim}, K]
param {param} = {default}
output {output}: f32[{dim}, K]
{output} = {input} * {param}
check {dim}={check} K=8
"""
SAFE = {
    "comment": "doc",
    "kernel": "k",
    "dim": "R",
    "input": "x",
    "param": "p",
    "default": "2.0",
    "output": "y",
    "check": "4",
}
PAYLOADS = [
    "__import__('os').system('id')",
    "os.system",
    "x; import os",
    "x\nimport os",
    "x\r\nimport os",
    "x\u2028import os",
    "x\u0085y",
    "x\x0bimport os",
    "x\\",
    "'''",
    '"""',
    '"',
    "eval",
    "exec",
    "__class__",
    "_private",
    "fusegen_state",
    "nki",
    "nl",
    "torch",
    "self",
    "kernel",
    "None",
    "True",
    "lambda",
    "print",
    "x" * 100,
    "ｘ",
    "1e999",
    "-1e999",
    "nan",
    "inf",
    "0x10",
    "1_000",
    "{}",
    "$(id)",
    "x#y",
    "\t",
    "",
]
OPERATOR_STRINGS = {"==", "!=", "<", "<=", ">", ">="}
_SAFE_DOC = re.compile(r"[\x20-\x7e\n]*")


def _strings_and_numbers(value: Any, found: list[Any]) -> None:
    """Every str and number reachable from `value`, skipping spans (they hold the user's file path)."""
    if isinstance(value, Span):
        return
    if dataclasses.is_dataclass(value):
        for field in dataclasses.fields(value):
            if field.name not in ("path", "doc", "source_sha256"):
                _strings_and_numbers(getattr(value, field.name), found)
    elif isinstance(value, tuple):
        for element in value:
            _strings_and_numbers(element, found)
    elif isinstance(value, (str, int, float)):
        found.append(value)


def assert_safe(kernel: KernelIR) -> None:
    """The IR holds only identifiers fit for generated code, op vocabulary, and finite numbers."""
    names = [kernel.name, *(d.name for d in kernel.dims), *(t.name for t in kernel.inputs)]
    names += [p.name for p in kernel.params] + [o.name for o in kernel.outputs]
    names += [n.name for n in kernel.nodes if n.name is not None]
    names += [name for c in kernel.checks for name, _ in c.dims]
    assert all(is_safe_identifier(name) for name in names), names
    found: list[Any] = []
    _strings_and_numbers(kernel, found)
    for value in found:
        if isinstance(value, str):
            assert re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", value) or value in OPERATOR_STRINGS, value
        else:
            assert math.isfinite(value), value
    assert _SAFE_DOC.fullmatch(kernel.doc) and "\\" not in kernel.doc and '"' not in kernel.doc


@pytest.mark.parametrize("field", sorted(SAFE))
@pytest.mark.parametrize("payload", PAYLOADS)
def test_injection(field: str, payload: str) -> None:
    text = TEMPLATE.format(**{**SAFE, field: payload})
    try:
        kernel = check(parse(text, "inject.spec"))
    except SpecError:
        return
    assert_safe(kernel)


def test_the_template_itself_is_valid() -> None:
    assert_safe(check(parse(TEMPLATE.format(**SAFE), "inject.spec")))


def test_reserved_names_are_extensible() -> None:
    text = TEMPLATE.format(**{**SAFE, "input": "w_future"})
    check(parse(text, "t.spec"))
    RESERVED_NAMES.add("w_future")
    try:
        with pytest.raises(SpecError, match="`w_future` is reserved"):
            check(parse(text, "t.spec"))
    finally:
        RESERVED_NAMES.discard("w_future")


def test_reserved_names_cover_generated_code() -> None:
    assert {
        "nki",
        "nisa",
        "nl",
        "torch",
        "np",
        "math",
        "os",
        "sys",
        "F",
        "kernel",
        "reference",
    } <= RESERVED_NAMES
    assert {"self", "cls", "print", "lambda", "None"} <= RESERVED_NAMES
    assert not is_safe_identifier("_x") and not is_safe_identifier("fusegen_tmp")
