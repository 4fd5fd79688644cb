"""An activation argument outside the hardware's valid input range, met while `check` or `explain` runs a
kernel on the test inputs, answered as a spec error at the spec's call: `log(x)` of N(0, 1) inputs, or
`sqrt(relu(x))` (sqrt's range starts at 2^-116, not 0), is the spec's math, not a fusegen bug."""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator
from pathlib import Path

from fusegen.dsl import load_spec
from fusegen.dsl.diagnostics import Diagnostic, SpecError
from fusegen.sim.errors import InputRangeError
from fusegen.sim.rule_tables import ACTIVATION_RANGES

#: the spec ops each activation function computes (`/` is a reciprocal, the norms' rstd an rsqrt).
SPEC_OPS = {
    "log": ("log",), "sqrt": ("sqrt",), "rsqrt": ("rsqrt", "rmsnorm", "layernorm"), "reciprocal": ("div",)
}  # fmt: skip
#: how to keep each function's argument inside its range.
GUARDS = {
    "log": "`log(maximum(x, 1e-6))`",
    "sqrt": "`sqrt(x + 1e-30)` (sqrt(0) is outside it)",
    "rsqrt": "`rsqrt(v + eps)`",
    "reciprocal": "`x / maximum(abs(d), 1e-6)`, or a param as the divisor",
}
_DETAIL = re.compile(r"argument\(s\) of (\w+) outside its range, e\.g\. (\S+)")


@contextlib.contextmanager
def spec_ranges(spec: str, dims: dict[str, int]) -> Iterator[None]:
    """Turn the interpreter's InputRangeError inside the block into a SpecError at the spec's call."""
    try:
        yield
    except InputRangeError as err:
        error = range_error(spec, dims, str(err))
        if error is None:  # not the refusal this module reads: let it surface as the bug it is
            raise
        raise error from None


def range_error(spec: str, dims: dict[str, int], detail: str) -> SpecError | None:
    """The spec error for an out-of-range activation argument the interpreter described in `detail`."""
    found = _DETAIL.search(detail)
    if found is None or found[1] not in GUARDS:
        return None
    ir, _ = load_spec(spec)
    name, example = found[1], found[2]
    node = next((n for n in ir.nodes if n.op in SPEC_OPS.get(name, ())), None)
    span = node.span if node is not None else ir.outputs[0].span
    low, high, magnitude = ACTIVATION_RANGES[name]
    valid = f"{'|x| in ' if magnitude else ''}[{_power(low)}, {_power(high)}]"
    shape = " ".join(f"{k}={v}" for k, v in sorted(dims.items()))
    message = (f"at {shape}, the test inputs drive `{name}` outside the range the hardware computes it on "
               f"({valid}; e.g. {example}): its result there is undefined")  # fmt: skip
    hint = f"keep the argument inside it, e.g. {GUARDS[name]}; the tests draw every input from N(0, 1)"
    source = Path(spec).read_text(encoding="utf-8", errors="replace")
    return SpecError([Diagnostic(span, message, hint=hint)], source)


def _power(value: float) -> str:
    """`2^-64` for a power of two, else the number."""
    mantissa, exponent = math.frexp(value)
    return f"2^{exponent - 1}" if mantissa == 0.5 else f"{value:g}"
