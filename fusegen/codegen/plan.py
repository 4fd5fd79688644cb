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
    """The chosen tiling of one kernel at one shape, with its budget and the reasons for it."""

    target: str
    lnc: int
    dims: tuple[tuple[str, int], ...]
    rows_per_core: int
    s: int  # row super-block
    ci: int  # intermediate chunk
    k_tiles: int  # contraction tiles of 128
    k_out_chunks: int  # down-projection output chunks of 512 (one PSUM bank)
    superblocks: tuple[int, ...]  # per core
    buffers: tuple[PlannedBuffer, ...]
    sbuf_bytes: int
    sbuf_budget: int
    psum_banks: int
    psum_budget: int
    weight_bytes_streamed: int
    weight_bytes: int
    reasons: tuple[str, ...]


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
    buffers = tuple(PlannedBuffer(b.name, "sbuf", b.bytes, b.copies) for b in fb.buffers(model, s, ci, k, i))
    psum = PlannedBuffer("matmul accumulators (one bank each)", "psum", 2048, banks)
    return TilePlan(
        target=target.name, lnc=lnc, dims=tuple(sorted(dims.items())), rows_per_core=per_core, s=s, ci=ci,
        k_tiles=fb.cdiv(k, fb.P), k_out_chunks=fb.cdiv(k, fb.F_MOV), superblocks=superblocks,
        buffers=(*buffers, psum), sbuf_bytes=fb.sbuf_bytes(model, s, ci, k, i), sbuf_budget=budget,
        psum_banks=banks, psum_budget=target.psum_banks,
        weight_bytes_streamed=weight_bytes * sum(superblocks), weight_bytes=weight_bytes,
        reasons=_reasons(model, budget, s, ci, k, i, per_core),
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
