"""The FFN family: match, lower, plan and render a spec into kernel.py (its files beyond the shared ones)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fusegen.codegen.autodiff import backward_ir
from fusegen.codegen.family import KernelBackward, Mismatch, kernel_arg
from fusegen.codegen.ffn import budget as ffn_budget
from fusegen.codegen.ffn.backward import backward_plan
from fusegen.codegen.ffn.backward_render import backward_kernel_source
from fusegen.codegen.ffn.lower import FfnLowering, lower_ffn
from fusegen.codegen.ffn.match import FfnMatch, match_ffn
from fusegen.codegen.files.host import host_params, kernel_args, kernel_render_args, run_doc
from fusegen.codegen.files.reference import dim_bindings
from fusegen.codegen.files.render import render
from fusegen.codegen.files.signature import door_lines
from fusegen.codegen.plan import TilePlan
from fusegen.codegen.plan import candidates as ffn_candidates
from fusegen.codegen.rewrites import rewrite
from fusegen.dsl.ir import KernelIR
from fusegen.sim.targets import get_target

TEMPLATE = "ffn_kernel.py.jinja"


@dataclass(frozen=True)
class HostSignature:
    """Pieces of the host function's source, decided here and formatted by the template."""

    params: str
    returns: str
    x: str
    down_weight: str
    launch_args: str
    doc: str
    dims: tuple[str, ...]  # `d_<dim> = ...` bindings the up weights' layout needs (packed weights' columns)
    door: tuple[str, ...]  # argument checks (signature.py), then an empty call's early return


@dataclass(frozen=True)
class FfnFamily:
    """Projections of one input over K, an elementwise combine, a down-projection, an epilogue."""

    name: str = "ffn"
    trainable: bool = True
    summary: str = (
        "x @ W (1 or 2 projections) -> elementwise combine -> @ W2 -> elementwise/row-wise epilogue"
    )
    hooks: tuple[str, ...] = (
        "combine: activation(s) with per-partition [I] bias on the Scalar engine, then one fused "
        "scalar_tensor_tensor (gate * up)",
        "accumulator init: [R, K] residual DMA'd in, or a [K] bias added while evicting the first chunk",
        "epilogue: elementwise with [K] / [R, K] / [R, 1] inputs, row reductions, LayerNorm/RMSNorm "
        "statistics chains, output casts",
    )
    planning: str = (
        "The planner enumerates legal plans (SBUF budget, PSUM banks) and picks the one with the least "
        "modelled time, then the least total engine work, then the fewest HBM bytes, then the least SBUF; "
        "the host function re-plans the same way for runtime shapes."
    )

    def match(self, ir: KernelIR) -> FfnMatch:
        """The FFN roles in `ir` (raises Mismatch)."""
        return match_ffn(ir)

    def plans(self, ir: KernelIR, m: FfnMatch, target: str, lnc: int) -> list[TilePlan]:
        """One plan per `check` shape."""
        return [self.candidates(ir, m, c.env(), target, lnc, 1)[0] for c in ir.checks]

    def candidates(self, ir: KernelIR, m: FfnMatch, dims: dict[str, int], target: str, lnc: int,
                   count: int) -> list[TilePlan]:  # fmt: skip
        """The `count` best plans at `dims`, best first."""
        roles = (str(m.rows), str(m.hidden), str(m.inter))
        model = lower_ffn(ir, m).model
        env = {**ir.fixed_dims(), **dims}
        # a role may be a dim expression (`w1t: [K, 2*I]`): the planner reads its value under its spelling
        # (a KeyError, exit 3, before), and each plan names the spec's dims alone
        sizes = {str(role): role.eval(env) for role in (m.rows, m.hidden, m.inter)}
        plans = ffn_candidates(model, get_target(target), lnc, {**env, **sizes}, roles, count)
        return [dataclasses.replace(p, dims=tuple(sorted(env.items()))) for p in plans]

    def kernel_source(self, ir: KernelIR, m: FfnMatch, target: str, lnc: int) -> str:
        """kernel.py: the NKI kernel, its vendored planner, the host function."""
        low = lower_ffn(ir, m)
        return render(
            TEMPLATE,
            **{
                **kernel_render_args(
                    ir, TEMPLATE, "an FFN-family", low.model, ffn_budget, target, lnc, m.source.name
                ),
                "kernel_args": _kernel_args(ir, low),
            },
            low=low,
            host=_host(ir, m, low),
            dim_bindings=[f"d_{d} = {s}" for d, s in dim_bindings(ir, kernel_arg, _host_laid_out(ir, low))],
        )

    def backward(self, ir: KernelIR, target: str, lnc: int) -> KernelBackward | None:
        """backward_kernel.py (ffn/backward_program.py: the backward IR's GEMMs and elementwise stages as NKI
        kernels) where the program carries the spec's backward IR, and backward_plan.md, the
        save-vs-recompute decision (ffn/backward.py); the op's backward runs the reference elsewhere. The
        kernels read the forward's f32 outputs (x_new of a norm epilogue: no down-projection to recompute)."""
        m, back = match_ffn(rewrite(ir)), backward_ir(ir, read_outputs=True)
        try:
            kernels = backward_kernel_source(back, m.rows, target, lnc)
        except Mismatch:  # e.g. exact GELU's erf: backward_reference.py only, for now
            reference = backward_ir(ir)
            return KernelBackward(None, (("backward_plan.md", backward_plan(ir, m, reference, target, lnc)),))
        plan = ("backward_plan.md", backward_plan(ir, m, back, target, lnc))
        return KernelBackward(back, (("backward_kernel.py", kernels), plan))


