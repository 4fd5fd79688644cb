"""The tile planner: (budget model, target, LNC, concrete dims) -> a frozen, explained TilePlan.

It enumerates legal plans (SBUF budget, PSUM banks) and picks the best by the FFN kernel's
closed-form time model (`ffn_budget.cost`); `candidates()` returns the runner-up plans for `explain`.
"""

from __future__ import annotations

from dataclasses import dataclass

from fusegen.codegen.ffn import budget as fb
from fusegen.codegen.ffn import sbuf as fs
from fusegen.perf.cost import ASSUMED, DMA_FIXED_NS, DMA_QUEUES, PE_COLD_UTILISATION, PE_RAMP_NS
from fusegen.perf.roofline import hbm_bytes_per_ns
from fusegen.sim.targets import Target


class PlanError(Exception):
    """No tile plan fits the target; the message has the numbers."""


@dataclass(frozen=True)
class PlannedBuffer:
    """One buffer of the plan: bytes per partition per copy, copies in flight."""

    name: str
    memory: str  # "sbuf" | "psum"
    bytes: int
    copies: int


@dataclass(frozen=True)
class TilePlan:
    """The chosen tiling of one kernel at one shape, its budget, traffic and the reasons for it.

    Family-neutral: a family's tile sizes go in `tiles`, anything else worth showing in `summary`.
    """

    family: str
    target: str
    lnc: int
    dims: tuple[tuple[str, int], ...]
    tiles: tuple[tuple[str, int], ...]  # e.g. (("S", 1024), ("CI", 512), ("split_i", 0))
    buffers: tuple[PlannedBuffer, ...]
    sbuf_bytes: int
    sbuf_budget: int
    psum_banks: int
    psum_budget: int
    hbm_bytes: tuple[tuple[str, int], ...]  # modelled HBM traffic by kind, e.g. weights streamed
    summary: tuple[tuple[str, str], ...]  # further pre-formatted rows for plan.md
    reasons: tuple[str, ...]
    modeled_ns: float = 0.0

    def tile(self, name: str) -> int:
        """The tile size `name`."""
        return dict(self.tiles)[name]

    def traffic(self, kind: str) -> int:
        """Modelled HBM bytes of `kind`."""
        return dict(self.hbm_bytes)[kind]


def lnc_degrees(target: Target) -> tuple[int, ...]:
    """Logical-core degrees a launch on `target` may use: LNC=2 pairs NeuronCore-v3+ cores (Trn2/Trn3
    only, [SDK: logical-neuroncore-config.rst]); trn1 launches LNC=1."""
    return tuple(range(1, target.max_lnc + 1))


def check_lnc(target: Target, lnc: int) -> None:
    """PlanError unless `lnc` is one of `target`'s degrees."""
    if lnc not in lnc_degrees(target):
        allowed = " or ".join(str(d) for d in lnc_degrees(target))
        raise PlanError(f"LNC={lnc} needs NeuronCore-v3 core pairs; {target.name} runs LNC={allowed} only "
                        f"(--lnc {lnc_degrees(target)[-1]})")  # fmt: skip


def machine(target: Target) -> fb.Machine:
    """The time model's figures for `target` (PlanError if the target table lacks them)."""
    pe, act, dve = target.tensor_clock_ghz, target.scalar_clock_ghz, target.vector_clock_ghz
    hbm, dma = target.hbm_gbps_per_chip, target.dma_gbps_per_core
    if pe is None or act is None or dve is None or hbm is None or dma is None:  # trn3's figures are unknown
        raise PlanError(f"the target table has no clock or bandwidth figures for {target.name} yet")
    throttled = target.nc_version >= 3 and ASSUMED.pe_throttle
    return fb.Machine(
        pe_ghz=pe,
        act_ghz=act,
        dve_ghz=dve,
        dma_gbps=min(dma, hbm_bytes_per_ns(target)),  # GB/s == bytes/ns
        dma_fixed_ns=DMA_FIXED_NS,
        dma_queues=DMA_QUEUES,
        dma_row_bytes=ASSUMED.dma_row_bytes,
        sbuf_budget=target.sbuf_usable_bytes,
        max_lnc=target.max_lnc,
        # the dI/dt ramp (cost.pe_utilisation_limit): utilisation rises linearly from the cold share to
        # full over PE_RAMP_NS, so a burst longer than the ramp loses PE_RAMP_NS * (1 - cold) / 2
        pe_ramp_ns=PE_RAMP_NS * (1 - PE_COLD_UTILISATION) / 2 if throttled else 0.0,
    )


def plan_ffn(
    model: fs.FfnModel, target: Target, lnc: int, dims: dict[str, int], roles: tuple[str, str, str]
) -> TilePlan:
    """Plan an FFN kernel; `roles` names the (rows, hidden, inter) dims."""
    return candidates(model, target, lnc, dims, roles, count=1)[0]


