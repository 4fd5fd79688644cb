"""Which engine codegen may put an instruction on: the documented legal engines, as data.

Sources (files of the public aws-neuron/aws-neuron-sdk repository):
- [ALU] `general/nki/api/nki.api.shared.rst` at commit 49ee15c5 (SDK 2.26), the ALU operator table's
  "Supported Engine" column: GpSimd only for add, multiply, rsqrt and power.
- [ISA] `nki/api/nki/isa/__init__.py`, the docstrings: `tensor_scalar` takes `engine=gpsimd` "only
  allowed for rsqrt"; `tensor_tensor` runs on Vector or GpSimd (`nl.power` on GpSimd); `tensor_copy`
  on Vector, Scalar or GpSimd; GpSimd cannot access PSUM (tensor_copy, tensor_tensor).
- [RN] `release-notes/components/nki.rst`: "Division is not available as a hardware instruction".
Where two sources differ the stricter one wins: an instruction goes to GpSimd only when both its own
docstring and the ALU table allow the op there. fusegen/sim/rules.py holds the interpreter's side of
the same facts; this table is only what codegen consults when it picks an `engine=`.
"""

from __future__ import annotations

GPSIMD = "nisa.engine.gpsimd"
VECTOR = "nisa.engine.vector"

#: ALU ops the [ALU] table lists for GpSimd (nl names).
GPSIMD_ALU = frozenset({"nl.add", "nl.multiply", "nl.rsqrt", "nl.power"})

#: Per instruction, the ALU ops it may run on GpSimd: the [ISA] docstring's allowance intersected with
#: GPSIMD_ALU. An instruction missing here never goes to GpSimd (e.g. scalar_tensor_tensor, Vector only).
GPSIMD_OPS: dict[str, frozenset[str]] = {
    "tensor_tensor": GPSIMD_ALU,  # [ISA] "using Vector Engine or GpSimd Engine"
    "tensor_scalar": frozenset({"nl.rsqrt"}),  # [ISA] engine: "gpsimd (only allowed for rsqrt)"
    "tensor_copy": frozenset({""}),  # [ISA] no ALU op; legal on GpSimd from and to SBUF
    "memset": frozenset({""}),  # [ISA] memset: "using Vector or GpSimd Engine"
}

#: Element sizes `nisa.dma_transpose` takes ([ISA] dma_transpose: "src.dtype is 2 bytes", for hardware-DGE
#: and software-DGE transposes alike); codegen transposes other dtypes on the PE (nc_transpose).
DMA_TRANSPOSE_BYTES = frozenset({2})

#: ALU ops with no hardware instruction [RN], [ALU]: codegen multiplies by a reciprocal instead.
NOT_INSTRUCTIONS = frozenset({"nl.divide"})


def gpsimd_allows(call: str, ops: tuple[str, ...], reads_psum: bool) -> bool:
    """Whether `nisa.<call>` with ALU ops `ops` ("" for none) may run on GpSimd ([ISA]: never on PSUM)."""
    allowed = GPSIMD_OPS.get(call)
    return allowed is not None and not reads_psum and all(op in allowed for op in ops)


#: The Scalar engine's activation functions (the activation table of the current
#: `nki/api/nki.api.shared.rst`, a superset of [ALU]'s): codegen names no other `op` in nisa.activation.
ACTIVATION_FUNCTIONS = frozenset({
    "nl.copy", "nl.square", "nl.sigmoid", "nl.relu", "nl.gelu", "nl.gelu_dx", "nl.gelu_apprx_tanh",
    "nl.gelu_apprx_sigmoid", "nl.gelu_apprx_sigmoid_dx", "nl.prelu", "nl.silu", "nl.silu_dx", "nl.tanh",
    "nl.softplus", "nl.mish", "nl.erf", "nl.erf_dx", "nl.exp", "nl.log", "nl.sin", "nl.arctan", "nl.sqrt",
    "nl.rsqrt", "nl.reciprocal", "nl.sign", "nl.abs",
})  # fmt: skip
