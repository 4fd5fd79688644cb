"""Argument checks at the torch boundary, copied into every generated kernel file and ops.py.

A generated host function or op calls `_door` before any kernel runs: every tensor against its spec
declaration (type, dtype, rank, one device, each dim against the value bound from the dim's first plain
use, fixed dims), every `require` line, the scalar params, the target and the LNC degree. A call with a
zero-size dim returns its empty outputs (zeros, for a backward's sums over the rows) without a launch.
The declarations are literals the code generator derives from the IR (codegen/signature.py); this code
only interprets them. Standard library and torch only: generated files never import fusegen.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypeVar

    _Plan = TypeVar("_Plan")


class _Decl(NamedTuple):
    """A declared tensor: name, torch dtype name, dims as spec text (`T`, `HC + 1`, `2*I`); optional outputs
    come back only with save=True; a `finite` input must hold no inf or nan; a `transposed` one neither on
    the targets whose Tensor-engine transpose is no exact copy (_Signature.inexact_transpose)."""

    name: str
    dtype: str
    shape: tuple[str, ...]
    optional: bool = False
    finite: bool = False
    transposed: bool = False


class _Require(NamedTuple):
    """A `require` line, `expr % modulus op rhs` (modulus 0: none), with its spec text for messages."""

    text: str
    expr: str
    modulus: int
    op: str
    rhs: int


class _Domain(NamedTuple):
    """A scalar the kernel forms from the params alone when traced, and what it must be: `value` computes it
    (from the params as floats, as the kernel's trace does), `need` is "!= 0" (a divisor), "> 0" (rsqrt, a
    negative power), ">= 0" (sqrt, a fractional power) or "f32" (an immediate the kernel computes with: within
    f32 range unless a param is inf or nan); `text` and `line` say where the spec forms it."""

    text: str
    need: str
    line: int
    value: "Callable[[tuple[float, ...]], float]"  # noqa: UP037 (ops.py copies this and imports no Callable)


class _Signature(NamedTuple):
    """What one generated host function or op accepts and returns, from its spec."""

    name: str
    inputs: tuple[_Decl, ...]
    params: tuple[str, ...]
    fixed: tuple[tuple[str, int], ...]
    requires: tuple[_Require, ...]
    outputs: tuple[_Decl, ...]
    targets: tuple[tuple[str, int], ...]  # (target the host plans for, its largest LNC degree)
    sums: bool = False  # outputs sum over the rows (a backward): a call without rows gives zeros
    domains: tuple[_Domain, ...] = ()  # scalars of the params the kernel's trace forms and needs defined
    inexact_transpose: tuple[str, ...] = ()  # targets whose PE transpose is an identity matmul (0 x inf: nan)


_Env = dict[str, int]  # bound dims
_Outputs = torch.Tensor | tuple[torch.Tensor, ...]


_COMPARE = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
}  # fmt: skip


def _prod(values: list[int] | tuple[int, ...]) -> int:
    """The product of `values` (1 for none)."""
    total = 1
    for v in values:
        total *= v
    return total


def _factors(expr: str) -> list[tuple[int, list[str]]]:
    """A dim polynomial as printed by the IR (`HC + 1`, `2*I - 1`) as (coefficient, symbols) terms."""
    terms = []
    for term in expr.replace(" - ", " + -").split(" + "):
        sign = -1 if term.startswith("-") else 1
        parts = term.lstrip("-").split("*")
        coef = _prod([int(p) for p in parts if p.isdigit()])
        terms.append((sign * coef, [p for p in parts if not p.isdigit()]))
    return terms


def _symbols(expr: str) -> list[str]:
    """The dim names an expression mentions, in order of first mention."""
    return list(dict.fromkeys(s for _, names in _factors(expr) for s in names))


def _value(expr: str, env: _Env) -> int | None:
    """The expression's value under `env`, or None when a dim it mentions is unbound."""
    if any(s not in env for s in _symbols(expr)):
        return None
    return sum(coef * _prod([env[s] for s in names]) for coef, names in _factors(expr))


