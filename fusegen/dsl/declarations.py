"""Declarations: the kernel name, dims, inputs, params and outputs, checked into their IR records."""

from __future__ import annotations

import math
from collections.abc import Sequence

from fusegen.dsl import ast, ir
from fusegen.dsl.context import FAILED_NODE, Binding, Context, article
from fusegen.dsl.diagnostics import Span
from fusegen.dsl.hints import dtype_hint
from fusegen.dsl.ir import F32_MAX
from fusegen.dsl.shapes import MAX_DIM_VALUE, to_dim

#: ops that compute nothing: an output bound to one would only copy a host value.
_LEAF_OPS = ("input", "param", "const", "dim")


def claim_names(ctx: Context, items: Sequence[ast.Item]) -> None:
    """Claim every declared name in source order, so duplicates point at the later line."""
    for item in items:
        if isinstance(item, ast.KernelDecl):
            ctx.declare(item.name.name, item.name.span, "kernel")
        elif isinstance(item, ast.DimDecl):
            for dim in item.items:
                ctx.declare(dim.name.name, dim.name.span, "dim")
        elif isinstance(item, ast.InputDecl):
            ctx.declare(item.name.name, item.name.span, "input")
        elif isinstance(item, ast.ParamDecl):
            ctx.declare(item.name.name, item.name.span, "param")
        elif isinstance(item, ast.Assign) and ctx.declare(item.target.name, item.target.span, "value"):
            ctx.pending[item.target.name] = item.target.span


def owns(ctx: Context, ident: ast.Ident) -> bool:
    """Whether this declaration won its name (an invalid or duplicate one is skipped after its error)."""
    return ctx.declared.get(ident.name) == ident.span


#: attributes torch.ops namespaces define themselves (torch 2.x `_OpNamespace.name`): an op of that name is
#: shadowed, so `torch.ops.fusegen.<name>` would not reach it
OPS_NAMESPACE_ATTRIBUTES = frozenset({"name"})


def kernel_name(ctx: Context, decls: Sequence[ast.KernelDecl]) -> str:
    """The kernel's name from its single `kernel` line."""
    if not decls:
        ctx.error(
            Span.whole_file(ctx.path), "the spec has no `kernel NAME` line", "start it with `kernel my_op`"
        )
        return ""
    for extra in decls[1:]:
        ctx.error(extra.span, f"a spec declares one kernel; `kernel` is already at line {decls[0].span.line}")
    name = decls[0].name
    if name.name in OPS_NAMESPACE_ATTRIBUTES:
        ctx.error(
            name.span,
            f"`{name.name}` cannot be a kernel name: `torch.ops.fusegen.{name.name}` is the op namespace's "
            "own attribute, so the generated op could not be reached there",
            f"rename it, e.g. `kernel {name.name}_op`",
        )
        return ""
    return name.name if owns(ctx, name) else ""


def declare_dims(ctx: Context, decls: Sequence[ast.DimDecl]) -> tuple[ir.DimDecl, ...]:
    """The dims, fixed ones with their positive integer value."""
    for item in (item for decl in decls for item in decl.items):
        if owns(ctx, item.name):
            value = None if item.value is None else positive_int(ctx, item.value, f"dim `{item.name.name}`")
            ctx.dims[item.name.name] = ir.DimDecl(item.name.name, value, item.span)
    return tuple(ctx.dims.values())


def positive_int(ctx: Context, number: ast.Number, what: str) -> int | None:
    """The value of a literal that must be a positive integer (dim values, check values)."""
    if not number.is_int or number.value < 1:
        ctx.error(number.span, f"{what} must be a positive integer; got `{number.text}`")
        return None
    if number.value > MAX_DIM_VALUE:
        ctx.error(number.span, f"{what} is too large: `{number.text}` (at most {MAX_DIM_VALUE})")
        return None
    return int(number.text)


def declare_inputs(ctx: Context, decls: Sequence[ast.InputDecl]) -> tuple[ir.TensorDecl, ...]:
    """The inputs in declaration order, each with its `input` node."""
    inputs: list[ir.TensorDecl] = []
    for decl in decls:
        dtype, shape = tensor_type(ctx, decl.type)
        if not owns(ctx, decl.name):
            continue
        name = decl.name.name
        if dtype is None or shape is None:
            ctx.failed.add(name)
            continue
        attrs = (("index", len(inputs)),)
        node = ctx.add_node("input", (), attrs, shape, dtype, decl.span, name)
        ctx.scope[name] = Binding(node, "input", decl.name.span)
        inputs.append(ir.TensorDecl(name, dtype, shape, decl.span, decl.finite))
    return tuple(inputs)


