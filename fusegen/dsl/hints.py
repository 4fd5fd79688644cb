"""Hints for names a newcomer brings from torch or NumPy: a function, keyword or dtype the spec language
spells differently or does not have. A close spelling (did_you_mean) would point the wrong way here:
`softmax` is not `max`, `i32` is not `f32`, torch's `dim=` is not `keepdim`."""

from __future__ import annotations

from collections.abc import Iterable

from fusegen.dsl.names import did_you_mean

_SOFTMAX = (
    "there is no softmax function: write it out, `e = exp(x - max(x, axis=-1, keepdim=true))` then "
    "`e / sum(e, axis=-1, keepdim=true)` (examples/scaled_softmax.spec)"
)
_LAYOUT = (
    "values have no transpose or reshape: declare the input in the layout the math needs "
    "(`w: bf16[K, N]` for `x @ w`)"
)
_CAST = "casts are `bf16(x)`, `f16(x)`, `f32(x)`, `fp8_e4m3(x)` and `fp8_e5m2(x)`"
#: functions other frameworks have, with how a spec says it.
FUNCTION_HINTS = {
    "softmax": _SOFTMAX,
    "log_softmax": _SOFTMAX,
    "pow": "write a power as `x ** 2` (the exponent a constant number)",
    "matmul": "write a matmul as `x @ w`",
    "mm": "write a matmul as `x @ w`",
    "bmm": "write a matmul as `x @ w`",
    "linear": "write a linear layer as `x @ w + b`, with `w` declared [in, out]",
    "transpose": _LAYOUT,
    "permute": _LAYOUT,
    "reshape": _LAYOUT,
    "view": _LAYOUT,
    "t": _LAYOUT,
    "min": "there is no `min` reduction: write `-max(-x, axis=...)`; elementwise it is `minimum(a, b)`",
    "amax": "the reduction is `max(x, axis=-1, keepdim=true)`",
    "add": "write `a + b`",
    "mul": "write `a * b`",
    "sub": "write `a - b`",
    "div": "write `a / b`",
    "swish": "did you mean `silu`?",
    "float": _CAST,
    "half": _CAST,
    "bfloat16": _CAST,
    "float16": _CAST,
    "float32": _CAST,
    "to": _CAST,
}
#: keywords other frameworks use, with the parameter a spec names.
KEYWORD_SYNONYMS = {"dim": "axis", "keepdims": "keepdim", "weight": "gamma", "bias": "beta"}
_INTEGER_DTYPE = (
    "integer and bool tensors are not supported: the engines compute in floats; pass indices or masks as "
    "f32 (a mask as 0/1 with `where(m > 0.5, a, b)`, or as an additive bias)"
)
_WIDE_DTYPE = "f64 is not supported: the engines compute in at most f32; declare f32 and cast on the host"


def function_hint(name: str, functions: Iterable[str]) -> str | None:
    """How to write what `name` does, or the closest function name."""
    return FUNCTION_HINTS.get(name) or did_you_mean(name, functions)


def keyword_hint(name: str, params: Iterable[str]) -> str | None:
    """The parameter a foreign keyword means, or the closest parameter name."""
    params = list(params)
    synonym = KEYWORD_SYNONYMS.get(name)
    if synonym in params:
        return f"`{name}` is spelt `{synonym}` here: `{synonym}=...`"
    return did_you_mean(name, params)


def dtype_hint(name: str, dtypes: Iterable[str]) -> str:
    """Why an integer or f64 dtype is refused, else the closest dtype or the list."""
    lowered = name.lower()
    sized_int = lowered.startswith(("i", "u")) and any(c.isdigit() for c in lowered)  # i32, int8, uint8
    if sized_int or lowered in ("bool", "int", "long", "short", "char", "byte"):
        return _INTEGER_DTYPE
    if lowered in ("f64", "fp64", "float64", "double"):
        return _WIDE_DTYPE
    if lowered in ("fp8", "float8", "f8"):
        return "fp8 comes in two formats: `fp8_e4m3` (max 448) and `fp8_e5m2`"
    dtypes = list(dtypes)
    return did_you_mean(name, dtypes) or f"dtypes are {', '.join(dtypes)}"