def _size(expr: str, env: _Env) -> int:
    """The value of an expression over bound dims only."""
    value = _value(expr, env)
    assert value is not None, expr
    return value


def _plain(expr: str) -> str | None:
    """The dim name when the expression is just one (`T`), else None."""
    return expr if expr.isidentifier() else None


def _door(sig: _Signature, tensors: tuple[torch.Tensor, ...], params: tuple[float, ...], save: bool = False,
          lnc: int | None = None, target: str | None = None, default_lnc: int = 1, cast: bool = False
          ) -> tuple[tuple[torch.Tensor, ...], tuple[float, ...], int | None, _Outputs | None]:  # fmt: skip
    """Check a call against its spec: (its tensors made dense, its params as Python floats, the LNC to launch
    with, None or the outputs of a call with a zero-size dim). cast: the op's check, which takes any floating
    dtype (it casts) but fp8, which only as declared."""
    _check_tensors(sig, tensors, cast)
    env, source = _bind(sig, tensors)
    zero = [name for name, value in env.items() if value == 0]
    _check_requires(sig, env, source, zero)  # first: `K % 128` says more than a K mismatch further on
    _check_shapes(sig, tensors, env, source)
    if not cast:  # the op's check also runs on fake tensors, which hold no values
        _check_finite(sig, tensors, target)
    _check_params(sig, params)
    _check_domains(sig, params)
    lnc = _check_launch(sig, lnc, target, default_lnc)
    empty = _empty_outputs(sig, env, zero, save, tensors[0].device) if zero else None
    # floats, as the op's schema makes them: the kernel's trace takes Python numbers as immediates, not a
    # numpy scalar or a Fraction (which pass the check as real numbers)
    return tuple(t.contiguous() for t in tensors), tuple(float(p) for p in params), lnc, empty


def _check_tensors(sig: _Signature, tensors: tuple[torch.Tensor, ...], cast: bool) -> None:
    """Type, dtype, rank and device of every tensor argument; no autograd graph through a host function."""
    for decl, t in zip(sig.inputs, tensors, strict=True):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{sig.name}: {decl.name}: expected a torch.Tensor [{', '.join(decl.shape)}], "
                            f"got {type(t).__name__}")  # fmt: skip
        if t.layout != torch.strided or t.is_nested:  # kernels read dense memory; .contiguous() keeps these
            layout = "nested" if t.is_nested else str(t.layout).removeprefix("torch.")
            raise TypeError(f"{sig.name}: {decl.name}: expected a dense (strided) tensor, got a {layout} "
                            "one: pass .to_dense()")  # fmt: skip
        want = getattr(torch, decl.dtype)
        if cast and not t.dtype.is_floating_point:
            raise TypeError(f"{sig.name}: {decl.name}: expected a floating-point tensor (cast to {want}), "
                            f"got {t.dtype}")  # fmt: skip
        if cast and want.itemsize == 1 and t.dtype != want:  # fp8: narrowing to it saturates and flushes
            raise TypeError(f"{sig.name}: {decl.name}: expected dtype {want} (an fp8 input is a weight "
                            f"quantised with its scales: the op casts none), got {t.dtype}")  # fmt: skip
        if not cast and t.dtype != want:
            raise TypeError(f"{sig.name}: {decl.name}: expected dtype {want}, got {t.dtype}")
        if t.dim() != len(decl.shape):
            raise ValueError(f"{sig.name}: {decl.name}: expected {len(decl.shape)} dims "
                             f"[{', '.join(decl.shape)}], got {t.dim()}: {list(t.shape)}"
                             f"{_fold_hint(sig, decl, t.dim())}")  # fmt: skip
        if t.device != tensors[0].device:
            raise ValueError(f"{sig.name}: {decl.name} is on {t.device} but {sig.inputs[0].name} on "
                             f"{tensors[0].device}: pass every tensor on one device")  # fmt: skip
    if cast:
        return
    if tensors[0].device.type == "meta":
        raise ValueError(f"{sig.name}: no backend for device meta: a host function runs its kernel on CPU "
                         "tensors (fusegen's interpreter) or on a Neuron device")  # fmt: skip
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        raise RuntimeError(f"{sig.name} is inference-only (a host function records no autograd graph): an "
                           "input requires grad; call it under torch.no_grad(), or train through "
                           "torch.ops.fusegen")  # fmt: skip


