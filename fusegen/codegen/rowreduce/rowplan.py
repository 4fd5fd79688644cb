"""The row-reduction family's tile plan of one shape: weight residency, chunk width, SBUF buffers, HBM
traffic, and the reasons plan.md and `fusegen explain` print."""

from __future__ import annotations

from fusegen.codegen.plan import PlanError, PlannedBuffer, TilePlan, check_lnc
from fusegen.codegen.rowreduce import budget as rb
from fusegen.codegen.rowreduce.loads import column_bytes
from fusegen.codegen.rowreduce.lower import RowReduceLowering
from fusegen.codegen.rowreduce.match import RowReduceMatch
from fusegen.dsl.ir import DTYPE_BYTES, KernelIR, Shape
from fusegen.sim.targets import Target


def plan_rowreduce(ir: KernelIR, m: RowReduceMatch, low: RowReduceLowering, target: Target, lnc: int,
                   dims: dict[str, int]) -> TilePlan:  # fmt: skip
    """The weight residency, chunk width, SBUF budget and HBM traffic of one shape."""
    rows, heads, width = (d.eval(dims) for d in (m.rows, m.heads, m.width))
    check_lnc(target, lnc)
    budget = target.sbuf_usable_bytes
    try:
        hb, resident, overlap, streamed = rb.choose_rows(low.model, width, heads, budget)
    except ValueError as err:
        raise PlanError(f"{err} on {target.name}") from None
    # a streamed plan reads the row inputs once per reduction pass and once more for the epilogue
    per_token, minimum = token_bytes(ir, m, dims, len(m.levels) + 1 if streamed else 1)
    weights = sum(DTYPE_BYTES[w.dtype] for w in m.weights) * heads * width
    # resident: every core builds its own copy, even a core without tokens; else once per token tile
    builds = lnc if resident else rb.cdiv(rows, rb.P)
    buffers = tuple(
        PlannedBuffer(b.name, "sbuf", b.bytes, b.copies)
        for b in rb.buffers(low.model, width, heads, hb, resident, overlap, streamed)
    )
    summary = (
        ("token tiles (128) per core", str(rb.cdiv(rb.rows_per_core(rows, lnc), rb.P))),
        ("reduction chunks", f"{rb.cdiv(width, hb)} of {hb} columns"),
        ("prepared weights", "resident for the launch" if resident else "rebuilt per token tile and head"),
        ("row inputs", f"streamed from HBM per chunk, read {len(m.levels) + 1} times" if streamed
         else "kept in SBUF for the epilogue, read once"),
        ("HBM bytes per token (save=True)", _traffic(per_token, weights * builds / rows, minimum, resident)),
    )  # fmt: skip
    return TilePlan(
        family="rowreduce", target=target.name, lnc=lnc, dims=tuple(sorted(dims.items())),
        tiles=(("P", rb.P), ("HB", hb)), buffers=buffers,
        sbuf_bytes=rb.sbuf_bytes(low.model, width, heads, hb, resident, overlap, streamed),
        sbuf_budget=budget, psum_banks=len(m.weights) + (0 if streamed else low.psum_banks),
        psum_budget=target.psum_banks,
        hbm_bytes=(("per token", per_token), ("minimum per token", minimum), ("weights", weights * builds)),
        summary=summary,
        reasons=(*_reasons(low, width, heads, hb, resident, budget, streamed),
                 *_isolation(low, width, hb, streamed, target.psum_bytes_per_partition // 4)),  # fp32 columns
    )  # fmt: skip


def token_bytes(ir: KernelIR, m: RowReduceMatch, dims: dict[str, int], reads: int = 1) -> tuple[int, int]:
    """(HBM bytes per token the kernel moves with every output written, its row inputs read `reads` times;
    the minimum: each input read once)."""
    heads, width = m.heads.eval(dims), m.width.eval(dims)
    loads = reads * sum(
        DTYPE_BYTES[ir.node(ld.node).dtype] * width * (heads if ld.per_head else 1) for ld in m.loads
    ) + column_bytes(ir, m) * heads  # column inputs: once per token tile, streamed or not
    outs = sum(DTYPE_BYTES[o.dtype] * _elems(o.shape[1:], dims) for o in ir.outputs)
    read_once = sum(
        DTYPE_BYTES[i.dtype] * _elems(i.shape[1:], dims) for i in ir.inputs if i.shape[0] == m.rows
    )
    return loads + outs, read_once + outs


def _traffic(per_token: int, weights: float, minimum: int, resident: bool) -> str:
    """`per token + weights (how often read) = ratio x the minimum`."""
    ratio = (per_token + weights) / minimum
    how = "read once per core" if resident else "re-read per token tile"
    return (f"{per_token:,} + {weights:,.1f} of weights ({how}) = {ratio:.4f}x the minimum "
            f"{minimum:,} (each input read once)")  # fmt: skip


def _elems(shape: Shape, dims: dict[str, int]) -> int:
    total = 1
    for d in shape:
        total *= d.eval(dims)
    return total


def _reasons(low: RowReduceLowering, width: int, heads: int, hb: int, resident: bool, budget: int,
             streamed: bool) -> tuple[str, ...]:  # fmt: skip
    model = low.model
    held = model.resident_per_head * heads * width
    if resident:
        reasons = [f"prepared weights stay resident: {held:,} B/partition ({heads} heads x {width} columns)"]
    else:
        reasons = [
            f"prepared weights rebuilt per token tile and head: all heads would need {held:,} B/partition"
        ]
    if streamed:
        need = rb.sbuf_bytes(model, width, heads, rb.P, False, False)
        passes = len(low.passes.levels)
        chunks = rb.cdiv(width, hb)
        reasons.append(f"rows streamed: whole rows need {need:,} B > {budget:,} B even in 128-column "
                       f"chunks, so each of the {passes} reduction pass(es) reads {chunks} chunks of HB={hb} "
                       f"columns from HBM and the epilogue reads them again, storing each output chunk")
        return tuple(reasons)
    if hb >= width:
        reasons.append(f"HB={hb}: the whole width in one reduction pass")
    else:
        need = rb.sbuf_bytes(model, width, heads, rb.cdiv(width, rb.P) * rb.P, resident)
        reasons.append(f"HB={hb}: one full-width pass would need {need:,} B > {budget:,} B; "
                       f"{rb.cdiv(width, hb)} chunks of equal width instead")  # fmt: skip
    reasons.append("row inputs are loaded once per token tile and head and kept for the epilogue, so each "
                   "input byte crosses HBM once")  # fmt: skip
    return tuple(reasons)


def _isolation(low: RowReduceLowering, width: int, hb: int, streamed: bool, psum_columns: int
               ) -> tuple[str, ...]:  # fmt: skip
    """Whether a non-finite input stays in its token's outputs, for kernels that can stage rows on the PE."""
    if not low.model.launch_tiles:
        return ()
    staged = not streamed and (
        (low.pe_passes and hb <= psum_columns)
        or (low.pe_epilogue and (low.model.diagonals > 0 or width <= psum_columns))
    )
    if not staged:
        return ("rows kept apart at this shape (no identity matmul on them): a non-finite input element "
                "reaches only its own token's outputs",)  # fmt: skip
    return ("rows pass through the Tensor engine (identity matmuls into PSUM), as the spec declares its row "
            "inputs `finite`: there a non-finite element would make its column nan for every token of its "
            "128-token tile (0 x inf = nan), so the host refuses inf and nan in them (docs/spec-language.md)",
            )  # fmt: skip
