"""The checker: a parsed Spec -> a typed KernelIR, reporting every error at once (Exo's TypeChecker style)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TypeVar

from fusegen.dsl import ast, ir
from fusegen.dsl.check_cost import warn_heavy_checks
from fusegen.dsl.constraints import check_lines, declare_requires
from fusegen.dsl.context import FAILED_NODE, Binding, Context
from fusegen.dsl.declarations import (
    claim_names,
    declare_dims,
    declare_inputs,
    declare_outputs,
    declare_params,
    kernel_name,
    owns,
)
from fusegen.dsl.diagnostics import Diagnostic, Span, SpecError
from fusegen.dsl.dim_sources import dim_sources
from fusegen.dsl.expressions import value
from fusegen.dsl.param_scalars import default_errors
from fusegen.dsl.parser import parse
from fusegen.dsl.source import read_spec

ItemT = TypeVar("ItemT")
#: the longest chain of operations one value may sit at the end of, across statements: codegen walks
#: such chains, and thousands of statements each building on the last are no fused kernel.
MAX_CHAIN = 100


def check(spec: ast.Spec) -> ir.KernelIR:
    """The checked IR of `spec`; raises SpecError listing every error. Warnings are dropped."""
    return check_with_warnings(spec)[0]


def check_with_warnings(spec: ast.Spec) -> tuple[ir.KernelIR, tuple[Diagnostic, ...]]:
    """The checked IR of `spec` and its warnings; raises SpecError listing every error."""
    ctx = Context(spec.path)
    claim_names(ctx, spec.items)
    name = kernel_name(ctx, _of(spec, ast.KernelDecl))
    dims = declare_dims(ctx, _of(spec, ast.DimDecl))
    constraints = declare_requires(ctx, _of(spec, ast.RequireDecl))
    inputs = declare_inputs(ctx, _of(spec, ast.InputDecl))
    params = declare_params(ctx, _of(spec, ast.ParamDecl))
    _require_determined_dims(ctx, dims, inputs)
    for statement in _of(spec, ast.Assign):
        _assign(ctx, statement)
    outputs = declare_outputs(ctx, _of(spec, ast.OutputDecl))
    _require_dims_from_inputs(ctx, dims, _of(spec, ast.InputDecl), outputs)
    checks = check_lines(ctx, _of(spec, ast.CheckDecl), constraints)
    warn_heavy_checks(ctx, checks, outputs)
    _warn_unused(ctx, spec)
    if ctx.errors:
        raise SpecError(_in_source_order(ctx.errors), spec.source)
    kernel = ir.KernelIR(
        name=name,
        path=spec.path,
        source_sha256=hashlib.sha256(spec.source.encode("utf-8")).hexdigest(),
        dims=dims,
        constraints=constraints,
        inputs=inputs,
        params=params,
        nodes=tuple(ctx.nodes),
        outputs=outputs,
        checks=checks,
        doc=spec.doc,
    )
    if errors := default_errors(kernel):  # needs the whole graph: the scalars a node forms from the params
        raise SpecError(errors, spec.source)
    return kernel, _in_source_order(ctx.warnings)


def load_spec(path: str) -> tuple[ir.KernelIR, tuple[Diagnostic, ...]]:
    """Read, parse and check the spec file at `path`: its IR and warnings, or SpecError."""
    return check_with_warnings(parse(read_spec(path), path))


def _of(spec: ast.Spec, kind: type[ItemT]) -> Sequence[ItemT]:
    """The spec's items of one kind, in source order."""
    return [item for item in spec.items if isinstance(item, kind)]


def _assign(ctx: Context, statement: ast.Assign) -> None:
    """Lower one `name = expr` statement and bring `name` into scope for the lines below."""
    target = statement.target
    node = value(ctx, statement.value)
    if node is not None and _chain_length(ctx) > MAX_CHAIN:
        message = f"`{target.name}` sits at the end of a chain of more than {MAX_CHAIN} operations"
        ctx.error(statement.span, message, "fuse fewer steps into one kernel, or split the spec in two")
        ctx.failed.add(target.name)
        node = None
    if not owns(ctx, target):
        return
    ctx.pending.pop(target.name, None)
    if node is not None:
        ctx.name_node(node, target.name)
    ctx.scope[target.name] = Binding(FAILED_NODE if node is None else node, "value", target.span)


