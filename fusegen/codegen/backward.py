"""The backward stage of the build: differentiate the spec, then the family's backward kernels, if any."""

from __future__ import annotations

from dataclasses import dataclass

from fusegen.codegen.autodiff import backward_ir
from fusegen.codegen.family import Family, KernelBackward
from fusegen.dsl.ir import FP8_DTYPES, KernelIR


@dataclass(frozen=True)
class Backward:
    """A trainable spec's backward: the reference's IR (the spec's own math differentiated, rendered as
    backward_reference.py) and the family's kernels (None: the op's backward runs the reference)."""

    reference: KernelIR
    kernels: KernelBackward | None

    def files(self) -> dict[str, str]:
        """The kernels' files, by name (the reference's are rendered with ops.py)."""
        return dict(self.kernels.files) if self.kernels is not None else {}


def differentiate(user_ir: KernelIR, family: Family, target: str, lnc: int) -> Backward | None:
    """The backward of the spec's own (unfused) IR where `family` trains, else None (inference-only; so is
    every spec with an fp8 input or output: fp8 is a storage format for inference here, and torch has no
    arithmetic on fp8 tensors for their gradients).

    The reference differentiates the spec's own math and the family's kernels (typically) the rewritten
    forward's, so the two derivations check each other."""
    if inference_only(user_ir, family) is not None:
        return None
    return Backward(backward_ir(user_ir), family.backward(user_ir, target, lnc))


def inference_only(user_ir: KernelIR, family: Family) -> str | None:
    """Why the spec's op gets no autograd, as ops.py's error says it (None: it trains)."""
    if not family.trainable:
        return "its family has no backward yet"
    dtypes = {i.dtype for i in user_ir.inputs} | {o.dtype for o in user_ir.outputs}
    if dtypes.intersection(FP8_DTYPES):
        return "it reads or writes fp8, a storage format for inference here, which carries no gradients"
    return None
