"""Host-function pieces every family's kernel.py shares: kernel arguments, what the host returns, and the
targets whose time-model figures it carries."""

from __future__ import annotations

from fusegen.codegen.family import kernel_arg
from fusegen.codegen.files.render import private_repr
from fusegen.codegen.files.signature import Returned
from fusegen.codegen.plan import PlanError, machine
from fusegen.dsl.ir import KernelIR
from fusegen.sim.targets import TARGETS


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
