"""Column-blocked FFN plans (KC > 0): each down-projection piece's way out of PSUM (the eviction), what the
fp32 scratch the statistics passes read is, and the first statistics pass folded into the eviction."""

from __future__ import annotations

from dataclasses import replace

from fusegen.codegen.blocks import BlockedStage, BlockPass, block_reduction, emit_blocked, spine, walk
from fusegen.codegen.family import kernel_arg
from fusegen.codegen.ffn.match import FfnMatch
from fusegen.codegen.rowstage import (
    OutputWrite,
    block_selector,
    dma_write,
    output_writes,
    row_builder,
    row_leaves,
)
from fusegen.codegen.select import Selector
from fusegen.codegen.stage import Operand
from fusegen.dsl.ir import Dim, KernelIR


def binds(ps: BlockPass) -> tuple[str, ...]:
    """Lines naming row tile `rs`'s running columns of pass `ps`, kept in the kernel's `folded` list."""
    return tuple(f"{name} = folded[rs][{n}]" for n, name in enumerate(ps.running))


def scratch_tensor(ir: KernelIR, saved: int) -> tuple[str, str]:
    """What the column-blocked kernel's `_acc_hbm` is, and the output it is ("" for none): the f32 [R, K]
    output holding the evicted node, when there is one (the evictions write it, the statistics passes read
    it back, the last pass writes it no more), else a scratch of its own."""
    for out in ir.outputs:
        if out.node == saved and out.dtype == "f32" and out.shape[-1] != Dim.const(1):
            return kernel_arg(str(out.name)), kernel_arg(str(out.name))
    return "nl.ndarray((R, K), dtype=nl.float32, buffer=nl.shared_hbm)", ""


def with_pass(evict: BlockedStage, ps: BlockPass) -> BlockedStage:
    """The eviction with `ps` (a statistics pass over the evicted value, no loads) after its lines."""
    ev, st = evict.passes[0], evict.model
    model = st._replace(
        block_bytes=st.block_bytes + ps.block_bytes - 4 * len(ps.loads),
        act=st.act + ps.act,
        dve=st.dve + ps.dve,
        col_ops=st.col_ops + len(ps.running),
    )
    return BlockedStage((replace(ev, lines=ev.lines + binds(ps) + ps.lines),), model)


def lower_eviction(
    ir: KernelIR, m: FfnMatch, inputs: dict[str, tuple[str, ...]]
) -> tuple[BlockedStage, int | None, str]:
    """Column-blocked plans: each [P, F_MOV] piece of the down-projection leaves PSUM once, so the
    elementwise spine above it (e.g. `+ b2 + a`, LayerScale's `a + ls * y`) is computed on the way out
    and that value written to `_acc_hbm`; returns the eviction and the IR node `_acc_hbm` then holds.
    An epilogue without row statistics or [R, 1] inputs runs whole in the eviction, which writes the
    outputs (node None: no scratch, no epilogue after it); and the code of the evicted value's f32 tile."""
    leaves, loads = row_leaves(ir, m.epi_nodes, inputs, skip=None)
    leaves[m.down.id] = Operand("tile", "acc_ps[rs * n_kp + kp][0:pr, 0:nb]", memory="psum")
    builder = row_builder(ir, m.hidden, leaves)
    exprs = [builder.expr(out.node) for out in ir.outputs]
    if not inputs["vec"] and not any(block_reduction(e) for e in walk(exprs)):
        whole = output_writes(ir.outputs, exprs, [])
        return emit_blocked(block_selector("v"), exprs, loads, whole, writes=len(ir.outputs)), None, ""
    node_of = {id(e): nid for nid, e in builder.exprs.items()}
    chain = [e for e in spine(exprs, builder.exprs[m.down.id]) if id(e) in node_of]  # IR values only
    top = chain[-1] if chain else builder.exprs[m.down.id]
    evicted = []

    def finish(sel: Selector) -> list[str]:
        value = sel.value(top)
        if value.memory == "psum":  # a bare copy out of PSUM: on the Scalar engine, idle in this loop
            value = sel.convert(value, "f32")
        evicted.append(value.code)
        return [dma_write("_acc_hbm", "k0:k0 + nb", value.code)]

    stage = emit_blocked(block_selector("v"), [top], loads, finish, writes=1)
    assert len(stage.passes) == 1 and not stage.passes[0].before, "an eviction needs no statistics"
    return stage, node_of[id(top)], evicted[0]


def deferred_writes(stage: BlockedStage, writes: tuple[OutputWrite, ...]) -> BlockedStage:
    """The stage with its last pass's [R, K] output writes each issued one block late, after the next
    block's loads and compute: a write waits for its block's compute, and in the DMA queues it would hold
    back the next block's loads (the last block's writes follow the loop). Same instructions."""
    last, rows = stage.passes[-1], [w for w in writes if w.shape == "(R, K)"]
    now = {w.line() for w in rows}
    assert now <= set(last.lines) and all(w.source == f"{w.tile}[0:pr, 0:nb]" for w in rows)
    held = ", ".join(w.tile for w in rows)
    late = [f"wk0, wnb, {', '.join(f'w{n}' for n in range(len(rows)))} = pend"]
    late += [dma_write(w.name, "wk0:wk0 + wnb", f"w{n}[0:pr, 0:wnb]") for n, w in enumerate(rows)]
    lines = [line for line in last.lines if line not in now]
    lines += ["if k0 > 0:  # the previous block's writes, behind this block's loads"]
    lines += [f"    {line}" for line in late]
    lines += [f"pend = [k0, nb, {held}]"]
    passes = (*stage.passes[:-1], replace(last, lines=tuple(lines), after=tuple(late)))
    return replace(stage, passes=passes)