def _check_finite(sig: _Signature, tensors: tuple[torch.Tensor, ...], target: str | None) -> None:
    """Inputs declared `finite`, and on some targets those the kernel transposes, hold no inf or nan: their
    rows may pass through the Tensor engine, where one such element would spoil the other tokens of its
    tile (plan.md says where)."""
    for decl, t in zip(sig.inputs, tensors, strict=True):
        inexact = decl.transposed and target in sig.inexact_transpose
        if (decl.finite or inexact) and t.numel() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            why = ("the spec declares it `finite`: pass finite values, or drop `finite` from its input line "
                   "and rebuild (rows are then kept apart, at some speed)") if decl.finite else (
                   f"on {target} the kernel transposes its rows on the Tensor engine, an identity matmul "
                   "there (0 x inf = nan would spread each to the other rows of its 128-row tile): pass "
                   "finite values, or run on a later target")  # fmt: skip
            raise ValueError(f"{sig.name}: {decl.name} holds {bad} inf or nan element(s), but {why}")


def _fold_hint(sig: _Signature, decl: _Decl, rank: int) -> str:
    """How to fold extra leading dims into the rows (a [batch, seq, hidden] x for [T, H]), for a tensor whose
    first axis is the rows; else nothing."""
    extra = rank - len(decl.shape)
    rows = sig.inputs[0].shape[0]
    if extra <= 0 or not decl.shape or decl.shape[0] != rows or not rows.isidentifier():
        return ""
    return f"; fold the extra leading dims into {rows}: {decl.name}.flatten(0, {extra})"


def _bind(sig: _Signature, tensors: tuple[torch.Tensor, ...]) -> tuple[_Env, dict[str, str]]:
    """Each dim's value and where it came from: fixed by the spec (""), else its first plain use."""
    env: _Env = dict(sig.fixed)
    source = dict.fromkeys(env, "")
    for decl, t in zip(sig.inputs, tensors, strict=True):
        for expr, size in zip(decl.shape, t.shape, strict=True):
            name = _plain(expr)
            if name is not None and name not in env:
                env[name], source[name] = size, decl.name
    solving = True
    while solving:  # then dims inside compound axes (`2*D`, `NQ + 2*NKV`), each once the rest are bound
        solving = False
        for decl, t in zip(sig.inputs, tensors, strict=True):
            for expr, size in zip(decl.shape, t.shape, strict=True):
                try:
                    solved = _solve(expr, size, env)
                except ValueError as err:
                    raise ValueError(f"{sig.name}: {decl.name}: {err}") from None
                if solved is not None:
                    env[solved[0]], source[solved[0]] = solved[1], decl.name
                    solving = True
    return env, source


def _solve(expr: str, size: int, env: _Env) -> tuple[str, int] | None:
    """(dim, value) when `expr` is `coef*dim + terms over bound dims`, for an axis of `size`; None when it is
    not (the shape check then compares). A size no whole dim gives names the axis."""
    unbound = [s for s in _symbols(expr) if s not in env]
    terms = [(coef, names) for coef, names in _factors(expr) if unbound and unbound[0] in names]
    if len(unbound) != 1 or len(terms) != 1 or terms[0][1] != unbound or terms[0][0] <= 0:
        return None
    coef = terms[0][0]
    rest = sum(c * _prod([env[s] for s in names]) for c, names in _factors(expr) if unbound[0] not in names)
    if (size - rest) % coef or size < rest:
        raise ValueError(f"axis `{expr}` has size {size}, which no whole `{unbound[0]}` gives")
    return unbound[0], (size - rest) // coef