def candidates(
    model: fs.FfnModel,
    target: Target,
    lnc: int,
    dims: dict[str, int],
    roles: tuple[str, str, str],
    count: int = 6,
) -> list[TilePlan]:
    """The `count` best legal plans by modelled time, best first, each with its reasons."""
    rows, k, i = (dims[r] for r in roles)
    mach = machine(target)
    check_lnc(target, lnc)
    banks = fs.psum_banks(model)
    if banks > target.psum_banks:
        raise PlanError(f"the kernel needs {banks} PSUM banks; {target.name} has {target.psum_banks}")
    plans = fb.candidates(model, rows, k, i, lnc, mach.sbuf_budget)
    if not plans:
        need = fs.smallest_need(model, k, i)
        raise PlanError(
            f"no tile plan fits on {target.name}: the smallest (S=128, CI=128) needs {need} "
            f"B/partition of SBUF for K={k}, I={i}; the budget is {fb.plannable(mach.sbuf_budget)} B "
            f"with {fs.SBUF_HEADROOM} B kept free ({_widest_k(model, i, fb.plannable(mach.sbuf_budget))})"
        )
    ranked = sorted(plans, key=lambda p: fb.rank_key(model, mach, rows, k, i, lnc, p))[:count]
    best = fb.cost(model, mach, rows, k, i, lnc, ranked[0])
    return [_tile_plan(model, target, mach, lnc, dims, (rows, k, i), p, best) for p in ranked]


def _widest_k(model: fs.FfnModel, i: int, budget: int) -> str:
    """The limit in words: the widest K (a multiple of 128) whose smallest plan fits at this I."""
    k = fb.P
    if fs.smallest_need(model, k, i) > budget:
        return f"no K fits at I={i}"
    while fs.smallest_need(model, k + fb.P, i) <= budget:
        k += fb.P
    return f"this kernel fits K <= {k} at I={i} here"


def _tile_plan(
    model: fs.FfnModel,
    target: Target,
    mach: fb.Machine,
    lnc: int,
    dims: dict[str, int],
    shape: tuple[int, int, int],
    p: fs.Plan,
    best: fb.Cost,
) -> TilePlan:
    rows, k, i = shape
    c = fb.cost(model, mach, rows, k, i, lnc, p)
    comp_rows, inter = fs.work_per_core(rows, i, lnc, p.split)
    weights = (model.n_up * model.up_bytes + model.down_bytes) * k * i
    cores = lnc if not p.split else 1  # with the I split, each weight byte is read by one core
    streamed = weights * fb.cdiv(comp_rows, p.s) * cores
    engines = {"PE": c.pe, "ACT": c.act, "DVE": c.dve, "DMA": c.dma}
    if c.chain:  # what the kernel's program order puts in series (ffn_budget: fill, chunks, drain)
        engines["program order"] = c.chain
    bound = max(engines, key=lambda e: engines[e])
    summary = (
        ("work split", _SPLITS[p.split]),
        ("rows / intermediate columns per core", f"{comp_rows} / {inter}"),
        ("planner's estimate (busiest core)", f"{c.total / 1000:.1f} us, bound by {bound}"),
        ("engine busy (us)", ", ".join(f"{e} {v / 1000:.1f}" for e, v in engines.items())),
        ("weight bytes streamed", f"{streamed:,} ({streamed / weights:.0f}x the {weights:,} B of weights)"),
    )
    planned = fs.buffers(model, p.s, p.ci, k, i, p.kc, p.g, p.split, p.ht)
    buffers = tuple(PlannedBuffer(b.name, "sbuf", b.bytes, b.copies) for b in planned)
    psum = PlannedBuffer("matmul accumulators (one bank each)", "psum", 2048, fs.psum_banks(model, p.kc))
    return TilePlan(
        family="ffn",
        target=target.name,
        lnc=lnc,
        dims=tuple(sorted(dims.items())),
        tiles=(("S", p.s), ("CI", p.ci), ("split_i", p.split), ("KC", p.kc), ("G", p.g), ("HT", p.ht)),
        buffers=(*buffers, psum),
        sbuf_bytes=fs.plan_bytes(model, p, k, i),
        sbuf_budget=mach.sbuf_budget,
        psum_banks=fs.psum_banks(model, p.kc),
        psum_budget=target.psum_banks,
        hbm_bytes=(("weights streamed", streamed), ("weights", weights), ("all", c.hbm_bytes)),
        summary=summary,
        reasons=_reasons(model, mach, shape, lnc, p, c, best),
        modeled_ns=c.total,
    )


def _reasons(
    model: fs.FfnModel,
    mach: fb.Machine,
    shape: tuple[int, int, int],
    lnc: int,
    p: fs.Plan,
    c: fb.Cost,
    best: fb.Cost,
) -> tuple[str, ...]:
    rows, k, i = shape
    if c.total > best.total:
        return (f"{c.total / best.total:.2f}x the best plan's modelled time",)
    comp_rows, _ = fs.work_per_core(rows, i, lnc, p.split)
    n_sb = fb.cdiv(comp_rows, p.s)
    reasons = [
        f"S={p.s}: {comp_rows} rows per core in {n_sb} super-block(s); each one streams the weights once"
    ]
    reasons += [
        f"{what}: {stage.sweeps} pass(es) over K in {fb.F_MOV}-column blocks (row statistics first), "
        f"{stage.block_bytes * fb.F_MOV} B per block in flight: SBUF use does not grow with K"
        for what, stage in (("prologue", model.pro), ("epilogue", model.epi))
        if stage.sweeps
    ]
    reasons.append(_up_groups(model, mach, p, k))
    reasons.append(_down_projection(model, mach, shape, lnc, p, c))
    wider = p.ci + fb.P
    budget = fb.plannable(mach.sbuf_budget)
    need = fs.sbuf_bytes(model, p.s, wider, k, i, p.kc, 0, p.split)
    if wider <= fb.cdiv(i, fb.P) * fb.P and need > budget:
        reasons.append(f"CI={p.ci}: CI={wider} would need {need} B > {budget} B of SBUF (the headroom kept)")
    if lnc > 1:
        reasons.append(_split_reason(model, mach, shape, lnc, p, c))
    return tuple(reasons)


