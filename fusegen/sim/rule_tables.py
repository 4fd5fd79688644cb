"""The tables the rules of rules.py consult, as precomputed lookups (ALU operators and their engines,
activation functions, reduction ops, start partitions, free-size limits, LNC degrees); sources as in
rules.py."""

from __future__ import annotations

import math

import torch

BITVEC_OPS = frozenset({"invert", "bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift"})
ALU_UNARY = frozenset({"abs", "square", "relu", "rsqrt", "reciprocal"})
UNARY_IN_TENSOR_SCALAR = ALU_UNARY | {"invert"}  # take operand None or 0
ALU_OPS = (
    BITVEC_OPS
    | ALU_UNARY
    | frozenset(
        {  # SH tbl-aluop
            "add",
            "subtract",
            "multiply",
            "maximum",
            "minimum",
            "equal",
            "not_equal",
            "greater_equal",
            "greater",
            "less_equal",
            "less",
            "logical_and",
            "logical_or",
            "logical_xor",
            "power",
            "abs_max",
            "abs_min",
        }
    )
)
NOT_HARDWARE = frozenset({"divide", "mod", "fmod"})
REDUCE_LEGAL = frozenset(
    {  # SH 'Legal Reduction op' = Y
        "bitwise_and",
        "bitwise_or",
        "bitwise_xor",
        "add",
        "subtract",
        "multiply",
        "maximum",
        "minimum",
        "logical_and",
        "logical_or",
        "logical_xor",
    }
)
_V, _G, _S = "vector", "gpsimd", "scalar"
#: SH2.26 'Supported Engine'; ops the old table lacks (abs_max, abs_min, square, relu) assumed Vector
ALU_ENGINES: dict[str, frozenset[str]] = {
    **{op: frozenset({_V}) for op in ALU_OPS},
    "add": frozenset({_V, _G, _S}),
    "multiply": frozenset({_V, _G, _S}),
    "rsqrt": frozenset({_G, _S}),
    "reciprocal": frozenset({_V, _S}),
    "abs": frozenset({_V, _S}),
    "power": frozenset({_G}),
}
SCALAR_ENGINE_PAIRS = frozenset({("multiply", "add"), ("multiply", None), ("add", None)})
ACTIVATION_FUNCTIONS = frozenset(
    {  # SH tbl-act-func
        "copy",
        "square",
        "sigmoid",
        "relu",
        "prelu",
        "gelu",
        "gelu_dx",
        "gelu_apprx_tanh",
        "gelu_apprx_sigmoid",
        "gelu_apprx_sigmoid_dx",
        "silu",
        "silu_dx",
        "tanh",
        "softplus",
        "mish",
        "erf",
        "erf_dx",
        "exp",
        "log",
        "sin",
        "arctan",
        "sqrt",
        "rsqrt",
        "reciprocal",
        "sign",
        "abs",
    }
)
_PI = float(torch.tensor(math.pi, dtype=torch.float32))  # fp32(pi) > pi: the nearest a kernel can pass
#: SH tbl-act-func 'Valid Input Range' of the functions narrower than [-inf, inf]: (low, high, of |x|)
ACTIVATION_RANGES: dict[str, tuple[float, float, bool]] = {
    "log": (2.0**-64, 2.0**64, False),
    "sin": (-_PI, _PI, False),
    "arctan": (-_PI / 2, _PI / 2, False),
    "sqrt": (2.0**-116, 2.0**118, False),
    "rsqrt": (2.0**-87, 2.0**97, False),
    "reciprocal": (2.0**-42, 2.0**42, True),
}
FREE_SIZE_MAX = {"sbuf": 64 * 1024, "psum": 4 * 1024}  # elements per partition, Vector/Scalar engines
FREE_SIZE_ENGINES = frozenset({_V, _S})
#: view-dims: dims of an on-chip view (partition + 4 free, GUIDE), [step, num] pairs of an iota pattern (ISA)
MAX_VIEW_DIMS = 5
MAX_IOTA_PATTERN = 4
#: START_PARTITIONS[n]: legal start partitions of an operand spanning n partitions (ARCH2)
START_PARTITIONS: tuple[frozenset[int], ...] = tuple(
    frozenset({0}) if n > 64 else frozenset({0, 64}) if n > 32 else frozenset({0, 32, 64, 96})
    for n in range(129)
)
LNC_DEGREES = {2: (1,), 3: (1, 2), 4: (1, 2)}  # by NeuronCore version (LNC)
HWDGE_TRANSPOSE_ROWS = frozenset({1, 2, 4, 8, 16})
