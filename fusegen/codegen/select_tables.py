"""What instruction selection emits with: NKI names per IR op, per-call costs, and the Scalar/Vector load
balance (`EngineLoad`) that decides where a per-row affine step runs."""

from __future__ import annotations

from dataclasses import dataclass, field

#: Scalar-engine activation functions by stage op name.
ACTIVATIONS = {
    "silu": "nl.silu",
    "gelu": "nl.gelu",
    "gelu_tanh": "nl.gelu_apprx_tanh",
    "erf": "nl.erf",  # backward IR only: exact gelu's derivative (autodiff.py)
    "relu": "nl.relu",
    "sigmoid": "nl.sigmoid",
    "tanh": "nl.tanh",
    "exp": "nl.exp",
    "log": "nl.log",
    "sqrt": "nl.sqrt",
    "rsqrt": "nl.rsqrt",
    "abs": "nl.abs",
    "sign": "nl.sign",
    "square": "nl.square",
}
#: ALU comparisons (1.0 where true, else 0.0): tensor_scalar / tensor_tensor only, not arithmetic chains.
COMPARISONS = {
    "eq": "nl.equal",
    "ne": "nl.not_equal",
    "gt": "nl.greater",
    "ge": "nl.greater_equal",
    "lt": "nl.less",
    "le": "nl.less_equal",
}
#: ALU ops usable in tensor_scalar / tensor_tensor / scalar_tensor_tensor.
ALU = {
    "add": "nl.add",
    "sub": "nl.subtract",
    "mul": "nl.multiply",
    "maximum": "nl.maximum",
    "minimum": "nl.minimum",
    "pow": "nl.power",
    **COMPARISONS,
}
COMMUTATIVE = {"add", "mul", "maximum", "minimum"}
#: Engine of each emitted call, and its cost in passes over the free axis (nki.md §6: tensor_tensor and
#: scalar_tensor_tensor read two tensors, 2N cycles; the rest N).
CALL_COST = {
    "activation": ("act", 1),
    "activation_reduce": ("act", 1),
    "tensor_scalar": ("dve", 1),
    "tensor_copy": ("dve", 1),
    "tensor_reduce": ("dve", 1),
    "tensor_tensor": ("dve", 2),
    "scalar_tensor_tensor": ("dve", 2),
    "reciprocal": ("dve", 8),
    "memset": ("dve", 1),
}
NL_DTYPE = {
    "bf16": "nl.bfloat16",
    "f16": "nl.float16",
    "f32": "nl.float32",
    "fp8_e4m3": "nl.float8_e4m3fn",  # the OCP format (max 448); nl.float8_e4m3 is another encoding
    "fp8_e5m2": "nl.float8_e5m2",
}
#: trn2 clocks (GHz) of the engines `EngineLoad` balances ([v3], fusegen/sim/targets.py).
CLOCK_GHZ = {"act": 1.2, "dve": 0.96}


@dataclass
class EngineLoad:
    """Full-width work a kernel's stages put on the Scalar and Vector engines (passes over the free axis /
    clock). A first lowering with no `planned` totals keeps every step where it is and counts; the second,
    given those totals, moves a per-row affine step to the Scalar engine while that lowers the larger of
    the two final totals (a greedy balance over the whole kernel, not only the stages seen so far)."""

    planned: dict[str, float] | None = None
    busy: dict[str, float] = field(default_factory=lambda: {"act": 0.0, "dve": 0.0})
    moved: dict[str, float] = field(default_factory=lambda: {"act": 0.0, "dve": 0.0})

    def add(self, engine: str, passes: float) -> None:
        """Count `passes` full-width passes on `engine` ("act" | "dve"; others are not balanced)."""
        if engine in self.busy:
            self.busy[engine] += passes / CLOCK_GHZ[engine]

    def scalar_lighter(self) -> bool:
        """Whether the planned full-width work leaves the Scalar engine the less busy of the two (per-row
        steps may then join it; on the busier engine each would lengthen the kernel's bound)."""
        if self.planned is None:
            return False
        return self.planned["act"] + self.moved["act"] < self.planned["dve"] - self.moved["dve"]

    def prefers_scalar(self, vector_passes: float) -> bool:
        """Whether moving a step of `vector_passes` Vector passes to one Scalar pass lowers the larger of
        the two totals (and if so, count the move)."""
        if self.planned is None:
            return False
        act = self.planned["act"] + self.moved["act"]
        dve = self.planned["dve"] - self.moved["dve"]
        after = max(act + 1 / CLOCK_GHZ["act"], dve - vector_passes / CLOCK_GHZ["dve"])
        if after >= max(act, dve):
            return False
        self.moved["act"] += 1 / CLOCK_GHZ["act"]
        self.moved["dve"] += vector_passes / CLOCK_GHZ["dve"]
        return True
