"""An oracle for fuzzed specs that never goes through fusegen: expression trees that print as spec text and
evaluate as torch math, in float64 with an error radius, or in float32.

The radius bounds how far a correct f32 kernel may be from the exact value of the spec's math (with its
casts): every f32 operation rounds (u = 2**-24 of its result; a few u for transcendentals, whose f32
implementations are not correctly rounded; a sum of n terms n·u of the sum of their magnitudes, in any order),
a cast to bf16/f16 rounds the kernel's value and the oracle's independently (each half an ulp of the cast
dtype, or half its subnormal step below its smallest normal), and each operation carries its operands' radii
through (a function over the interval [v - r, v + r], at its ends and inner extrema). So the bound scales with
the magnitude of the terms, not of the result: cancellation widens it, and an element whose radius is not
finite has no answer to check.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

F32_U = 2.0**-24
#: unit roundoff (half an ulp, relative) by dtype name
UNIT = {"bf16": 2.0**-8, "f16": 2.0**-11, "f32": F32_U, "fp8_e4m3": 2.0**-4, "fp8_e5m2": 2.0**-3}
#: the spacing of a dtype's subnormals: below its smallest normal a rounding errs by up to half of it,
#: absolute, whatever the value (f16's 2**-24 is 0.01 of a value near 6e-6, not 2**-11)
SUBNORMAL_STEP = {"bf16": 2.0**-133, "f16": 2.0**-24, "f32": 2.0**-149, "fp8_e4m3": 2.0**-9,
                  "fp8_e5m2": 2.0**-16}  # fmt: skip
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32, "fp8_e4m3": torch.float8_e4m3fn,
          "fp8_e5m2": torch.float8_e5m2}  # fmt: skip
#: below the smallest normal f32 an operation may flush to zero: an absolute slack per operation
F32_TINY = 1.1754944e-38
#: an f32 sum whose terms' magnitudes add past this may overflow in another order: no bound
F32_MAX = 3.4028235e38

#: name -> (torch function, rounding slack in u, inner extrema)
UNARY: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], float, tuple[float, ...]]] = {
    "neg": (torch.neg, 0, ()),
    "abs": (torch.abs, 0, (0.0,)),
    "relu": (F.relu, 0, ()),
    "sign": (torch.sign, 0, ()),
    "square": (torch.square, 1, (0.0,)),
    "exp": (torch.exp, 4, ()),
    "log": (torch.log, 4, ()),
    "sqrt": (torch.sqrt, 4, ()),
    "rsqrt": (torch.rsqrt, 4, ()),
    "sigmoid": (torch.sigmoid, 4, ()),
    "tanh": (torch.tanh, 4, ()),
    "silu": (F.silu, 6, (-1.2784645,)),
    "gelu": (F.gelu, 6, (-0.7517916,)),
    "gelu_tanh": (lambda v: F.gelu(v, approximate="tanh"), 6, (-0.7522,)),
}
#: functions formed as x * (1 + erf or tanh of x) / 2: for x < 0 the sum cancels, and f32 gets them right to
#: a few u of |x|, not of the result (torch's f32 gelu is 4.2 u|x| off at worst on a 2e-6 grid of
#: [-12, 12], gelu_tanh 1.8 u|x|; far in the tail their results are ~1e-7 of |x|, all rounding)
INPUT_SLACK = {"gelu": 6.0, "gelu_tanh": 6.0}
ELEMENTWISE: dict[str, Callable[..., torch.Tensor]] = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "maximum": torch.maximum,
    "minimum": torch.minimum,
}  # fmt: skip
BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/", "maximum": "maximum", "minimum": "minimum"}


@dataclass(frozen=True, eq=False)
class Node:
    """One value of a spec's math: `text` is how the spec writes it; `kind` its shape (row [T, H], col
    [T, 1], vec [H], scalar); `sign` what is known of it (pos, nonneg, any)."""

    op: str
    args: tuple[Node, ...]
    text: str
    kind: str
    sign: str = "any"
    const: object = None  # a literal's value, a power's exponent, a cast's dtype, clamp bounds, a name
    key: int = field(default=0)


Pair = tuple[torch.Tensor, torch.Tensor | None]


def _unless_overflow(radius: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    """`radius`, or inf where partial sums may pass f32's range (another order may overflow)."""
    return torch.where(magnitude < F32_MAX, radius, torch.full_like(radius, math.inf))


def _slicer(const: tuple[int, int, int]) -> Callable[[torch.Tensor], torch.Tensor]:
    """A function taking positions start:stop of one axis."""
    axis, start, stop = const
    return lambda t: t.narrow(axis, start, stop - start)


