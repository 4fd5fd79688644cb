"""`fusegen check-spec`: validate specs, print warnings, and a typed summary or a stage dump."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from fusegen.dsl import ir
from fusegen.dsl.check import check_with_warnings
from fusegen.dsl.diagnostics import Diagnostic, Span, SpecError
from fusegen.dsl.format import format_ast, format_ir, format_number
from fusegen.dsl.parser import MAX_SPEC_CHARS, parse
from fusegen.dsl.source import decode_spec, read_spec
from fusegen.jsonout import document, emit

#: The name diagnostics give a spec read from stdin.
STDIN_NAME = "<stdin>"


STDIN = "-"


def check_spec(paths: Sequence[str], dump: str | None = None, fmt: str = "text") -> int:
    """Check every spec in `paths` (`-`: stdin), reporting each failure; 0 if all pass, else 2."""
    if fmt == "json":
        return _check_json(paths)
    failed = False
    for path in paths:
        try:
            _check_one(path, dump)
        except SpecError as err:
            print(err.render(), file=sys.stderr)
            failed = True
    return 2 if failed else 0


def _read(path: str) -> str:
    """The spec text at `path`, or stdin's for `-` (with the same size and UTF-8 checks)."""
    if path != STDIN:
        return read_spec(path)
    data = sys.stdin.buffer.read(MAX_SPEC_CHARS + 1)
    if len(data) > MAX_SPEC_CHARS:
        too_big = f"the spec is larger than {MAX_SPEC_CHARS} bytes"
        raise SpecError([Diagnostic(Span.whole_file(STDIN_NAME), too_big)])
    return decode_spec(data, STDIN_NAME)


def _check_one(path: str, dump: str | None) -> None:
    text = _read(path)
    spec = parse(text, STDIN_NAME if path == STDIN else path)
    if dump == "ast":
        print(format_ast(spec), end="")
    kernel, warnings = check_with_warnings(spec)
    for warning in warnings:
        print(warning.render(text), file=sys.stderr)
    print(format_ir(kernel) if dump == "ir" else summary(kernel), end="" if dump == "ir" else "\n")


def _check_json(paths: Sequence[str]) -> int:
    """Every spec's verdict, kernel signature and diagnostics as one JSON document."""
    results = []
    for path in paths:
        try:
            text = _read(path)
            kernel, warnings = check_with_warnings(parse(text, STDIN_NAME if path == STDIN else path))
            results.append({"path": path, "ok": True, "kernel": kernel_json(kernel),
                            "diagnostics": [diagnostic_json(w) for w in warnings]})  # fmt: skip
        except SpecError as err:
            results.append({"path": path, "ok": False, "kernel": None,
                            "diagnostics": [diagnostic_json(d) for d in err.diagnostics]})  # fmt: skip
    ok = all(r["ok"] for r in results)
    emit(document("check-spec", ok, specs=results))
    return 0 if ok else 2


def diagnostic_json(d: Diagnostic) -> dict[str, Any]:
    """A diagnostic's fields; line and column are 1-based, 0 for the file as a whole."""
    return {"level": d.level, "message": d.message, "path": d.span.path, "line": d.span.line,
            "column": d.span.col, "hint": d.hint}  # fmt: skip


def kernel_json(kernel: ir.KernelIR) -> dict[str, Any]:
    """The checked kernel's signature: dims, inputs, params, outputs, check shapes."""
    return {
        "name": kernel.name,
        "dims": [{"name": d.name, "value": d.value} for d in kernel.dims],
        "require": [str(c) for c in kernel.constraints],
        "inputs": [{**_tensor(t), "finite": t.finite} for t in kernel.inputs],
        "params": [{"name": p.name, "default": p.default} for p in kernel.params],
        "outputs": [{**_tensor(o), "optional": o.optional} for o in kernel.outputs],
        "nodes": len(kernel.nodes),
        "checks": [c.env() for c in kernel.checks],
    }


def _tensor(t: ir.TensorDecl | ir.OutputDecl) -> dict[str, Any]:
    return {"name": t.name, "dtype": t.dtype, "shape": [str(d) for d in t.shape]}


def summary(kernel: ir.KernelIR) -> str:
    """A few lines: the kernel's signature with shapes and dtypes, its size, and its checks."""
    dims = ", ".join(d.name + ("" if d.value is None else f"={d.value}") for d in kernel.dims)
    rows = [
        ("dims", dims),
        ("require", "; ".join(str(c) for c in kernel.constraints) or "-"),
        ("inputs", ", ".join(f"{t.name}: {t.dtype}{ir.shape_str(t.shape)}{' finite' * t.finite}"
                             for t in kernel.inputs)),
        ("params", ", ".join(f"{p.name}={format_number(p.default)}" for p in kernel.params) or "-"),
        ("outputs", ", ".join(_output(o) for o in kernel.outputs)),
        ("nodes", str(len(kernel.nodes))),
        ("checks", "; ".join(_check(kernel, c) for c in kernel.checks)),
    ]
    lines = [f"{kernel.path}: kernel {kernel.name} ok"]
    lines += [f"  {label:<9}{text}" for label, text in rows]
    return "\n".join(lines)


def _output(out: ir.OutputDecl) -> str:
    optional = "optional " if out.optional else ""
    return f"{optional}{out.name}: {out.dtype}{ir.shape_str(out.shape)}"


def _check(kernel: ir.KernelIR, shape: ir.CheckShape) -> str:
    env = shape.env()
    return " ".join(f"{d.name}={env[d.name]}" for d in kernel.dims if d.value is None)
