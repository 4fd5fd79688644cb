"""Readable, deterministic text dumps of the AST and the IR (`fusegen check-spec --dump ast|ir`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from fusegen.dsl import ast, ir
from fusegen.dsl.diagnostics import Span

#: node lines pad their `%id = op(...) : type` part to this width before the `# name @ line:col` note.
_NOTE_COLUMN = 56


def format_number(value: float) -> str:
    """The shortest text that reads back as `value` (finite floats only reach here)."""
    return repr(float(value))


def format_ir(kernel: ir.KernelIR) -> str:
    """The IR as text: declarations, one line per node, outputs and checks."""
    lines = [f"kernel {kernel.name}  # {kernel.path}"]
    lines += [f"# {line}".rstrip() for line in kernel.doc.split("\n") if kernel.doc]
    lines += [f"dim {d.name}" + ("" if d.value is None else f" = {d.value}") for d in kernel.dims]
    lines += [f"require {c}" for c in kernel.constraints]
    lines += [f"input {t.name}: {_type(t.dtype, t.shape)}{' finite' * t.finite}" for t in kernel.inputs]
    lines += [f"param {p.name} = {format_number(p.default)}" for p in kernel.params]
    lines += [_node_line(kernel, node) for node in kernel.nodes]
    for out in kernel.outputs:
        optional = "optional " if out.optional else ""
        lines.append(f"{optional}output {out.name} = %{out.node} : {_type(out.dtype, out.shape)}")
    order = [d.name for d in kernel.dims]
    for shape in kernel.checks:
        env = shape.env()
        lines.append("check " + " ".join(f"{name}={env[name]}" for name in order))
    return "\n".join(lines) + "\n"


def _type(dtype: str, shape: ir.Shape) -> str:
    return f"{dtype}{ir.shape_str(shape)}"


def _node_line(kernel: ir.KernelIR, node: ir.Node) -> str:
    """`%7 = matmul(%0, %1) : f32[R, I]                # h @ 12:9`."""
    operands = [f"%{a}" for a in node.args]
    attrs = [f"{key}={_attr(kernel, node, value)}" for key, value in node.attrs]
    body = f"%{node.id} = {node.op}({', '.join(operands + attrs)}) : {_type(node.dtype, node.shape)}"
    note = f"{node.name} " if node.name else ""
    return f"{body.ljust(_NOTE_COLUMN)} # {note}@ {node.span.line}:{node.span.col}"


def _attr(kernel: ir.KernelIR, node: ir.Node, value: ir.AttrValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return format_number(value)
    if isinstance(value, tuple) and node.op == "unindex":  # items over its own shape; new axes `None`
        items = zip(value, node.shape, strict=True)
        return "[" + ", ".join("None" if item == _NEW_AXIS and size == ir.Dim.const(1)
                               else _index_item(item, size) for item, size in items) + "]"  # fmt: skip
    if isinstance(value, tuple):
        source = kernel.node(node.args[0]).shape
        return (
            "[" + ", ".join(_index_item(item, size) for item, size in zip(value, source, strict=True)) + "]"
        )
    return str(value)


_NEW_AXIS = ir.IndexItem("at", ir.Dim.const(0))


def _index_item(item: ir.IndexItem, size: ir.Dim) -> str:
    if item.kind == "at":
        return str(item.start)
    if item.start == ir.Dim.const(0) and item.stop == size:
        return ":"
    return f"{item.start}:{item.stop}"


def format_ast(spec: ast.Spec) -> str:
    """The AST as an indented tree: one node per line with its fields and `@ line:col`."""
    lines = [f"Spec {spec.path}"]
    for item in spec.items:
        _ast_lines(item, 1, "", lines)
    return "\n".join(lines) + "\n"


def _ast_lines(node: Any, depth: int, label: str, lines: list[str]) -> None:
    """Append `node` and its children, children one level deeper."""
    scalars, children = [], []
    for field in dataclasses.fields(node):
        val = getattr(node, field.name)
        if isinstance(val, Span) or field.name == "span":
            continue
        if dataclasses.is_dataclass(val) or (
            isinstance(val, tuple) and val and dataclasses.is_dataclass(val[0])
        ):
            children.append((field.name, val))
        elif val != ():
            scalars.append(f"{field.name}={val!r}")
    where = f"@ {node.span.line}:{node.span.col}"
    lines.append("  " * depth + label + " ".join([type(node).__name__, *scalars, where]))
    for name, child in children:
        for element in child if isinstance(child, tuple) else (child,):
            _ast_lines(element, depth + 1, f"{name}: ", lines)