class Evaluator:
    """Evaluates nodes over `env` (name -> tensor or float) in `dtype`; in float64 also the error radius."""

    def __init__(self, env: dict[str, torch.Tensor | float], dtype: torch.dtype,
                 radius: bool | None = None) -> None:  # fmt: skip
        self.env = env
        self.dtype = dtype
        self.radius = dtype == torch.float64 if radius is None else radius
        self.memo: dict[int, Pair] = {}

    def __call__(self, node: Node) -> Pair:
        """The node's value and radius (None in float32)."""
        if id(node) not in self.memo:
            self.memo[id(node)] = self._eval(node)
        return self.memo[id(node)]

    def _t(self, value: float) -> torch.Tensor:
        return torch.tensor(value, dtype=self.dtype)

    def _eval(self, n: Node) -> Pair:
        if n.op == "in":
            value = self.env[str(n.const)]
            assert isinstance(value, torch.Tensor)
            return value.to(self.dtype), self._zero(value)
        if n.op in ("param", "lit"):  # the kernel holds them as f32 immediates
            v = self._t(float(self.env[str(n.const)]) if n.op == "param" else float(n.const))  # type: ignore[arg-type]
            return v, self._round(v, F32_U)
        if n.op == "ref":
            return self(n.args[0])
        if n.op in UNARY:
            return self.unary(n.op, self(n.args[0]))
        if n.op == "pow":
            e = float(n.const)  # type: ignore[arg-type]
            return self.apply(lambda v: torch.pow(v, e), self(n.args[0]), 4, (0.0,) if e > 0 else ())
        if n.op in BINARY:
            return self.binary(n.op, self(n.args[0]), self(n.args[1]))
        if n.op in ("sum", "mean", "max"):
            return self.reduce(n.op, self(n.args[0]))
        if n.op == "cast":
            return self.cast(str(n.const), self(n.args[0]))
        if n.op == "clamp":  # the value (and gradient: whole at a bound, docs/autodiff.md) of torch.clamp
            x = p = self(n.args[0])
            for op, bound in zip(("maximum", "minimum"), n.const, strict=True):  # type: ignore[call-overload]
                if bound is not None:
                    p = self.binary(op, p, (self._t(bound), self._round(self._t(bound), F32_U)))
            return torch.clamp(x[0], *n.const), p[1]  # type: ignore[misc]
        if n.op == "where":
            return self.where(*(self(a) for a in n.args))
        if n.op == "rmsnorm":
            return self.rmsnorm(n)
        if n.op == "layernorm":
            return self.layernorm(n)
        if n.op == "mm":
            return self.matmul(self(n.args[0]), self(n.args[1]))
        if n.op in ("slice", "unsq"):  # `kv[:, 0:G, :]`, `h[:, 0:N]` (axis, start, stop); `c[:, :, None]`
            v, r = self(n.args[0])
            pick = _slicer(n.const) if n.op == "slice" else lambda t: t.unsqueeze(-1)  # type: ignore[arg-type]
            return pick(v), None if r is None else pick(r)
        raise ValueError(f"no oracle for {n.op}")

    # ---- radius helpers ------------------------------------------------------------------------------

    def _zero(self, v: torch.Tensor) -> torch.Tensor | None:
        return torch.zeros(v.shape, dtype=torch.float64) if self.radius else None

    def _round(self, v: torch.Tensor, u: float) -> torch.Tensor | None:
        """The radius of one rounding of `v` (relative u, plus f32 flush-to-zero slack)."""
        return v.abs() * u + F32_TINY if self.radius else None

    def _finish(self, v: torch.Tensor, r: torch.Tensor | None) -> Pair:
        """Non-finite values are what they are (checked for equality); a NaN radius means no bound."""
        if r is None:
            return v, None
        r = torch.where(v.isfinite(), torch.nan_to_num(r, nan=math.inf, posinf=math.inf), torch.zeros_like(r))
        return v, r

    def apply(self, f: Callable[[torch.Tensor], torch.Tensor], p: Pair, slack: float,
              extrema: tuple[float, ...], input_slack: float = 0.0) -> Pair:  # fmt: skip
        """f over the interval of `p`: its value, and the widest change at the interval's ends and extrema;
        `slack` u of the result and `input_slack` u of the argument for f's own rounding."""
        v, r = p
        out = f(v)
        if r is None:
            return out, None
        spread = torch.maximum((f(v - r) - out).abs(), (f(v + r) - out).abs())
        for x in extrema:
            inside = (v - r <= x) & (x <= v + r)
            spread = torch.where(inside, torch.maximum(spread, (f(self._t(x)) - out).abs()), spread)
        own = slack * F32_U * out.abs() + input_slack * F32_U * (v.abs() + r)
        return self._finish(out, spread + own + F32_TINY)

    def unary(self, name: str, p: Pair) -> Pair:
        """An elementwise function."""
        f, slack, extrema = UNARY[name]
        return self.apply(f, p, slack, extrema, INPUT_SLACK.get(name, 0.0))

    def binary(self, name: str, p: Pair, q: Pair) -> Pair:
        """An elementwise binary op, broadcasting."""
        (a, ra), (b, rb) = p, q
        out = ELEMENTWISE[name](a, b)
        if ra is None or rb is None:
            return out, None
        if name in ("add", "sub"):
            r = ra + rb + out.abs() * F32_U
        elif name == "mul":
            r = a.abs() * rb + b.abs() * ra + ra * rb + out.abs() * F32_U
        elif name == "div":  # a reciprocal, then a product: two roundings
            margin = b.abs() - rb
            r = (a.abs() * rb + b.abs() * ra) / (b.abs() * margin) + out.abs() * 2 * F32_U
            r = torch.where(margin > 0, r, torch.full_like(r, math.inf))
        else:
            r = torch.maximum(ra, rb) + torch.zeros_like(out)
        return self._finish(out, r + F32_TINY)

    def reduce(self, name: str, p: Pair) -> Pair:
        """sum/mean/max over the last axis, keeping it."""
        v, r = p
        n = v.shape[-1]
        if name == "max":
            return v.amax(-1, keepdim=True), None if r is None else r.amax(-1, keepdim=True)
        out = v.sum(-1, keepdim=True)
        mag = v.abs().sum(-1, keepdim=True)
        rs = None if r is None else _unless_overflow(r.sum(-1, keepdim=True) + n * F32_U * mag, mag)
        if name == "mean":
            out = out / n
            rs = None if rs is None else rs / n + out.abs() * 2 * F32_U
        return self._finish(out, rs)

    def cast(self, dtype: str, p: Pair) -> Pair:
        """Round to `dtype`: the kernel's value and the oracle's round independently."""
        v, r = p
        out = v.to(DTYPES[dtype]).to(self.dtype)
        if r is None:
            return out, None
        return self._finish(out, r + UNIT[dtype] * (2 * v.abs() + r) + SUBNORMAL_STEP[dtype] + F32_TINY)

    def where(self, a: Pair, b: Pair, c: Pair, d: Pair) -> Pair:
        """where(a > b, c, d): a comparison its radii cannot settle may take either branch."""
        out = torch.where(a[0] > b[0], c[0], d[0])
        if a[1] is None or b[1] is None or c[1] is None or d[1] is None:
            return out, None
        settled = (a[0] - b[0]).abs() > a[1] + b[1] + 2 * F32_U * (a[0].abs() + b[0].abs())
        chosen = torch.where(a[0] > b[0], c[1], d[1])
        either = torch.maximum(c[1], d[1]) + (c[0] - d[0]).abs()
        return self._finish(out, torch.where(settled, chosen, either))

    def matmul(self, p: Pair, q: Pair) -> Pair:
        """[M, K] @ [K, N] accumulated in f32 (products of bf16 values are exact in f32)."""
        (a, ra), (b, rb) = p, q
        out = a @ b
        if ra is None or rb is None:
            return out, None
        k = a.shape[-1]
        mag = a.abs() @ b.abs()
        return self._finish(
            out, _unless_overflow(ra @ b.abs() + a.abs() @ rb + k * F32_U * mag + F32_TINY, mag)
        )

    def _norm_args(self, n: Node) -> tuple[Pair, Pair, list[Pair]]:
        x, eps, *affine = (self(a) for a in n.args)
        return x, eps, affine

    def rmsnorm(self, n: Node) -> Pair:
        """x * rsqrt(mean(x²) + eps) [* gamma], as torch's RMSNorm."""
        x, eps, affine = self._norm_args(n)
        ms = self.binary("add", self.reduce("mean", self.unary("square", x)), eps)
        y = self.binary("mul", x, self.unary("rsqrt", ms))
        return self.binary("mul", y, affine[0]) if affine else y

    def layernorm(self, n: Node) -> Pair:
        """(x - mean) * rsqrt(mean((x - mean)²) + eps) [* gamma [+ beta]], as F.layer_norm (biased)."""
        x, eps, affine = self._norm_args(n)
        c = self.binary("sub", x, self.reduce("mean", x))
        var = self.binary("add", self.reduce("mean", self.unary("square", c)), eps)
        y = self.binary("mul", c, self.unary("rsqrt", var))
        for op, a in zip(("mul", "add"), affine, strict=False):
            y = self.binary(op, y, a)
        return y
