"""The door of every generated host function and op: its spec as a `_Signature` literal, and the call.

One mechanism for every family and entry point (forward, backward and weight-prep hosts, the op and its
fake): the checks run `argcheck.py`'s code, copied into the generated file, over a literal derived here
from the IR (inputs, dims, `require` lines, params, outputs) and the targets the host can plan for.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fusegen.codegen.files import argcheck as argcheck
from fusegen.codegen.files.render import vendored
from fusegen.dsl.ir import Constraint, KernelIR, Shape
from fusegen.dsl.param_scalars import param_scalars
from fusegen.sim.targets import TARGETS

#: IR dtype -> torch dtype attribute
TORCH_NAME = {
    "bf16": "bfloat16",
    "f16": "float16",
    "f32": "float32",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
}


@dataclass(frozen=True)
class Returned:
    """A tensor a host returns: name, IR dtype, shape; optional ones only with save=True."""

    name: str
    dtype: str
    shape: Shape
    optional: bool = False


def door_source(signatures: Sequence[tuple[str, str]]) -> str:
    """The copied checks followed by the module's signature constants (constant name, literal)."""
    constants = "\n\n".join(f"{name} = {literal}" for name, literal in signatures)
    return vendored(argcheck, start="class _Decl") + "\n\n\n" + constants


def signature(name: str, ir: KernelIR, outputs: Iterable[Returned], targets: Iterable[str] = TARGETS,
              sums: bool = False, transposed: str | None = None) -> str:  # fmt: skip
    """The `_Signature(...)` literal of a host or op `name` taking `ir`'s inputs and params and returning
    `outputs`; `require` lines over dims no input binds are left out (a weight-prep host sees no rows).
    `transposed`: the input whose rows the kernel transposes on the Tensor engine."""
    targets = tuple(targets)
    bound = {s for i in ir.inputs for d in i.shape for s in d.symbols()} | set(ir.fixed_dims())
    requires = [c for c in ir.constraints if set(c.expr.symbols()) <= bound]
    lines = [
        f"    {name!r},",
        _block("inputs", [_decl(i.name, i.dtype, i.shape, finite=i.finite, transposed=i.name == transposed)
                          for i in ir.inputs]),
        f"    params={_tuple(repr(p.name) for p in ir.params)},",
        f"    fixed={_tuple(repr(item) for item in sorted(ir.fixed_dims().items()))},",
        _block("requires", [_require(c) for c in requires]),
        _block("outputs", [_decl(o.name, o.dtype, o.shape, o.optional) for o in outputs]),
        f"    targets={_tuple(repr((t, TARGETS[t].max_lnc)) for t in targets)},",
    ]
    if sums:
        lines.append("    sums=True,")
    inexact = [t for t in targets if not TARGETS[t].exact_transpose] if transposed else []
    if inexact:
        lines.append(f"    inexact_transpose={_tuple(repr(t) for t in inexact)},")
    domains = _domains(ir)
    if domains:
        lines.append(_block("domains", domains))
    return "_Signature(\n" + "\n".join(lines) + "\n)"


def door_lines(
    constant: str, ir: KernelIR, save: str = "False", default_lnc: str = "_LNC"
) -> tuple[str, ...]:
    """A host function's first lines: check the call (rebinding the tensors dense, the params as floats and
    `lnc` resolved) and return the outputs of an empty call without launching."""
    tensors = "".join(f"{i.name}, " for i in ir.inputs)
    params = "".join(f"{p.name}, " for p in ir.params)
    call = f"_door({constant}, ({tensors.rstrip()}), ({params.rstrip()}), {save}, lnc, target, {default_lnc})"
    bound = f"({tensors.rstrip(', ')},), ({params.rstrip()}), lnc, _empty"
    return (f"{bound} = {call}", "if _empty is not None:", "    return _empty")


def op_check(constant: str, ir: KernelIR) -> str:
    """The op's (and its fake's) check: the same signature, any floating dtype accepted (the op casts) but
    for an fp8 input, which takes its own dtype only."""
    tensors = "".join(f"{i.name}, " for i in ir.inputs)
    params = "".join(f"{p.name}, " for p in ir.params)
    return f"_door({constant}, ({tensors.rstrip()}), ({params.rstrip()}), cast=True)"


def _decl(name: str, dtype: str, shape: Shape, optional: bool = False, finite: bool = False,
          transposed: bool = False) -> str:  # fmt: skip
    dims = _tuple(repr(str(d)) for d in shape)
    flags = (", True" if optional else "") + (", finite=True" if finite else "")
    flags += ", transposed=True" if transposed else ""
    return f"_Decl({name!r}, {TORCH_NAME[dtype]!r}, {dims}{flags})"


def _require(c: Constraint) -> str:
    return f"_Require({str(c)!r}, {str(c.expr)!r}, {c.modulus or 0}, {c.op!r}, {c.rhs})"


def _tuple(items: Iterable[str]) -> str:
    """A tuple literal's source (`()`, `('x',)`, `(a, b)`)."""
    items = list(items)
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _block(field: str, items: list[str]) -> str:
    """A tuple-valued keyword argument, one item per line."""
    if not items:
        return f"    {field}=(),"
    return f"    {field}=(\n" + "".join(f"        {item},\n" for item in items) + "    ),"


def _domains(ir: KernelIR) -> list[str]:
    """`_Domain` literals of the scalars the kernel forms from the params (dsl/param_scalars.py)."""
    return [f"_Domain({d.text!r}, {d.need!r}, {d.node.span.line}, lambda p: {d.code})"
            for d in param_scalars(ir)]  # fmt: skip
