"""Launch-time conformance checks: the rules mode, LNC per target, and the language subset of a kernel."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from .errors import fault, user_site
from .rules import LNC_DEGREES, RULES, ConformanceWarning, message
from .subset import findings
from .targets import Target

#: rules="error": every rules.py violation raises; "warn": warns once per rule and line, and runs on.
#: "warn" is the default until generated/ conforms (issue 13); tests/sim/test_conformance.py and the
#: rule tests run with "error".
DEFAULT_RULES = "warn"
MODES = ("error", "warn")
_warned_kernels: set[tuple[object, int]] = set()


def check_mode(rules: str) -> str:
    """Validate a rules= argument."""
    if rules not in MODES:
        raise ValueError(f"rules={rules!r}: choose from {MODES}")
    return rules


def _report(name: str, site: tuple[str, int], op: str, detail: str, error: bool) -> None:
    """Raise the rule's error at `site`, or warn."""
    rule = RULES[name]
    if error:
        raise fault(rule.error, op, message(rule, detail), site)
    warnings.warn(f"{site[0]}:{site[1]}: {op}: {message(rule, detail)}", ConformanceWarning, stacklevel=4)


def check_launch(target: Target, grid: int, fn: Callable[..., Any], error: bool) -> None:
    """The LNC degree must exist on the target (reported at the launching line)."""
    degrees = LNC_DEGREES.get(target.nc_version, (1,))
    if grid not in degrees:
        detail = f"a {grid}-instance launch on {target.name}; LNC degrees there: {degrees}"
        _report("lnc-target", user_site(), "launch", detail, error)


def check_kernel(fn: Callable[..., Any], error: bool) -> None:
    """The kernel body and the helpers it calls stay inside the traced subset (checked once per function)."""
    found = findings(fn)
    if not found:
        return
    if error:
        name, file, line, detail = found[0]
        _report(name, (file, line), "nki.jit", detail, True)
    for name, file, line, detail in found:
        key = (fn, line)
        if key not in _warned_kernels:
            _warned_kernels.add(key)
            _report(name, (file, line), "nki.jit", detail, False)
