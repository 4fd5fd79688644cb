"""The tile planner: (budget model, target, LNC, concrete dims) -> a frozen, explained TilePlan."""

from __future__ import annotations

from dataclasses import dataclass

from fusegen.codegen import ffn_budget as fb
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
    tiles: tuple[tuple[str, int], ...]  # e.g. (("S", 1024), ("CI", 512))
    buffers: tuple[PlannedBuffer, ...]
    sbuf_bytes: int
    sbuf_budget: int
    psum_banks: int
    psum_budget: int
    hbm_bytes: tuple[tuple[str, int], ...]  # modelled HBM traffic by kind, e.g. weights streamed
    summary: tuple[tuple[str, str], ...]  # further pre-formatted rows for plan.md
    reasons: tuple[str, ...]

    def tile(self, name: str) -> int:
        """The tile size `name`."""
        return dict(self.tiles)[name]

    def traffic(self, kind: str) -> int:
        """Modelled HBM bytes of `kind`."""
        return dict(self.hbm_bytes)[kind]


def plan_ffn(model: fb.FfnModel, target: Target, lnc: int, dims: dict[str, int], roles: tuple[str, str, str]) -> TilePlan:
    """Plan an FFN kernel; `roles` names the (rows, hidden, inter) dims."""
    rows, k, i = (dims[r] for r in roles)
    budget = target.sbuf_usable_bytes
    try:
        s, ci = fb.choose(model, rows, k, i, lnc, budget)
    except ValueError as err:
        raise PlanError(f"{err} on {target.name}") from None
    banks = fb.psum_banks(model)
    if banks > target.psum_banks:
        raise PlanError(f"the kernel needs {banks} PSUM banks; {target.name} has {target.psum_banks}")
    per_core = fb.rows_per_core(rows, lnc)
    core_rows = [max(0, min(per_core, rows - c * per_core)) for c in range(lnc)]
    superblocks = tuple(fb.cdiv(r, s) for r in core_rows)
    weight_bytes = (model.n_up + 1) * k * i * model.x_bytes
    streamed = weight_bytes * sum(superblocks)
    buffers = tuple(PlannedBuffer(b.name, "sbuf", b.bytes, b.copies) for b in fb.buffers(model, s, ci, k, i))
    psum = PlannedBuffer("matmul accumulators (one bank each)", "psum", 2048, banks)
    summary = (
        ("rows per core", str(per_core)),
        ("super-blocks per core", ", ".join(str(n) for n in superblocks)),
        ("K tiles (128) / output chunks (512)", f"{fb.cdiv(k, fb.P)} / {fb.cdiv(k, fb.F_MOV)}"),
        ("weight bytes streamed", f"{streamed:,} ({streamed / weight_bytes:.0f}x the {weight_bytes:,} B of weights)"),
    )  # fmt: skip
    return TilePlan(
        family="ffn", target=target.name, lnc=lnc, dims=tuple(sorted(dims.items())),
        tiles=(("S", s), ("CI", ci)), buffers=(*buffers, psum),
        sbuf_bytes=fb.sbuf_bytes(model, s, ci, k, i), sbuf_budget=budget, psum_banks=banks,
        psum_budget=target.psum_banks, hbm_bytes=(("weights streamed", streamed), ("weights", weight_bytes)),
        summary=summary, reasons=_reasons(model, budget, s, ci, k, i, per_core),
    )  # fmt: skip


def _reasons(model: fb.FfnModel, budget: int, s: int, ci: int, k: int, i: int, per_core: int) -> tuple[str, ...]:
    n_sb = fb.cdiv(per_core, s)
    first = (
        f"S={s}: a core's {per_core} rows fit one super-block, so each weight byte is streamed once per core"
        if n_sb == 1
        else f"S={s}: {per_core} rows need {n_sb} super-blocks; one more super-block row tile does not fit"
    )
    reasons = [first]
    wider = ci + fb.P
    if wider <= fb.cdiv(i, fb.P) * fb.P:
        need = fb.sbuf_bytes(model, s, wider, k, i)
        reasons.append(f"CI={ci}: the widest chunk that fits; CI={wider} would need {need} B > {budget} B")
    else:
        reasons.append(f"CI={ci}: all of I in one chunk")
    if n_sb > 1:
        bigger = fb.cdiv(fb.cdiv(per_core, n_sb - 1), fb.P) * fb.P
        need = fb.sbuf_bytes(model, bigger, fb.P, k, i)
        reasons.append(f"{n_sb - 1} super-blocks would need S={bigger}: {need} B > {budget} B even at CI=128")
    return tuple(reasons)
