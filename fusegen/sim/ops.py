"""Op constants (the values passed as `op=`), their torch formulas, and the nisa enums."""

from __future__ import annotations

import enum
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .errors import UnsupportedError, fault

Fn = Callable[..., torch.Tensor]


class Op:
    """An NKI op constant: fp32 formula, optional reduction, and whether it works on raw integer bits."""

    __slots__ = ("arity", "bitwise", "fn", "name", "reduce")

    def __init__(
        self, name: str, arity: int, fn: Fn, reduce: Fn | None = None, bitwise: bool = False
    ) -> None:
        self.name = name
        self.arity = arity
        self.fn = fn
        self.reduce = reduce
        self.bitwise = bitwise

    def __repr__(self) -> str:
        return f"nl.{self.name}"

    def __call__(self, *args: object, **kwargs: object) -> None:
        """nl.<op>(...) tile wrappers are not modelled."""
        raise fault(UnsupportedError, f"nl.{self.name}", "nl.* tile wrappers are not modelled; use nki.isa")


def _flag(fn: Fn) -> Fn:
    """Comparisons/logicals produce 1.0/0.0 in fp32."""
    return lambda a, b: fn(a, b).to(torch.float32)


def _reduce_flag(fn: Fn) -> Fn:
    """Logical reductions produce 1.0/0.0 in fp32."""
    return lambda x, dim: fn(x != 0, dim=dim).to(torch.float32)


_BINARY: dict[str, tuple[Fn, Fn | None]] = {
    "add": (torch.add, torch.sum),
    "subtract": (torch.sub, None),
    "multiply": (torch.mul, torch.prod),
    "divide": (torch.div, None),
    "maximum": (torch.maximum, torch.amax),
    "minimum": (torch.minimum, torch.amin),
    "power": (torch.pow, None),
    "abs_max": (lambda a, b: torch.maximum(a.abs(), b.abs()), lambda x, dim: x.abs().amax(dim=dim)),
    "abs_min": (lambda a, b: torch.minimum(a.abs(), b.abs()), lambda x, dim: x.abs().amin(dim=dim)),
    "equal": (_flag(torch.eq), None),
    "not_equal": (_flag(torch.ne), None),
    "greater": (_flag(torch.gt), None),
    "greater_equal": (_flag(torch.ge), None),
    "less": (_flag(torch.lt), None),
    "less_equal": (_flag(torch.le), None),
    "logical_and": (_flag(lambda a, b: (a != 0) & (b != 0)), _reduce_flag(torch.all)),
    "logical_or": (_flag(lambda a, b: (a != 0) | (b != 0)), _reduce_flag(torch.any)),
    "logical_xor": (_flag(lambda a, b: (a != 0) ^ (b != 0)), None),
    "fmod": (torch.fmod, None),
    "mod": (torch.remainder, None),
}
_BITWISE: dict[str, Fn] = {
    "bitwise_and": torch.bitwise_and,
    "bitwise_or": torch.bitwise_or,
    "bitwise_xor": torch.bitwise_xor,
    "left_shift": torch.bitwise_left_shift,
    "right_shift": torch.bitwise_right_shift,
}


def _sigmoid_gelu_dx(s: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """d/dx of x * sigmoid(1.702 x), given s = sigmoid(1.702 x)."""
    return s + 1.702 * x * s * (1 - s)


_UNARY: dict[str, Fn] = {
    "copy": lambda x: x,
    "bypass": lambda x: x,
    "square": torch.square,
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_apprx_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_apprx_sigmoid": lambda x: x * torch.sigmoid(1.702 * x),
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "reciprocal": torch.reciprocal,
    "relu": torch.relu,
    "abs": torch.abs,
    "sign": torch.sign,
    "negative": torch.neg,
    "softplus": F.softplus,
    "mish": F.mish,
    "erf": torch.erf,
    "sin": torch.sin,
    "cos": torch.cos,
    "tan": torch.tan,
    "arctan": torch.atan,
    "ceil": torch.ceil,
    "floor": torch.floor,
    "trunc": torch.trunc,
    "logical_not": lambda x: (x == 0).to(torch.float32),
    "erf_dx": lambda x: 2.0 / math.sqrt(math.pi) * torch.exp(-x * x),
    "silu_dx": lambda x: torch.sigmoid(x) * (1 + x * (1 - torch.sigmoid(x))),
    "gelu_dx": lambda x: (
        0.5 * (1 + torch.erf(x / math.sqrt(2))) + x * torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    ),
    "gelu_apprx_sigmoid_dx": lambda x: _sigmoid_gelu_dx(torch.sigmoid(1.702 * x), x),
}

OPS: dict[str, Op] = {
    **{name: Op(name, 2, fn, red) for name, (fn, red) in _BINARY.items()},
    **{name: Op(name, 2, fn, bitwise=True) for name, fn in _BITWISE.items()},
    **{name: Op(name, 1, fn) for name, fn in _UNARY.items()},
    "invert": Op("invert", 1, torch.bitwise_not, bitwise=True),
}


class engine(enum.Enum):
    """Neuron engines."""

    tensor = "tensor"
    vector = "vector"
    scalar = "scalar"
    gpsimd = "gpsimd"
    dma = "dma"
    sync = "sync"
    unknown = "unknown"


class reduce_cmd(enum.Enum):
    """Accumulation-register commands."""

    idle = "idle"
    reset = "reset"
    reduce = "reduce"
    reset_reduce = "reset_reduce"
    load_reduce = "load_reduce"


class dge_mode(enum.Enum):
    """DMA descriptor-generation modes."""

    unknown = "unknown"
    swdge = "swdge"
    hwdge = "hwdge"
    none = "none"


class oob_mode(enum.Enum):
    """Out-of-bounds handling of dynamic DMA accesses."""

    error = "error"
    skip = "skip"


class matmul_perf_mode(enum.Enum):
    """nc_matmul performance modes."""

    none = "none"
    double_row = "double_row"


class nc_version(enum.Enum):
    """NeuronCore generations."""

    gen2 = 2
    gen3 = 3
    gen4 = 4


class dma_engine(enum.Enum):
    """DMA transfer engines (sendrecv)."""

    dma = "dma"
    gpsimd_dma = "gpsimd_dma"
