"""`fusegen check-spec`: validate specs, print warnings, and a typed summary or a stage dump."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from fusegen.dsl import ir
from fusegen.dsl.check import check_with_warnings
from fusegen.dsl.diagnostics import SpecError
from fusegen.dsl.format import format_ast, format_ir, format_number
from fusegen.dsl.parser import parse
from fusegen.dsl.source import read_spec


def check_spec(paths: Sequence[str], dump: str | None = None) -> int:
    """Check every spec in `paths`, reporting each failure; 0 if all pass, else 2."""
    failed = False
    for path in paths:
        try:
            _check_one(path, dump)
        except SpecError as err:
            print(err.render(), file=sys.stderr)
            failed = True
    return 2 if failed else 0


def _check_one(path: str, dump: str | None) -> None:
    text = read_spec(path)
    spec = parse(text, path)
    if dump == "ast":
        print(format_ast(spec), end="")
    kernel, warnings = check_with_warnings(spec)
    for warning in warnings:
        print(warning.render(text), file=sys.stderr)
    print(format_ir(kernel) if dump == "ir" else summary(kernel), end="" if dump == "ir" else "\n")


def summary(kernel: ir.KernelIR) -> str:
    """A few lines: the kernel's signature with shapes and dtypes, its size, and its checks."""
    dims = ", ".join(d.name + ("" if d.value is None else f"={d.value}") for d in kernel.dims)
    rows = [
        ("dims", dims),
        ("require", "; ".join(str(c) for c in kernel.constraints) or "-"),
        ("inputs", ", ".join(f"{t.name}: {t.dtype}{ir.shape_str(t.shape)}" for t in kernel.inputs)),
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
