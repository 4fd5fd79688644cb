"""The projection family's planner: (budget model, target, LNC, concrete dims) -> an explained TilePlan."""

from __future__ import annotations

from fusegen.codegen.plan import PlanError, PlannedBuffer, TilePlan, check_lnc, machine
from fusegen.codegen.proj import budget as pb
from fusegen.dsl.ir import Dim
from fusegen.sim.targets import Target


def plan_proj(
    model: pb.ProjModel,
    target: Target,
    lnc: int,
    dims: dict[str, int],
    rows_dim: Dim,
    hidden_dim: Dim,
    width_dims: tuple[Dim, ...],
) -> TilePlan:
    """The best plan by modelled time at `dims`, with its reasons."""
    return candidates(model, target, lnc, dims, rows_dim, hidden_dim, width_dims, count=1)[0]


def candidates(
    model: pb.ProjModel,
    target: Target,
    lnc: int,
    dims: dict[str, int],
    rows_dim: Dim,
    hidden_dim: Dim,
    width_dims: tuple[Dim, ...],
    count: int = 6,
) -> list[TilePlan]:
    """The `count` best legal plans by modelled time, best first."""
    rows, k = rows_dim.eval(dims), hidden_dim.eval(dims)
    widths = tuple(w.eval(dims) for w in width_dims)
    mach = machine(target)
    check_lnc(target, lnc)
    plans = pb.candidates(model, rows, k, widths, lnc, mach.sbuf_budget)
    if not plans:
        raise PlanError(
            f"no tile plan fits on {target.name}: the smallest (S=128, NB=512, streamed weights) needs "
            f"{pb.smallest_need(model, k)} B/partition of SBUF for K={k}; the budget is {mach.sbuf_budget} B"
        )
    ranked = sorted(plans, key=lambda p: pb.rank_key(model, mach, rows, k, widths, lnc, p))[:count]
    best = pb.cost(model, mach, rows, k, widths, lnc, ranked[0])
    return [_tile_plan(model, target, mach, lnc, dims, (rows, k, widths), p, best) for p in ranked]


def _tile_plan(
    model: pb.ProjModel,
    target: Target,
    mach: pb.Machine,
    lnc: int,
    dims: dict[str, int],
    shape: tuple[int, int, tuple[int, ...]],
    p: pb.Plan,
    best: pb.Cost,
) -> TilePlan:
    rows, k, widths = shape
    c = pb.cost(model, mach, rows, k, widths, lnc, p)
    comp_rows = rows if p.split else pb.rows_per_core(rows, lnc)
    weights = k * sum(w * b for w, b in zip(widths, model.w_bytes, strict=True))
    busy = 1 if p.split else pb.cdiv(rows, comp_rows)  # cores with rows to compute
    streamed = weights * pb.cdiv(comp_rows, p.s) * busy
    engines = {"PE": c.pe, "ACT": c.act, "DVE": c.dve, "DMA": c.dma}
    bound = max(engines, key=lambda e: engines[e])
    summary = (
        ("work split", "over columns: each core all rows, its share of N" if p.split else "over rows"),
        ("rows per core", str(comp_rows)),
        ("planner's estimate (busiest core)", f"{c.total / 1000:.1f} us, bound by {bound}"),
        ("engine busy (us)", ", ".join(f"{e} {v / 1000:.1f}" for e, v in engines.items())),
        ("weight bytes streamed", f"{streamed:,} ({streamed / weights:.0f}x the {weights:,} B of weights)"),
    )
    buffers = tuple(PlannedBuffer(b.name, "sbuf", b.bytes, b.copies) for b in pb.buffers(model, p, k))
    psum = PlannedBuffer("matmul accumulators and transposes (one bank each)", "psum", 2048, pb.psum_banks(p))
    return TilePlan(
        family="proj",
        target=target.name,
        lnc=lnc,
        dims=tuple(sorted(dims.items())),
        tiles=(("S", p.s), ("NB", p.nb), ("split_n", p.split), ("stream", p.stream)),
        buffers=(*buffers, psum),
        sbuf_bytes=pb.sbuf_bytes(model, p, k),
        sbuf_budget=mach.sbuf_budget,
        psum_banks=pb.psum_banks(p),
        psum_budget=target.psum_banks,
        hbm_bytes=(("weights streamed", streamed), ("weights", weights), ("all", c.hbm_bytes)),
        summary=summary,
        reasons=_reasons(model, mach, shape, lnc, p, c, best),
        modeled_ns=c.total,
    )


def _reasons(
    model: pb.ProjModel,
    mach: pb.Machine,
    shape: tuple[int, int, tuple[int, ...]],
    lnc: int,
    p: pb.Plan,
    c: pb.Cost,
    best: pb.Cost,
) -> tuple[str, ...]:
    rows, k, widths = shape
    if c.total > best.total:
        return (f"{c.total / best.total:.2f}x the best plan's modelled time",)
    comp_rows = rows if p.split else pb.rows_per_core(rows, lnc)
    reasons = [
        f"S={p.s}: {comp_rows} rows per core in {pb.cdiv(comp_rows, p.s)} super-block(s), x^T "
        f"({pb.cdiv(k, pb.P) * p.s * model.x_bytes} B/partition) resident; each streams the weights once"
    ]
    if model.pro.sweeps:
        reasons.append(f"prologue: {model.pro.sweeps} pass(es) over K in {pb.F_MOV}-column blocks (row "
                       "statistics first); SBUF use does not grow with K")  # fmt: skip
    how = (
        f"every row tile's accumulators live at once ({pb.accumulators(p)} PSUM bank(s)), so each K-tile's "
        "piece is loaded just before its matmuls"
        if p.stream
        else "all K-tiles of a block held while the row tiles take turns"
    )
    row_bytes = p.nb * max(model.w_bytes)
    reasons.append(f"NB={p.nb}: weights in {p.nb}-column blocks, {row_bytes} B per partition row "
                   f"per DMA (the packet rule's knee is {mach.dma_row_bytes} B); {how}")  # fmt: skip
    reasons.append(f"N ({', '.join(str(w) for w in widths)}) streamed: no buffer grows with the output width")
    others = [q for q in pb.candidates(model, rows, k, widths, lnc, mach.sbuf_budget) if q != p]
    for q in sorted(others, key=lambda q: pb.rank_key(model, mach, rows, k, widths, lnc, q))[:2]:
        t = pb.cost(model, mach, rows, k, widths, lnc, q).total
        reasons.append(
            f"runner-up S={q.s}, NB={q.nb}, stream={q.stream}, split={q.split}: {t / 1000:.1f} us "
            f"against {c.total / 1000:.1f} us (ties go to less engine work, HBM traffic, SBUF)"
        )
    wider = pb.Plan(p.s + pb.P, p.nb, p.split, 0)
    if p.s < comp_rows and pb.sbuf_bytes(model, wider, k) > mach.sbuf_budget:
        reasons.append(
            f"S={wider.s} would need {pb.sbuf_bytes(model, wider, k)} B > {mach.sbuf_budget} B of SBUF"
        )
    return tuple(reasons)