FFN = FfnFamily()


def _host(ir: KernelIR, m: FfnMatch, low: FfnLowering) -> HostSignature:
    params, returns = host_params(ir)
    cols = _col_inputs(ir, low)
    launch = [_launch_arg(i.name, low, cols) for i in ir.inputs if i.name not in cols[1:]]
    launch += [p.name for p in ir.params]
    down = str(ir.node(m.down.args[1]).name)
    launch.append(f"_down_blocks(_given_{down}, _plan.kc, _inter)")  # the column blocks' layout (KC > 0)
    firsts = [pj.first_column for pj in low.projections if pj.first_column]
    return HostSignature(
        params=params,
        returns=returns,
        x=str(m.source.name),
        down_weight=down,
        launch_args=", ".join(launch),
        doc=run_doc(ir),
        # the caller's weights, before the door's dense copy: the layout cache keys on their storage
        door=tuple(f"_given_{t} = {t}" for t in sorted(_up_weights(ir, low) | {down}))
        + door_lines("_SIGNATURE", ir),
        dims=tuple(f"d_{d} = {src}" for d, src in dim_bindings(ir, str)) if firsts else (),
    )


def _up_weights(ir: KernelIR, low: FfnLowering) -> frozenset[str]:
    """The inputs the kernel takes in the up weights' host layout (`_up_layout`)."""
    return frozenset(i.name for i in ir.inputs if kernel_arg(i.name) in {pj.weight for pj in low.projections})


def _col_inputs(ir: KernelIR, low: FfnLowering) -> list[str]:
    """The spec's [I] vector inputs, which the host packs into one (`_columns`), in input order."""
    return [i.name for i in ir.inputs if kernel_arg(i.name) in low.col_vectors]


def _kernel_args(ir: KernelIR, low: FfnLowering) -> list[str]:
    """The kernel's arguments: the inputs', the [I] vectors packed into one (`_i_cols_hbm`, where the first
    was: spelled with `_`, so no spec input's argument can meet it), the params', then the down weight in
    the column blocks' layout (`_down_blocks_hbm`)."""
    cols = [kernel_arg(name) for name in _col_inputs(ir, low)]
    args = ["_i_cols_hbm" if a in cols[:1] else a for a in kernel_args(ir) if a not in cols[1:]]
    return [*args, "_down_blocks_hbm"]  # the down weight in the column blocks' layout (`_down_blocks`)


def _host_laid_out(ir: KernelIR, low: FfnLowering) -> frozenset[str]:
    """The inputs the kernel takes in another layout: the up weights and the [I] vectors."""
    return _up_weights(ir, low) | frozenset(_col_inputs(ir, low))


def _launch_arg(tensor: str, low: FfnLowering, cols: list[str]) -> str:
    """What the host passes the kernel for input `tensor`: the [I] vectors `cols` packed into columns (in
    the first one's place), up weights laid out (each projection's columns, stacked in order), anything else
    as given."""
    if tensor in cols:
        return f"_columns({', '.join(cols)})"
    firsts = [pj.first_column or "0" for pj in low.projections if pj.weight == kernel_arg(tensor)]
    return f"_up_layout(_given_{tensor}, ({', '.join(firsts)},), _inter)" if firsts else tensor