def _check_shapes(sig: _Signature, tensors: tuple[torch.Tensor, ...], env: _Env, source: dict[str, str]
                  ) -> None:  # fmt: skip
    """Every dim of every tensor equals its declaration under the bound dims."""
    for decl, t in zip(sig.inputs, tensors, strict=True):
        for expr, size in zip(decl.shape, t.shape, strict=True):
            want = _value(expr, env)
            if want is not None and size != want:
                raise ValueError(f"{sig.name}: {decl.name}: expected {_expected(decl, env, source)}, "
                                 f"got {list(t.shape)}")  # fmt: skip


def _origin(source: str) -> str:
    return f"from {source}" if source else "fixed by the spec"


def _expected(decl: _Decl, env: _Env, source: dict[str, str]) -> str:
    """`[K=256, I] (K from x)`: dims bound by other arguments (or the spec) with their values."""
    parts: list[str] = []
    origins: dict[str, list[str]] = {}
    for expr in decl.shape:
        names = _symbols(expr)
        if names and all(source.get(s, decl.name) != decl.name for s in names):
            parts.append(f"{expr.replace(' ', '')}={_value(expr, env)}")
            for s in names:
                origins.setdefault(source[s], []).append(s)
        else:
            parts.append(expr)
    notes = [f"{', '.join(dict.fromkeys(names))} {_origin(src)}" for src, names in origins.items()]
    return f"[{', '.join(parts)}]" + (f" ({'; '.join(notes)})" if notes else "")


def _check_requires(sig: _Signature, env: _Env, source: dict[str, str], zero: list[str]) -> None:
    """Every `require` line over the bound dims; lines about a zero-size dim describe launches, so an
    empty call skips them."""
    for req in sig.requires:
        names = _symbols(req.expr)
        if any(s not in env or s in zero for s in names):
            continue
        value = _size(req.expr, env)
        if not _COMPARE[req.op](value % req.modulus if req.modulus else value, req.rhs):
            got = ", ".join(f"{s}={env[s]} ({_origin(source[s])})" for s in names)
            raise ValueError(f"{sig.name}: requires {req.text}, got {got}")


def _check_params(sig: _Signature, params: tuple[float, ...]) -> None:
    """Scalar params are real numbers within f32 range (kernels take fp32 immediates; inf, nan pass)."""
    import math  # here, not from the generated module's globals, which spec names share
    import numbers

    largest = torch.finfo(torch.float32).max
    for name, value in zip(sig.params, params, strict=True):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            # a tensor would be a constant of the kernel that no gradient reaches: say so
            hint = f": the kernel takes {name} as a constant (no gradient); pass float({name})"
            raise TypeError(f"{sig.name}: {name}: expected a number, got {type(value).__name__} {value!r}"
                            f"{hint if isinstance(value, torch.Tensor) else ''}")  # fmt: skip
        try:
            past = math.isfinite(float(value)) and abs(float(value)) > largest
        except OverflowError:  # an integer too large for a float
            past = True
        if past:
            raise ValueError(f"{sig.name}: {name}: {value!r} is outside the f32 range of the spec's params "
                             f"(|{name}| <= {largest:.8g}); pass inf for an infinite value")  # fmt: skip