def declare_params(ctx: Context, decls: Sequence[ast.ParamDecl]) -> tuple[ir.ParamDecl, ...]:
    """The scalar params, each with its `param` node and a finite default."""
    params = []
    for decl in decls:
        default = decl.default.value
        if not owns(ctx, decl.name):
            continue
        name = decl.name.name
        if not math.isfinite(default):
            ctx.error(decl.default.span, f"`{decl.default.text}` is not a finite number")
            ctx.failed.add(name)
            continue
        if abs(default) > F32_MAX:  # a kernel takes a param as an fp32 immediate
            hint = f"a param is f32: its magnitude is at most {F32_MAX:.8g}"
            ctx.error(decl.default.span, f"`{decl.default.text}` does not fit in f32", hint)
            ctx.failed.add(name)
            continue
        node = ctx.add_node("param", (), (("default", default),), (), ir.COMPUTE_DTYPE, decl.span, name)
        ctx.scope[name] = Binding(node, "param", decl.name.span)
        params.append(ir.ParamDecl(name, default, decl.span))
    return tuple(params)


def declare_outputs(ctx: Context, decls: Sequence[ast.OutputDecl]) -> tuple[ir.OutputDecl, ...]:
    """The outputs, each naming a computed value whose shape it must match exactly."""
    outputs: list[ir.OutputDecl] = []
    seen: dict[str, Span] = {}
    if not decls:
        ctx.error(
            Span.whole_file(ctx.path), "the spec declares no `output`", "add e.g. `output y: bf16[R, K]`"
        )
    for decl in decls:
        name = decl.name.name
        dtype, shape = tensor_type(ctx, decl.type)
        if name in seen:
            ctx.error(decl.name.span, f"output `{name}` is already declared at line {seen[name].line}")
            continue
        seen[name] = decl.name.span
        node = _output_node(ctx, decl.name)
        if node is None or dtype is None or shape is None:
            continue
        value = ctx.nodes[node]
        if value.shape != shape:
            message = f"output `{name}` is declared {ir.shape_str(shape)} but its value has shape"
            ctx.error(decl.type.span, f"{message} {ir.shape_str(value.shape)}")
            continue
        outputs.append(ir.OutputDecl(name, node, dtype, shape, decl.optional, decl.span))
    return tuple(outputs)


def _output_node(ctx: Context, ident: ast.Ident) -> int | None:
    """The computed node an output names."""
    binding = ctx.scope.get(ident.name)
    if ident.name in ctx.failed:
        return None
    if binding is None:
        values = [n for n, b in ctx.scope.items() if b.kind == "value"]
        ctx.error(ident.span, f"output `{ident.name}` is never computed", ctx.suggest(ident.name, values))
        return None
    ctx.reads.add(ident.name)
    if binding.kind != "value":
        hint = "outputs are computed values; an input or param is already on the host"
        ctx.error(ident.span, f"output `{ident.name}` is {article(binding.kind)}, not a computed value", hint)
        return None
    if binding.node == FAILED_NODE:
        return None
    if ctx.nodes[binding.node].op in _LEAF_OPS:
        hint = f"an output must be computed; to copy a value, cast it: `{ident.name} = f32(...)`"
        ctx.error(ident.span, f"output `{ident.name}` computes nothing", hint)
        return None
    if ctx.nodes[binding.node].dtype == "bool":
        ctx.error(ident.span, f"output `{ident.name}` is a comparison", "outputs are numbers: use where(...)")
        return None
    return binding.node


def tensor_type(ctx: Context, spelled: ast.TensorType) -> tuple[str | None, ir.Shape | None]:
    """The dtype and shape of `bf16[R, K]`; each None after reporting its error."""
    dtype = _dtype(ctx, spelled.dtype)
    dims = tuple(to_dim(ctx, expr) for expr in spelled.dims)
    if any(d is None for d in dims):
        return dtype, None
    return dtype, tuple(d for d in dims if d is not None)


def _dtype(ctx: Context, ident: ast.Ident) -> str | None:
    if ident.name in ir.DTYPES:
        return ident.name
    hint = dtype_hint(ident.name, ir.DTYPES)
    ctx.error(ident.span, f"unknown dtype `{ident.name}`", hint)
    return None
