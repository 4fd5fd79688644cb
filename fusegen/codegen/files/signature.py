"""The door of every generated host function and op: its spec as a `_Signature` literal, and the call.

One mechanism for every family and entry point (forward, backward and weight-prep hosts, the op and its
fake): the checks run `argcheck.py`'s code, copied into the generated file, over a literal derived here
from the IR (inputs, dims, `require` lines, params, outputs) and the targets the host can plan for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from fusegen.codegen.files import argcheck as argcheck
from fusegen.codegen.files.render import vendored
from fusegen.dsl.folding import scalar_code
from fusegen.dsl.ir import Constraint, KernelIR, Node, Shape
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
    """`_Domain` literals: every divisor, rsqrt / sqrt operand and power base that is a scalar of the params
    alone (the kernel forms it in Python when traced, where 0 or a negative has no value), then the f32
    immediates each node computes with, in IR order (a divisor's check before its reciprocal's), once each."""
    params = {p.name: i for i, p in enumerate(ir.params)}

    def spell(name: str) -> str | None:  # None: a param the IR reads but does not take (the weight prep's)
        return f"p[{params[name]}]" if name in params else None

    found: dict[tuple[str, str], str] = {}
    for node in ir.nodes:
        checks = []
        need = _need(node)
        if need is not None:
            operand = ir.node(node.args[1] if node.op == "div" else node.args[0])
            code = _scalar(ir, operand, spell)
            if code is not None and "p[" in code:
                checks.append((str(_scalar(ir, operand, str)), need, code))
        checks += [(text, "f32", code) for text, code in _immediates(ir, node, spell)]
        for text, kind, code in checks:
            found.setdefault((text, kind), f"_Domain({text!r}, {kind!r}, {node.span.line}, lambda p: {code})")
    return list(found.values())


def _immediates(ir: KernelIR, node: Node, param: Callable[[str], str | None]) -> list[tuple[str, str]]:
    """(text, code) of each scalar of the params `node` computes with as an f32 immediate (a divisor's
    reciprocal, which the kernel multiplies by); none where `node` is itself such a scalar (formed in Python)
    or the scalar is a bare param (`_bare`)."""
    if _scalar(ir, node, str) is not None:
        return []
    found = []
    for i, operand in enumerate(ir.operands(node)):
        code = _scalar(ir, operand, param)
        if code is None or "p[" not in code:
            continue
        text = str(_scalar(ir, operand, str))
        if node.op == "div" and i == 1:
            found.append((f"1 / {text}", f"(1.0 / {code})"))
        elif not _bare(ir, operand):
            found.append((text, code))
    return found


def _bare(ir: KernelIR, node: Node) -> bool:
    """Whether `node` is a param, or its negation, absolute value or cast: as large as the param, whose range
    the param check covers."""
    while node.op in ("neg", "abs", "cast"):
        node = ir.operands(node)[0]
    return node.op == "param"


def _need(node: Node) -> str | None:
    """What the operand of `node` must be for Python to form it: a divisor nonzero, an rsqrt or negative
    power's base positive, a sqrt or fractional power's base non-negative; None for other ops."""
    if node.op == "div":
        return "!= 0"
    if node.op in ("rsqrt", "sqrt"):
        return "> 0" if node.op == "rsqrt" else ">= 0"
    if node.op == "pow":
        exponent = float(node.attr("exponent"))  # type: ignore[arg-type]
        if exponent < 0:
            return "> 0" if not exponent.is_integer() else "!= 0"
        return ">= 0" if not exponent.is_integer() else None
    return None


def _scalar(ir: KernelIR, node: Node, param: Callable[[str], str | None]) -> str | None:
    """`node` as Python over the params (`param(name)` spells one, None: not a param here), or None when it is
    not a scalar of params and constants alone (a dim, a tensor, an op the kernel does not form in Python)."""
    if node.shape != ():
        return None
    if node.op == "param":
        return param(str(node.name))
    if node.op == "const":
        return repr(float(node.attr("value")))  # type: ignore[arg-type]
    args = [_scalar(ir, a, param) for a in ir.operands(node)]
    if any(a is None for a in args):
        return None
    return scalar_code(node, args)  # type: ignore[arg-type]