def _check_domains(sig: _Signature, params: tuple[float, ...]) -> None:
    """Each scalar the kernel forms from the params when traced is defined there (NKI traces Python floats:
    `1.0 / 0.0` or `0.0 ** -0.5` raise, a negative `** 0.5` is complex), inner ones first, and each immediate
    it computes with fits f32 (a * a = 1e40 from a = 1e20 became inf, a silent overflow); nan passes."""
    import math  # here, not from the generated module's globals, which spec names share

    values = tuple(float(p) for p in params)
    for dom in sig.domains:
        try:
            value = dom.value(values)
        except ArithmeticError as err:
            raise ValueError(f"{sig.name}: {dom.text} (spec line {dom.line}) cannot be formed from "
                             f"{_listed(sig, values)}: {err}") from None  # fmt: skip
        if dom.need == "f32":  # an inf or nan param makes its inf or nan immediates the caller's intent
            largest = torch.finfo(torch.float32).max
            if abs(value) > largest and all(math.isfinite(v) for v in values):
                raise ValueError(f"{sig.name}: the kernel computes with {dom.text} (spec line {dom.line}), "
                                 f"which is {value:.8g} from {_listed(sig, values)}: outside the f32 range "
                                 f"(|value| <= {largest:.8g}), where it would be inf")  # fmt: skip
        elif value == 0 if dom.need == "!= 0" else value <= 0 if dom.need == "> 0" else value < 0:
            raise ValueError(f"{sig.name}: the kernel needs {dom.text} {dom.need} (spec line {dom.line}), "
                             f"got {value!r} from {_listed(sig, values)}")  # fmt: skip


def _listed(sig: _Signature, values: tuple[float, ...]) -> str:
    return ", ".join(f"{name}={value!r}" for name, value in zip(sig.params, values, strict=True))


def _check_launch(sig: _Signature, lnc: int | None, target: str | None, default_lnc: int) -> int | None:
    """The target is one the host plans for; the LNC degree one it has (default: `default_lnc`, capped at
    the target's: trn1 has no logical cores)."""
    import numbers  # here, not from the generated module's globals, which spec names share

    if target is None:  # an op: the host function it calls checks its own launch
        return lnc
    degrees = dict(sig.targets)
    if not isinstance(target, str) or target not in degrees:
        raise ValueError(f"{sig.name}: target={target!r} is not a target it plans for; known targets: "
                         f"{', '.join(degrees)}")  # fmt: skip
    if lnc is None:
        if default_lnc < 1:  # the host's default, from NEURON_LOGICAL_NC_CONFIG when set
            raise ValueError(f"{sig.name}: the default LNC {default_lnc} (NEURON_LOGICAL_NC_CONFIG) is not a "
                             "degree: set it to 1 or 2, or pass lnc=")  # fmt: skip
        return min(default_lnc, degrees[target])
    if isinstance(lnc, bool) or not isinstance(lnc, numbers.Integral):
        raise TypeError(f"{sig.name}: lnc: expected an int, got {type(lnc).__name__} {lnc!r}")
    if not 1 <= lnc <= degrees[target]:
        has = "no logical cores (lnc=1 only)" if degrees[target] == 1 else f"lnc 1 to {degrees[target]}"
        raise ValueError(f"{sig.name}: lnc={lnc} is not available on {target}, which has {has}")
    return int(lnc)


def _planned(sig: _Signature, choose: "Callable[..., _Plan]", *args: object) -> "_Plan":  # noqa: UP037
    """`choose(*args)`, the copied planner, with its refusal (no plan fits these dims) naming the kernel: in a
    model of many ops, "no tile plan fits: width 30000" alone does not say which one."""
    try:
        return choose(*args)
    except ValueError as err:
        raise ValueError(f"{sig.name}: {err}") from None


def _empty_outputs(sig: _Signature, env: _Env, zero: list[str], save: bool, device: torch.device) -> _Outputs:
    """The outputs of a call with a zero-size dim: empty, or zero where a backward sums over no rows."""
    outputs = [o for o in sig.outputs if save or not o.optional]
    shapes = [tuple(_size(expr, env) for expr in o.shape) for o in outputs]
    full = [o.name for o, shape in zip(outputs, shapes, strict=True) if _prod(shape)]
    if full and not sig.sums:
        dims = ", ".join(f"{name}=0" for name in zero)
        raise ValueError(f"{sig.name}: {dims} leaves output {full[0]} non-empty: the kernel needs "
                         f"{' and '.join(zero)} >= 1")  # fmt: skip
    made = tuple(torch.zeros(shape, dtype=getattr(torch, o.dtype), device=device)
                 for o, shape in zip(outputs, shapes, strict=True))  # fmt: skip
    return made[0] if len(made) == 1 else made
