"""The FFN backward's files: backward_kernel.py (its GEMM and elementwise kernels, a host program) and the
save-vs-recompute plan (backward.py)."""

from __future__ import annotations

from fusegen.codegen import budget_base
from fusegen.codegen.ffn.backward_program import Program, build_program
from fusegen.codegen.files.render import header, render, vendored
from fusegen.codegen.files.signature import Returned, door_lines, door_source, signature
from fusegen.dsl.ir import Dim, KernelIR

TEMPLATE = "ffn_backward.py.jinja"
BACKWARD_DOC = ("FFN-family NKI kernels derived from the forward spec (GEMMs over the tokens and rows, "
                "elementwise stages between them); backward_reference.py spells out the math")  # fmt: skip


def backward_kernel_source(back: KernelIR, rows: Dim, target: str, lnc: int) -> str:
    """backward_kernel.py of backward IR `back` (rows: the token dim); raises Mismatch."""
    program: Program = build_program(back, rows)
    outs = ", ".join(o.name for o in back.outputs)
    ins = ", ".join(i.name for i in back.inputs)
    tensors = [f"{i.name}: torch.Tensor" for i in back.inputs]
    params = [f"{p.name}: float = {p.default!r}" for p in back.params]
    returned = [Returned(o.name, o.dtype, o.shape) for o in back.outputs]
    return render(
        TEMPLATE, header=header(back, TEMPLATE), name=back.name,
        doc=f"{back.name}: ({ins}) -> ({outs}), {BACKWARD_DOC}.",
        budget_source=vendored(budget_base), default_lnc=lnc, default_target=target, program=program,
        door_source=door_source([("_SIGNATURE", signature(back.name, back, returned, sums=True))]),
        host_params=", ".join([*tensors, *params, "lnc: int | None = None", "target: str = _TARGET"]),
        door=door_lines("_SIGNATURE", back), returns=outs,
    )  # fmt: skip
