"""Which identifiers a spec may declare: names reach generated Python and NKI source, so they are vetted.

A spec is untrusted input. Every name it declares becomes a Python identifier in generated code, so it
must be a plain ASCII identifier that is not a keyword or builtin. Generated code keeps its own names out
of the spec's reach: everything it defines at module level is spelled `_<name>` (a spec name never starts
with `_`), dims and gradients are `d_<name>`, and a spec name appears bare only in public signatures (host
function, op, reference), elsewhere tagged by its role (`x_hbm`, `eps_arg`). What stays reserved is the
public vocabulary generated modules import or expose (GENERATED_CODE_NAMES).
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
    "functools",
    "self", "cls", "pytest", "ml_dtypes", "jit", "baremetal", "simulate", "benchmark", "language", "isa",
    "sbuf", "psum", "hbm", "shared_hbm", "private_hbm", "ndarray", "tile", "par_dim", "affine_range",
    "sequential_range", "static_range", "arange", "mgrid", "program_id", "num_programs", "spmd_dim",
    "bfloat16", "float16", "float32", "float8_e4m3", "float8_e5m2", "int32", "dtype", "shape", "device",
    "grid", "args", "kwargs", "result", "results", "out_tensor", "plan", "TILE", "P_MAX",
    "lnc", "target", "save",  # host-function parameters
    "inf", "nan",  # would read as numbers, and specs allow only finite ones
})  # fmt: skip
#: the spec language's own keywords (grammar.lark): `output = ...` would not parse as an assignment.
SPEC_KEYWORDS = frozenset(
    {"kernel", "dim", "require", "input", "param", "output", "optional", "check", "true", "false"}
)
#: every name a spec may not declare; mutable on purpose, so the code generator can add its own.
RESERVED_NAMES: set[str] = set(GENERATED_CODE_NAMES) | set(keyword.kwlist) | set(keyword.softkwlist)
RESERVED_NAMES |= SPEC_KEYWORDS
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
        return (
            f"`{name}` is reserved: it is a spec or Python keyword, a Python builtin, or a name generated "
            "code uses"
        )
    return None


def is_safe_identifier(name: str) -> bool:
    """Whether `name` is fit to appear in generated source (what the checker guarantees for the IR)."""
    return name_problem(name) is None


def did_you_mean(name: str, candidates: Iterable[str]) -> str | None:
    """A hint naming the closest candidate, if one is close."""
    pool = sorted(set(candidates))
    same = [c for c in pool if c.lower() == name.lower()]  # `t` for `T`: too short for difflib's ratio
    close = same or difflib.get_close_matches(name, pool, n=1, cutoff=0.6)
    return f"did you mean `{close[0]}`?" if close else None