def _require_determined_dims(
    ctx: Context, dims: Sequence[ir.DimDecl], inputs: Sequence[ir.TensorDecl]
) -> None:
    """A free dim used in an input's shape must be determined by the runtime shapes: some input's whole
    axis, or an axis linear in it once the others are known (dim_sources.py), which generated code solves."""
    fixed = [d.name for d in dims if d.value is not None]
    determined = {s.name for s in dim_sources(inputs, fixed)} | set(fixed)
    for dim in dims:
        if dim.name in determined:
            continue
        using = next((i for i in inputs if any(dim.name in d.symbols() for d in i.shape)), None)
        if using is not None:
            message = f"dim `{dim.name}` appears only inside compound axes that do not determine its value"
            hint = f"give one input a whole `{dim.name}` axis, or fix its value: `dim {dim.name} = 64`"
            ctx.error(using.span, message, hint)


def _require_dims_from_inputs(
    ctx: Context,
    dims: Sequence[ir.DimDecl],
    inputs: Sequence[ast.InputDecl],
    outputs: Sequence[ir.OutputDecl],
) -> None:
    """A free dim in no input's shape has no value at run time: an error where the math first uses it
    (a slice, an output's shape, a value); one nothing uses is `_warn_unused_dims`'s. Names are read from
    the syntax: an input whose declaration failed still shows which dims the user meant it to give."""
    in_inputs = {name for decl in inputs for name in ast.names(decl.type)}
    for dim in dims:
        if dim.value is not None or dim.name in in_inputs:
            continue
        use = _first_use(ctx, outputs, dim.name)
        if use is None:
            continue
        message = f"dim `{dim.name}` is in no input's shape, so a call cannot give its value"
        hint = f"give one input a `{dim.name}` axis, or fix its value: `dim {dim.name} = 64`"
        ctx.error(use, message, hint)


def _first_use(ctx: Context, outputs: Sequence[ir.OutputDecl], name: str) -> Span | None:
    """The span of the first node or output whose shape, index or value mentions dim `name`."""
    spans = [n.span for n in ctx.nodes if name in _node_symbols(n)]
    spans += [o.span for o in outputs if any(name in d.symbols() for d in o.shape)]
    return min(spans, key=lambda s: (s.line, s.col), default=None)


def _node_symbols(node: ir.Node) -> set[str]:
    """Every dim a node's shape or attributes (a `dim` leaf, slice bounds) mention."""
    dims = list(node.shape)
    for _, attr in node.attrs:
        if isinstance(attr, ir.Dim):
            dims.append(attr)
        elif isinstance(attr, tuple):
            dims += [d for item in attr for d in (item.start, item.stop) if d is not None]
    return {s for d in dims for s in d.symbols()}


def _chain_length(ctx: Context) -> int:
    """The longest chain of operations ending at a node built since the last call (linear overall)."""
    chain, start = ctx.chain, len(ctx.chain)
    for node in ctx.nodes[start:]:
        chain.append(1 + max((chain[a] for a in node.args if 0 <= a < len(chain)), default=0))
    return max(chain[start:], default=0)


def _warn_unused(ctx: Context, spec: ast.Spec) -> None:
    """Dims, inputs, params and values nobody reads are legal, but usually a mistake."""
    _warn_unused_dims(ctx, spec)
    for name, binding in ctx.scope.items():
        if name in ctx.reads or binding.node == FAILED_NODE:
            continue
        if binding.kind == "value":
            ctx.warn(
                binding.span, f"`{name}` is computed but never used", "use it, or declare it an `output`"
            )
        else:
            ctx.warn(binding.span, f"{binding.kind} `{name}` is never used")


def _warn_unused_dims(ctx: Context, spec: ast.Spec) -> None:
    """A dim no shape or expression names still needs a value on every check line."""
    kernel_items = (ast.InputDecl, ast.OutputDecl, ast.Assign)
    used = {name for item in spec.items if isinstance(item, kernel_items) for name in ast.names(item)}
    for dim in ctx.dims.values():
        if dim.name not in used:
            hint = "remove it from the `dim` line, or use it in a shape"
            ctx.warn(dim.span, f"dim `{dim.name}` is never used", hint)


def _in_source_order(diagnostics: list[Diagnostic]) -> tuple[Diagnostic, ...]:
    return tuple(sorted(diagnostics, key=lambda d: (d.span.line, d.span.col)))
