"""Scalars a kernel forms from its params alone when NKI traces it, and what each must be there: a divisor
nonzero, an rsqrt's operand positive, each immediate within f32. The host functions check them against the
params of every call (files/signature.py writes them into `_Signature.domains`, argcheck.py checks them);
the checker holds the params' defaults to the same rules, as every `check` line and default call uses them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from fusegen.dsl.diagnostics import Diagnostic
from fusegen.dsl.folding import EVAL_NAMES, scalar_code
from fusegen.dsl.ir import F32_MAX, KernelIR, Node


@dataclass(frozen=True)
class ParamScalar:
    """One scalar of the params a node forms: its spec spelling, what it must be ("!= 0", "> 0", ">= 0", or
    "f32": within f32 range), the node forming it, and Python over the params as `p[i]`."""

    text: str
    need: str
    node: Node
    code: str


def param_scalars(ir: KernelIR) -> list[ParamScalar]:
    """Every divisor, rsqrt / sqrt operand and power base that is a scalar of the params alone, then the
    f32 immediates each node computes with, in IR order (a divisor's check before its reciprocal's), once
    each."""
    params = {p.name: i for i, p in enumerate(ir.params)}

    def spell(name: str) -> str | None:  # None: a param the IR reads but does not take (the weight prep's)
        return f"p[{params[name]}]" if name in params else None

    found: dict[tuple[str, str], ParamScalar] = {}
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
            found.setdefault((text, kind), ParamScalar(text, kind, node, code))
    return list(found.values())


def default_errors(ir: KernelIR) -> list[Diagnostic]:
    """An error where the spec forms a scalar its params' defaults leave undefined or past f32 (`x / p`
    with `param p = 0`): the generated host refuses those defaults, so every check and default call
    failed, and `fusegen check` reported it as a fusegen bug."""
    values = tuple(p.default for p in ir.params)
    for scalar in param_scalars(ir):
        problem = _problem(scalar, values)
        if problem is not None:  # the first only: an undefined scalar leaves the later ones undefined too
            used = [p for i, p in enumerate(ir.params) if f"p[{i}]" in scalar.code]
            listed = ", ".join(f"`param {p.name} = {p.default!r}` (line {p.span.line})" for p in used)
            hint = "change the default (a call may pass other values, which the host checks the same way)"
            return [Diagnostic(scalar.node.span, f"with {listed}, {problem}", hint=hint)]
    return []


def _problem(scalar: ParamScalar, values: tuple[float, ...]) -> str | None:
    """What is wrong with `scalar` at the params `values`, as argcheck.py's `_check_domains` judges it."""
    form: Callable[[tuple[float, ...]], float] = eval(f"lambda p: {scalar.code}", dict(EVAL_NAMES))
    try:
        value = form(values)
    except ArithmeticError as err:
        return f"the kernel cannot form {scalar.text}: {err}"
    if scalar.need == "f32":
        if abs(value) > F32_MAX and all(math.isfinite(v) for v in values):
            return f"the kernel computes with {scalar.text} = {value:.8g}, past f32's range (inf there)"
        return None
    bad = value == 0 if scalar.need == "!= 0" else value <= 0 if scalar.need == "> 0" else value < 0
    return f"the kernel needs {scalar.text} {scalar.need}, and it is {value!r}" if bad else None


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
