"""The projection family: match, lower, plan and render a spec into kernel.py (beyond the shared files)."""

from __future__ import annotations

from dataclasses import dataclass

from fusegen.codegen.family import KernelBackward, kernel_arg
from fusegen.codegen.files.host import host_params, kernel_render_args, run_doc
from fusegen.codegen.files.reference import dim_bindings
from fusegen.codegen.files.render import render
from fusegen.codegen.files.signature import door_lines
from fusegen.codegen.plan import TilePlan
from fusegen.codegen.proj import budget as proj_budget
from fusegen.codegen.proj.lower import lower_proj
from fusegen.codegen.proj.match import ProjMatch, match_proj
from fusegen.codegen.proj.plan import candidates as proj_candidates
from fusegen.codegen.stage import dim_source
from fusegen.dsl.ir import KernelIR
from fusegen.sim.targets import get_target

TEMPLATE = "proj_kernel.py.jinja"


@dataclass(frozen=True)
class HostSignature:
    """Pieces of the host function's source, decided here and formatted by the template."""

    params: str
    returns: str
    x: str
    widths: str  # the projections' N, a tuple literal's items
    launch_args: str
    doc: str
    kernel_returns: str
    dims: tuple[str, ...]  # `d_<dim> = ...` bindings the widths need
    door: tuple[str, ...]  # argument checks (signature.py), then an empty call's early return


@dataclass(frozen=True)
class ProjFamily:
    """Projections of one operand (optionally normalised first), each with an elementwise epilogue."""

    name: str = "proj"
    trainable: bool = False  # inference only for now: no backward_reference.py, no autograd
    summary: str = "row-wise prologue(x) @ W (1 or more weights, any N) -> elementwise epilogue per output"
    hooks: tuple[str, ...] = (
        "prologue: row-wise math on x (RMSNorm/LayerNorm with gamma, scaling) in K-block passes, cast and "
        "transposed on the PE into x^T",
        "epilogue: elementwise with [N] / [R, N] / [R, 1] inputs and casts, computed while each [P, 512] "
        "piece leaves PSUM",
    )
    planning: str = (
        "The planner enumerates legal plans (rows per super-block S with x^T resident, weight columns per "
        "block NB, weights held per block or streamed a K-tile at a time, rows or columns split over the "
        "cores) within SBUF and PSUM, and picks the least modelled time, then the least total engine work, "
        "then the fewest HBM bytes, then the least SBUF; the host function re-plans the same way for runtime "
        "shapes."
    )

    def match(self, ir: KernelIR) -> ProjMatch:
        """The projection roles in `ir` (raises Mismatch)."""
        return match_proj(ir)

    def plans(self, ir: KernelIR, m: ProjMatch, target: str, lnc: int) -> list[TilePlan]:
        """One plan per `check` shape."""
        return [self.candidates(ir, m, c.env(), target, lnc, 1)[0] for c in ir.checks]

    def candidates(self, ir: KernelIR, m: ProjMatch, dims: dict[str, int], target: str, lnc: int,
                   count: int) -> list[TilePlan]:  # fmt: skip
        """The `count` best plans at `dims`, best first."""
        model = lower_proj(ir, m).model
        widths = tuple(pj.width for pj in m.projections)
        env = {**ir.fixed_dims(), **dims}
        return proj_candidates(model, get_target(target), lnc, env, m.rows, m.hidden, widths, count)

    def kernel_source(self, ir: KernelIR, m: ProjMatch, target: str, lnc: int) -> str:
        """kernel.py: the NKI kernel, its vendored planner, the host function."""
        low = lower_proj(ir, m)
        return render(
            TEMPLATE,
            **kernel_render_args(
                ir, TEMPLATE, "a proj-family", low.model, proj_budget, target, lnc, m.source.name
            ),
            low=low,
            host=_host(ir, m),
            dim_bindings=[f"d_{d} = {src}" for d, src in dim_bindings(ir, kernel_arg)],
        )

    def backward(self, ir: KernelIR, target: str, lnc: int) -> KernelBackward | None:
        """No backward kernels (the family is not trainable yet)."""
        return None


PROJ = ProjFamily()


def _host(ir: KernelIR, m: ProjMatch) -> HostSignature:
    params, returns = host_params(ir)
    return HostSignature(
        params=params,
        returns=returns,
        x=str(m.source.name),
        widths="".join(f"{dim_source(pj.width)}, " for pj in m.projections),
        launch_args=", ".join([i.name for i in ir.inputs] + [p.name for p in ir.params]),
        doc=run_doc(ir),
        kernel_returns=", ".join(kernel_arg(o.name) for o in ir.outputs),
        dims=tuple(f"d_{d} = {src}" for d, src in dim_bindings(ir, str)),
        door=door_lines("_SIGNATURE", ir),
    )
