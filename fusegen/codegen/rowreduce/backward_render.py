"""The row-reduction backward's files: backward_kernel.py (two NKI kernels and their host) and its plan."""

from __future__ import annotations

from dataclasses import dataclass

from fusegen.codegen.autodiff import backward_ir
from fusegen.codegen.family import kernel_arg
from fusegen.codegen.files.reference import dim_bindings
from fusegen.codegen.files.render import header, private_repr, render, vendored
from fusegen.codegen.files.report import plan_markdown
from fusegen.codegen.files.signature import Returned, door_lines, door_source, signature
from fusegen.codegen.plan import PlanError, PlannedBuffer, TilePlan
from fusegen.codegen.rewrites import rewrite
from fusegen.codegen.rowreduce import budget as rb
from fusegen.codegen.rowreduce.backward import BackwardLowering, lower_backward, psum_banks, token_sum_fits
from fusegen.codegen.rowreduce.family import host_params, kernel_args, kernel_doc, prep_dims
from fusegen.codegen.rowreduce.match import RowReduceMatch, match_rowreduce
from fusegen.codegen.select_tables import NL_DTYPE
from fusegen.codegen.stage import dim_source
from fusegen.dsl.ir import KernelIR
from fusegen.sim.targets import TARGETS, Target, get_target

TEMPLATE = "rowreduce_backward.py.jinja"
BACKWARD_DOC = (
    "row-reduction NKI kernels derived from the forward spec; backward_reference.py spells out the math"
)
PLANNING = (
    "The backward kernel is planned like the forward: prepared weights resident when every head's fit, "
    "else rebuilt per token tile and head; then the fewest chunks of HB columns for the reduction passes "
    "and the epilogue alike. Sums over the tokens take one PSUM bank each ([128, HC*H/128] fp32 columns), "
    "next to the prep step's broadcast weights; kernel 2 adds the cores' partial sums and applies the "
    "post-ops that turn them into the [HC, H] outputs."
)


@dataclass(frozen=True)
class BackwardHost:
    """Pieces of the backward host function's source, decided here and formatted by the template."""

    params: str
    doc: str
    width: str
    heads: str
    launch_args: str
    checks: tuple[str, ...]
    prep_kernel_args: str
    prep_dims: tuple[str, ...]
    kernel_returns: str
    main_results: str
    reduce_args: str
    reduce_results: str
    returns: str
    door: tuple[str, ...]  # argument checks (signature.py), then an empty call's early return


def kernel_backward_ir(user_ir: KernelIR) -> KernelIR:
    """What the backward kernels compute: the derivative of the rewritten forward (the one kernel.py runs), so
    it reads the forward's saved fused dot instead of re-summing it, and its weight gradients share one
    token sum (of the fused weight); rewritten in turn."""
    return rewrite(backward_ir(rewrite(user_ir)))


def backward_files(ir: KernelIR, target: str, lnc: int) -> dict[str, str]:
    """backward_kernel.py and backward_plan.md of a backward IR (`kernel_backward_ir`); raises Mismatch."""
    m = match_rowreduce(ir)
    low = lower_backward(ir, m)
    plans = tuple(plan_backward(ir, m, low, get_target(target), lnc, {**ir.fixed_dims(), **c.env()})
                  for c in ir.checks)  # fmt: skip
    return {
        "backward_kernel.py": backward_source(ir, m, low, target, lnc),
        "backward_plan.md": plan_markdown(ir, "rowreduce backward", PLANNING, plans),
    }


def backward_source(ir: KernelIR, m: RowReduceMatch, low: BackwardLowering, target: str, lnc: int) -> str:
    """backward_kernel.py: the backward kernel, the partial-sum reduction kernel, the host function."""
    token_outs = {o.name for o in m.token_outputs}
    return render(
        TEMPLATE, header=header(ir, TEMPLATE), name=ir.name, doc=kernel_doc(ir, BACKWARD_DOC), low=low,
        model=private_repr(low.model), budget_source=vendored(rb), host=_host(ir, m),
        door_source=door_source([("_SIGNATURE", signature(ir.name, ir, _returned(ir), sums=True))]),
        kernel_args=kernel_args(ir),
        dim_bindings=[f"d_{d} = {src}" for d, src in dim_bindings(ir, kernel_arg)],
        outputs=[(kernel_arg(o.name), NL_DTYPE[o.dtype], ", ".join(dim_source(d) for d in o.shape))
                 for o in ir.outputs if o.name not in token_outs],
        sbuf_budgets=repr({name: t.sbuf_usable_bytes for name, t in sorted(TARGETS.items())}),
        default_target=target, default_lnc=lnc,
    )  # fmt: skip


