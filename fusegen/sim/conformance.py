"""Applying rules.py: reporting violations (raise or warn), engine legality, and the launch-time checks
(LNC per target, the language subset of a kernel)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, Protocol

from .errors import Located, fault, user_site
from .rule_tables import ALU_ENGINES, BITVEC_OPS, LNC_DEGREES, SCALAR_ENGINE_PAIRS
from .rules import RULES, ConformanceWarning, Rule
from .subset import findings
from .targets import Target


class _RulesMode(Protocol):
    """The instance state violation() reads."""

    @property
    def rules_error(self) -> bool:
        """Violations raise (else warn)."""
        ...


class Instruction(Located, Protocol):
    """What violation() needs of an executing instruction (instr.Instr; no import, so no import circle)."""

    @property
    def ctx(self) -> _RulesMode:
        """The instance executing it."""
        ...

    @property
    def site(self) -> tuple[str, int]:
        """Its kernel source line."""
        ...

    @property
    def op(self) -> str:
        """Its op name."""
        ...


#: rules="error": every rules.py violation raises; "warn": warns once per rule and line, and runs on.
#: "error" is the default since generated/ conforms (issue 13).
DEFAULT_RULES = "error"
MODES = ("error", "warn")


def check_mode(rules: str) -> str:
    """Validate a rules= argument."""
    if rules not in MODES:
        raise ValueError(f"rules={rules!r}: choose from {MODES}")
    return rules


def check_launch(target: Target, grid: int, error: bool) -> None:
    """The LNC degree must exist on the target (reported at the launching line)."""
    degrees = LNC_DEGREES.get(target.nc_version, (1,))
    if grid not in degrees:
        detail = f"a {grid}-instance launch on {target.name}; LNC degrees there: {degrees}"
        violation_here("lnc-target", "launch", detail, error)


def check_arguments(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], error: bool
) -> None:
    """No list among a launch's arguments, nested in tuples included (reported at the launching line)."""
    code = getattr(fn, "__code__", None)
    names = code.co_varnames[: code.co_argcount] if code is not None else ()
    named = [(names[i] if i < len(names) else f"arg{i}", a) for i, a in enumerate(args)]
    for name, value in [*named, *kwargs.items()]:
        where = _list_within(value, name)
        if where is not None:
            violation_here("lang-no-list-args", "launch", f"argument {where!r} is a list", error)


def _list_within(value: object, name: str) -> str | None:
    """The name of the first list in `value` (itself or an element of a tuple), if any."""
    if isinstance(value, list):
        return name
    if isinstance(value, tuple):
        for i, item in enumerate(value):
            where = _list_within(item, f"{name}[{i}]")
            if where is not None:
                return where
    return None


def check_kernel(fn: Callable[..., Any], error: bool) -> None:
    """The kernel body and the helpers it calls stay inside the traced subset (checked once per function)."""
    for name, file, line, detail in findings(fn):
        report_at(name, (file, line), "nki.jit", detail, error)


def message(rule: Rule, detail: str) -> str:
    """'[rule] detail (rule text; source)'."""
    return f"[{rule.name}] {detail} ({rule.text}; source: {rule.source})"


_WARNED: set[tuple[str, tuple[str, int]]] = set()  # (rule, site) already warned about in this process


def violation(ins: Instruction, name: str, detail: str) -> None:
    """Report a broken rule at the instruction's source line: raise, or warn when rules='warn'."""
    rule = RULES[name]
    if ins.ctx.rules_error or rule.always:
        raise ins.fail(rule.error, message(rule, detail))
    key = (name, ins.site)
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(
            f"{ins.site[0]}:{ins.site[1]}: {ins.op}: {message(rule, detail)}",
            ConformanceWarning,
            stacklevel=2,
        )


def violation_here(name: str, op: str, detail: str, error: bool) -> None:
    """Report a broken rule at the kernel's current line outside an instruction (a launch, an allocation)."""
    report_at(name, user_site(), op, detail, error)


def report_at(name: str, site: tuple[str, int], op: str, detail: str, error: bool) -> None:
    """Report a broken rule at `site`: raise when `error` or the rule is `always`, else warn once per rule
    and site."""
    rule = RULES[name]
    if error or rule.always:
        raise fault(rule.error, op, message(rule, detail), site)
    if (name, site) not in _WARNED:
        _WARNED.add((name, site))
        warnings.warn(f"{site[0]}:{site[1]}: {op}: {message(rule, detail)}", ConformanceWarning, stacklevel=3)


def engine_problem(instr: str, engine: str, ops: tuple[str, ...], nc_version: int) -> str | None:
    """The rule an ALU instruction breaks on `engine` with `ops` (None if legal); cached per combination."""
    key = (instr, engine, ops, nc_version)
    if key not in _ENGINE_PROBLEMS:
        _ENGINE_PROBLEMS[key] = _engine_problem(instr, engine, ops, nc_version)
    return _ENGINE_PROBLEMS[key]


def _engine_problem(instr: str, engine: str, ops: tuple[str, ...], nc_version: int) -> str | None:
    """Uncached engine_problem."""
    named = tuple(op for op in ops if op)
    if any(op in BITVEC_OPS for op in named) and engine != "vector":
        return "tensor-scalar-op-kinds" if instr == "tensor_scalar" else "alu-engine"
    if instr == "tensor_scalar" and engine == "gpsimd" and any(op != "rsqrt" for op in named):
        return "tensor-scalar-gpsimd"
    if instr == "tensor_scalar" and engine == "scalar":
        pair = (ops[0], (ops[1] if len(ops) > 1 else "") or None)
        if nc_version < 3 or pair not in SCALAR_ENGINE_PAIRS:
            return "scalar-engine-pairs"
        return None
    if any(engine not in ALU_ENGINES.get(op, frozenset({"vector"})) for op in named):
        return "alu-engine"
    return None


_ENGINE_PROBLEMS: dict[tuple[str, str, tuple[str, ...], int], str | None] = {}


def pick_engine(instr: str, choices: tuple[str, ...], ops: tuple[str, ...], nc_version: int) -> str:
    """engine=unknown: the first of `choices` on which the ops are legal (else the first choice); cached."""
    key = (instr, choices, ops, nc_version)
    engine = _PICKED.get(key)
    if engine is None:
        legal = [e for e in choices if engine_problem(instr, e, ops, nc_version) is None]
        engine = _PICKED[key] = legal[0] if legal else choices[0]
    return engine


_PICKED: dict[tuple[str, tuple[str, ...], tuple[str, ...], int], str] = {}