#: what each work split of an FFN plan (Plan.split) does, as plan.md says it, and its short name
_SPLITS = {
    0: "over rows",
    1: "over I: each core all rows, its share of I; partial sums through shared HBM behind a core barrier",
    2: "over I: each core all rows, its share of I; partial sums exchanged core to core (sendrecv)",
    3: "over I: each core all rows, an even share of I, and the odd I-tile for its own rows; partial sums "
    "exchanged core to core (sendrecv)",
}
_SPLIT_NAMES = {
    0: "row split",
    1: "I split through HBM",
    2: "I split with the core-to-core exchange",
    3: "I split with the exchange, the odd I-tile per owner",
}


def _split_reason(
    model: fs.FfnModel, mach: fb.Machine, shape: tuple[int, int, int], lnc: int, p: fs.Plan, c: fb.Cost
) -> str:
    """Why this work split: each other split's modelled time (the same tiles, the SBUF accumulator)."""
    rows, k, i = shape
    others = []
    for split in fb.splits(i, lnc):
        # splits 2 and 3: one row slice per super-block; 3: one super-block
        if split != p.split and not (split >= 2 and p.s > fb.F_MOV) and not (split == 3 and p.s < rows):
            t = fb.cost(model, mach, rows, k, i, lnc, fs.Plan(p.s, p.ci, split, 0, p.g)).total
            others.append(f"the {_SPLIT_NAMES[split]} {t / 1000:.1f} us")
    why = ""
    if p.split == 2 and fs.k_halves(model, rows, k, lnc, p.split):
        why = ("; one row tile, so each core finishes half of K: the other half's partial sums leave SBUF to "
               "SBUF in one exchange each way, no HBM round trip, no barrier")  # fmt: skip
    elif p.split == 2:
        why = ("; the exchange sends each K-block of the last chunk's partial sums SBUF to SBUF while the "
               "next block's matmuls run: no HBM round trip, no barrier")  # fmt: skip
    return f"{_SPLIT_NAMES[p.split]}: {c.total / 1000:.1f} us against {', '.join(others)}{why}"


def _up_groups(model: fs.FfnModel, mach: fb.Machine, p: fs.Plan, k: int) -> str:
    """How the up weights move: G K-tiles of one I-tile per DMA, from the host's layout."""
    g = fs.group(k, p.g)
    moved = g * fb.P * model.up_bytes
    how = ("streamed, one group per projection in SBUF at a time (one row slice, one intermediate tile)"
           if fs.streams_up(p.s, p.ci) else "the whole chunk held")  # fmt: skip
    return (f"up weights: {g} of {fb.cdiv(k, fb.P)} K-tiles of one I-tile per DMA ({moved} B contiguous per "
            f"partition row from the host layout; the packet rule's knee is {mach.dma_row_bytes} B), {how}")


def _down_projection(
    model: fs.FfnModel, mach: fb.Machine, shape: tuple[int, int, int], lnc: int, p: fs.Plan, c: fb.Cost
) -> str:
    """Why this down-projection structure: the other one's modelled time, or the SBUF it would need."""
    rows, k, i = shape
    other = fs.Plan(p.s, p.ci, p.split, 0 if p.kc else fs.column_block(p.s, k), p.g)
    if p.kc:
        where = "stays in SBUF" if p.ht else "goes to an HBM scratch"
        what = (f"column blocks of KC={p.kc}: h^T {where}, each block of the down-projection "
                f"accumulates all of I in {fs.ACC_BANKS} PSUM banks and is evicted once")  # fmt: skip
        alt = "the SBUF accumulator"
    else:
        what = "an SBUF accumulator of S x K fp32, each chunk's down-projection evicted into it"
        alt = "column blocks"
    if not p.kc and (p.split or p.s > fs.ACC_BANKS * fb.P):
        return f"{what} (column blocks need S <= {fs.ACC_BANKS * fb.P} and a split over rows)"
    need = fs.plan_bytes(model, other, k, i)
    if need > fb.plannable(mach.sbuf_budget):
        return f"{what}; {alt} would need {need} B > {fb.plannable(mach.sbuf_budget)} B of SBUF here"
    t = fb.cost(model, mach, rows, k, i, lnc, other).total
    return f"{what}; {alt} models {t / 1000:.1f} us against {c.total / 1000:.1f} us"