def plan_backward(ir: KernelIR, m: RowReduceMatch, low: BackwardLowering, target: Target, lnc: int,
                  dims: dict[str, int]) -> TilePlan:  # fmt: skip
    """Weight residency and chunk width within SBUF, and the token sums' PSUM banks, at one shape."""
    rows, heads, width = (d.eval(dims) for d in (m.rows, m.heads, m.width))
    if m.token_sums and not token_sum_fits(heads, width):
        raise PlanError(f"sums over the tokens need H % 128 == 0 and HC * H <= 65536 (one PSUM bank of "
                        f"fp32 [128, HC * H / 128] columns); HC={heads}, H={width}")  # fmt: skip
    banks = psum_banks(m)
    if banks > target.psum_banks:
        raise PlanError(f"{banks} PSUM banks needed, {target.psum_banks} on {target.name}")
    try:
        hb, resident = rb.choose(low.model, width, heads, target.sbuf_usable_bytes)
    except ValueError as err:
        raise PlanError(f"{err} on {target.name}") from None
    buffers = tuple(
        PlannedBuffer(b.name.replace("epilogue tiles", "head-sum accumulators"), "sbuf", b.bytes, b.copies)
        for b in rb.buffers(low.model, width, heads, hb, resident)
    ) + tuple(
        PlannedBuffer(f"token sum {i} ([128, HC*H/128] fp32)", "psum", heads * width // rb.P * 4, 1)
        for i in range(len(m.token_sums))
    )
    outs = ", ".join(o.name for o in m.token_outputs)
    summary = (
        ("token tiles (128) per core", str(rb.cdiv(rb.rows_per_core(rows, lnc), rb.P))),
        ("chunks (passes and epilogue)", f"{rb.cdiv(width, hb)} of {hb} columns"),
        ("prepared weights", "resident for the launch" if resident else "rebuilt per token tile and head"),
        ("partial token sums", f"[{lnc}, {len(m.token_sums)}, {heads}, {width}] fp32; kernel 2 sums them "
                               f"and gives {outs}"),
    )  # fmt: skip
    return TilePlan(
        family="rowreduce backward", target=target.name, lnc=lnc, dims=tuple(sorted(dims.items())),
        tiles=(("P", rb.P), ("HB", hb)), buffers=buffers,
        sbuf_bytes=rb.sbuf_bytes(low.model, width, heads, hb, resident), sbuf_budget=target.sbuf_usable_bytes,
        psum_banks=banks, psum_budget=target.psum_banks,
        hbm_bytes=(("partials", lnc * len(m.token_sums) * heads * width * 4),),
        summary=summary, reasons=_reasons(low, width, heads, hb, resident),
    )  # fmt: skip


def _reasons(low: BackwardLowering, width: int, heads: int, hb: int, resident: bool) -> tuple[str, ...]:
    held = low.model.resident_per_head * heads * width
    if resident:
        reasons = [f"prepared weights stay resident: {held:,} B/partition"]
    else:
        reasons = [f"prepared weights rebuilt per token tile and head: all heads need {held:,} B/partition"]
    chunks = rb.cdiv(width, hb)
    fit = f"{chunks} chunks fit next to the row inputs and accumulators"
    reasons.append(f"HB={hb}: " + ("the whole width in one chunk" if hb >= width else fit))
    reasons.append("sums over the tokens accumulate in PSUM across token tiles (a ones-column matmul per 128 "
                   "columns), so each core writes its partial once")  # fmt: skip
    return tuple(reasons)


def _host(ir: KernelIR, m: RowReduceMatch) -> BackwardHost:
    tensors = [i.name for i in ir.inputs]
    params = [*host_params(ir), "lnc: int | None = None", "target: str = _TARGET"]
    data = next(i for i in ir.inputs if len(i.shape) == 3)
    width, heads = f"{data.name}.shape[2]", f"{data.name}.shape[1]"
    token_outs = [o.name for o in m.token_outputs]
    main = [o.name for o in ir.outputs if o.name not in token_outs]
    weights = [str(w.name) for w in m.weights]
    h, g = str(m.width), str(m.heads)  # the spec's names for them
    checks = (
        f"if {width} % _P or {heads} * {width} > _P * _F_MOV:",
        f'    raise ValueError(f"{{_SIGNATURE.name}}: sums over the tokens need {h} % 128 == 0 and '
        f'{g} * {h} <= 65536 (one PSUM bank), got {g}={{{heads}}}, {h}={{{width}}}")',
    ) if m.token_sums else ()  # fmt: skip
    return BackwardHost(
        params=", ".join(params), width=width, heads=heads,
        doc=f"Run the backward on `lnc` logical cores (default LNC, capped at the target's); returns "
            f"({', '.join(o.name for o in ir.outputs)})",
        launch_args=", ".join(tensors + [p.name for p in ir.params]), checks=checks,
        prep_kernel_args=", ".join(kernel_arg(w) for w in weights),
        prep_dims=prep_dims(ir, weights),
        kernel_returns=", ".join(kernel_arg(n) for n in main), main_results=", ".join(main),
        reduce_args="".join(f", {n.name}" for n in m.post_inputs),
        reduce_results=", ".join(token_outs),  # a kernel returning one tensor returns it bare
        returns=", ".join(o.name for o in ir.outputs),
        door=door_lines("_SIGNATURE", ir),
    )  # fmt: skip


def _returned(ir: KernelIR) -> list[Returned]:
    """The gradients the host returns; over no rows, the weights' (sums over the rows) are zero."""
    return [Returned(o.name, o.dtype, o.shape) for o in ir.outputs]
