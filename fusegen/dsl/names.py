"""Which identifiers a spec may declare: names reach generated Python and NKI source, so they are vetted.

A spec is untrusted input. Every name it declares becomes a Python identifier in generated code, so it
must be a plain ASCII identifier that cannot shadow a keyword, a builtin, or a name the generated code
itself uses. The code generator may add its own names to RESERVED_NAMES before checking specs.
"""

from __future__ import annotations

import builtins
import difflib
import keyword
import re
from collections.abc import Iterable

#: names the generated kernels, references and tests use (modules, helpers, NKI vocabulary).
GENERATED_CODE_NAMES = frozenset({
    "nki", "nisa", "nl", "nc", "torch", "np", "numpy", "math", "os", "sys", "F", "kernel", "reference",
    "self", "cls", "pytest", "ml_dtypes", "jit", "baremetal", "simulate", "benchmark", "language", "isa",
    "sbuf", "psum", "hbm", "shared_hbm", "private_hbm", "ndarray", "tile", "par_dim", "affine_range",
    "sequential_range", "static_range", "arange", "mgrid", "program_id", "num_programs", "spmd_dim",
    "bfloat16", "float16", "float32", "float8_e4m3", "float8_e5m2", "int32", "dtype", "shape", "device",
    "grid", "args", "kwargs", "result", "results", "out_tensor", "plan", "LNC", "TILE", "P_MAX",
    "lnc", "target", "save", "TARGET", "MODEL", "MACHINES", "SBUF_BUDGET",  # host-function parameters
    "inf", "nan",  # would read as numbers, and specs allow only finite ones
})  # fmt: skip
#: every name a spec may not declare; mutable on purpose, so the code generator can add its own.
RESERVED_NAMES: set[str] = set(GENERATED_CODE_NAMES) | set(keyword.kwlist) | set(keyword.softkwlist)
RESERVED_NAMES |= {name for name in dir(builtins)}
#: longer names are surely not hand-written, and make generated lines unreadable.
MAX_NAME_LENGTH = 64
_IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def name_problem(name: str) -> str | None:
    """Why `name` may not be declared in a spec, or None if it may."""
    if name.startswith("_"):
        return "names starting with `_` are reserved for generated code"
    if not _IDENTIFIER.fullmatch(name):
        return "a name is an ASCII letter followed by letters, digits and `_`"
    if len(name) > MAX_NAME_LENGTH:
        return f"names are at most {MAX_NAME_LENGTH} characters"
    if name.startswith("d_"):
        return "names starting with `d_` are reserved: generated code spells dims that way"
    if name.lower().startswith("fusegen"):
        return "names starting with `fusegen` are reserved for generated code"
    if name in RESERVED_NAMES:
        return f"`{name}` is reserved: it is a Python keyword or builtin, or a name generated code uses"
    return None


def is_safe_identifier(name: str) -> bool:
    """Whether `name` is fit to appear in generated source (what the checker guarantees for the IR)."""
    return name_problem(name) is None


def did_you_mean(name: str, candidates: Iterable[str]) -> str | None:
    """A hint naming the closest candidate, if one is close."""
    close = difflib.get_close_matches(name, sorted(set(candidates)), n=1, cutoff=0.6)
    return f"did you mean `{close[0]}`?" if close else None
