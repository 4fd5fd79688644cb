"""Host-function pieces every family's kernel.py shares: kernel arguments, what the host returns, and the
targets whose time-model figures it carries."""

from __future__ import annotations

from types import ModuleType

from fusegen.codegen.family import kernel_arg
from fusegen.codegen.files.render import header, private_repr, vendored
from fusegen.codegen.files.signature import Returned, door_source, signature
from fusegen.codegen.fp8 import fp8_targets
from fusegen.codegen.plan import PlanError, machine
from fusegen.dsl.ir import KernelIR
from fusegen.sim.targets import TARGETS


def kernel_render_args(
    ir: KernelIR, template: str, family: str, model: object, budget: ModuleType, target: str, lnc: int,
    transposed: str | None,
) -> dict[str, object]:
    """The render arguments every matmul family's kernel.py takes alike: header, doc, the vendored budget
    model and its literal, the kernel's arguments, the targets' figures, the door and the defaults.
    `transposed`: the input whose rows the kernel transposes on the Tensor engine."""
    ins, outs = ", ".join(i.name for i in ir.inputs), ", ".join(o.name for o in ir.outputs)
    return {
        "header": header(ir, template),
        "name": ir.name,
        "doc": f"{ir.name}: ({ins}) -> ({outs}), {family} NKI kernel; reference.py spells out the math.",
        "model": private_repr(model),
        "budget_source": vendored(budget),
        "kernel_args": kernel_args(ir),
        "machines": machines(),
        "door_source": door_source(
            [("_SIGNATURE", _signature(ir, transposed))]
        ),
        "default_target": target,
        "default_lnc": lnc,
    }


def _signature(ir: KernelIR, transposed: str | None) -> str:
    """The host's `_Signature` literal (over the targets whose fp8 dtypes the spec's match)."""
    return signature(ir.name, ir, returned(ir), fp8_targets(ir, targets()), transposed=transposed)


def host_params(ir: KernelIR) -> tuple[str, str]:
    """The host function's parameters (inputs, params, `lnc`, `target`) and its return annotation."""
    params = [f"{i.name}: torch.Tensor" for i in ir.inputs]
    params += [f"{p.name}: float = {p.default!r}" for p in ir.params]
    params += ["lnc: int | None = None", "target: str = _TARGET"]
    n = len(ir.outputs)
    return ", ".join(params), "torch.Tensor" if n == 1 else f"tuple[{', '.join(['torch.Tensor'] * n)}]"


def run_doc(ir: KernelIR) -> str:
    """The host function's docstring."""
    outs = ", ".join(o.name for o in ir.outputs)
    return (f"Run the kernel on `lnc` logical cores (default LNC, capped at the target's) with the best "
            f"modelled plan for these shapes; returns ({outs}).")  # fmt: skip


def kernel_args(ir: KernelIR) -> list[str]:
    """The kernel's arguments for the spec's inputs and params."""
    return [kernel_arg(i.name) for i in ir.inputs] + [f"{p.name}_arg" for p in ir.params]


def returned(ir: KernelIR) -> list[Returned]:
    """What the host returns: every output, in order."""
    return [Returned(o.name, o.dtype, o.shape) for o in ir.outputs]


def targets() -> list[str]:
    """The targets the host can plan for: those with the time model's figures."""
    return [name for name, _ in machines()]


def machines() -> list[tuple[str, str]]:
    """(target, Machine literal) for every target whose figures the table has."""
    out = []
    for name, target in sorted(TARGETS.items()):
        try:
            out.append((name, private_repr(machine(target))))
        except PlanError:
            continue
    return out
