"""Lowering of a matched FFN: the combine and the epilogue compiled into the template's hook points."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from fusegen.codegen.blocks import (
    BlockedStage,
    BlockLoad,
    BlockPass,
    emit_blocked,
    fold_first,
)
from fusegen.codegen.budget_base import NO_STAGE
from fusegen.codegen.engines import GPSIMD
from fusegen.codegen.family import kernel_arg
from fusegen.codegen.ffn.columns import binds, deferred_writes, lower_eviction, scratch_tensor, with_pass
from fusegen.codegen.ffn.match import FfnMatch
from fusegen.codegen.ffn.sbuf import FfnModel
from fusegen.codegen.matmul_match import weight_columns
from fusegen.codegen.rowstage import (
    OutputWrite,
    block_selector,
    lower_prologue,
    output_writes,
    row_builder,
    row_leaves,
    row_stage_inputs,
    stage_inputs,
    transpose_block,
)
from fusegen.codegen.select import Layout, Selector
from fusegen.codegen.select_tables import NL_DTYPE
from fusegen.codegen.stage import Expr, Operand, StageBuilder, dim_source
from fusegen.dsl.ir import DTYPE_BYTES, Dim, KernelIR, Node, OutputDecl


@dataclass(frozen=True)
class Projection:
    """One up projection: its weight (kernel argument), its PSUM tile name and, for columns of a packed
    weight, the source of the first column ("" for a whole input) and the kernel's first I-tile of this
    projection in the weight's host layout (`_up_layout` stacks a packed weight's projections; "" for 0)."""

    weight: str
    psum: str
    first_column: str = ""
    tile_base: str = ""


@dataclass(frozen=True)
class FfnLowering:
    """Everything the FFN template formats: names, hook-point code, the budget model."""

    x: str
    x_nl_dtype: str  # x^T's and the combine output h's dtype
    up_nl_dtype: str  # the up weights' (fp8 weights: their own, x stays 16-bit)
    down_nl_dtype: str  # the down weight's
    x_transpose: tuple[str, ...]  # x's staged K-block `x_blk` into x^T (the path without a prologue)
    down_weight: str
    projections: tuple[Projection, ...]
    col_vectors: tuple[str, ...]  # [I] inputs, host-packed side by side into one [P, n * n_h] input
    row_columns: tuple[str, ...]  # [R, 1] inputs of the epilogue, loaded once per row tile
    acc_init_dma: str | None  # [R, K] input the accumulator starts from
    first_chunk: tuple[str, ...]  # code folding the first chunk's down-projection into the accumulator
    mid_lines: tuple[str, ...]
    mid_result: str  # tile name holding the combine, the down-projection's stationary operand
    epilogue: BlockedStage
    epilogue_per_block: bool  # one pass, nothing before its blocks: each block's can follow its last sums
    epilogue_block: BlockedStage | None  # that pass over a block tile `blk`, not the accumulator's block
    late_add: BlockedStage | None  # over `blk + acc`, a cast only: the add writes it (`_lower_received`)
    outputs: tuple[OutputWrite, ...]
    model: FfnModel
    prologue: BlockedStage | None = None
    epilogue_cols: BlockedStage | None = None  # column-blocked plans' epilogue (None: the eviction's)
    evict: BlockedStage | None = None  # their PSUM eviction of each down-projection piece
    # the epilogue's first statistics pass over each evicted piece, its running columns kept per row tile
    folded: BlockPass | None = None
    scratch: str = ""  # the fp32 [R, K] tensor the evictions write and the statistics passes read

    def folded_binds(self) -> tuple[str, ...]:
        """Lines naming row tile `rs`'s running columns the evictions accumulate (`folded`)."""
        return binds(self.folded) if self.folded else ()


def lower_ffn(ir: KernelIR, m: FfnMatch) -> FfnLowering:
    """Compile the prologue, the combine and the epilogue of `m` into NKI lines for the template."""
    projections = _stacked(tuple(_projection(ir, u, f"pj{i}") for i, u in enumerate(m.ups)))
    mid, mid_result, col_vectors = _lower_combine(ir, m, projections)
    epi_inputs = row_stage_inputs(ir, m.epi_nodes, m.rows, m.hidden)
    acc_init, first_chunk, acc_node = _accumulator(ir, m, epi_inputs)
    epilogue, outputs = _lower_epilogue(ir, m, epi_inputs, acc_node, acc_init)
    evict, epilogue_cols, folded, scratch = _column_epilogue(ir, m, epi_inputs)
    prologue = lower_prologue(ir, m.x, m.prologue_nodes, m.rows, m.hidden)
    model = FfnModel(
        n_up=len(m.ups),
        x_bytes=DTYPE_BYTES[m.x.dtype],
        mid_tiles=_count(mid, "tile"),
        col_vectors=len(col_vectors),
        out_bytes=sum(DTYPE_BYTES[o.dtype] for o in ir.outputs if o.shape[-1] != Dim.const(1)),
        mid_act=mid.passes("act"),
        mid_dve=mid.passes("dve"),
        acc_init=int(acc_init is not None),
        fold_bias=int(len(first_chunk) > 1),
        epi=epilogue.model,
        pro=prologue.model if prologue else NO_STAGE,
        epi_cols=epilogue_cols.model if epilogue_cols else NO_STAGE,
        evict=evict.model,
        folded=len(folded.running) if folded else 0,
        evict_rows=sum(1 for ld in evict.passes[0].loads if not ld.broadcast),
        up_bytes=DTYPE_BYTES[_up_dtype(ir, m)],
        down_bytes=DTYPE_BYTES[ir.node(m.down.args[1]).dtype],
        # K halves need each block's epilogue alone, and no residual the accumulator starts from (it would
        # reach the owner twice: in its own accumulator and in the other core's sums)
        halves=int(_per_block(epilogue, epi_inputs["vec"]) and acc_init is None),
    )
    down_weight = ir.node(m.down.args[1])
    per_block = _per_block(epilogue, epi_inputs["vec"])
    over_block = _lower_epilogue(ir, m, epi_inputs, acc_node, acc_init, block=True)[0]
    return FfnLowering(
        x=kernel_arg(str(m.source.name)),
        x_nl_dtype=NL_DTYPE[m.x.dtype],
        up_nl_dtype=NL_DTYPE[_up_dtype(ir, m)],
        down_nl_dtype=NL_DTYPE[down_weight.dtype],
        x_transpose=transpose_block("x_blk", NL_DTYPE[m.x.dtype], alternate=True),
        down_weight=kernel_arg(str(down_weight.name)),
        projections=projections,
        col_vectors=col_vectors,
        row_columns=epi_inputs["vec"],
        acc_init_dma=acc_init,
        first_chunk=first_chunk,
        mid_lines=tuple(mid.lines),
        mid_result=mid_result,
        epilogue=epilogue,
        epilogue_per_block=per_block,
        epilogue_block=over_block if per_block else None,
        late_add=_lower_received(ir, m, epi_inputs, acc_node, acc_init) if per_block else None,
        outputs=outputs,
        model=model,
        prologue=prologue,
        epilogue_cols=epilogue_cols,
        evict=evict,
        folded=folded,
        scratch=scratch,
    )


def _up_dtype(ir: KernelIR, m: FfnMatch) -> str:
    """The up weights' dtype (the matcher checked they share one)."""
    return ir.node(m.ups[0].args[1]).dtype


def _count(sel: Selector, kind: str) -> int:
    return sum(1 for _, k, _ in sel.tiles if k == kind)


def _per_block(epilogue: BlockedStage, row_columns: tuple[str, ...]) -> bool:
    """Whether each K-block's epilogue can run as soon as its sums are final: one pass, nothing to do
    before its blocks (no row statistics) and no [R, 1] columns to load first."""
    return len(epilogue.passes) == 1 and not epilogue.passes[0].before and not row_columns


def _projection(ir: KernelIR, up: Node, psum: str) -> Projection:
    columns = weight_columns(ir, ir.node(up.args[1]))
    assert columns is not None  # the matcher checked
    source, first = columns
    return Projection(kernel_arg(str(source.name)), psum, "" if first == Dim.const(0) else dim_source(first))


def _stacked(projections: tuple[Projection, ...]) -> tuple[Projection, ...]:
    """Each projection's first I-tile in its weight's host layout: the projections reading one packed
    weight are stacked in order, `_cdiv(I, _P)` I-tiles each."""
    out: list[Projection] = []
    seen: dict[str, int] = {}
    for pj in projections:
        slot = seen[pj.weight] = seen.get(pj.weight, -1) + 1
        out.append(Projection(pj.weight, pj.psum, pj.first_column, f"{slot} * _cdiv(I, _P)" if slot else ""))
    return tuple(out)


def _lower_combine(
    ir: KernelIR, m: FfnMatch, projections: tuple[Projection, ...]
) -> tuple[Selector, str, tuple[str, ...]]:
    leaves: dict[int, Operand] = {}
    for up, pj in zip(m.ups, projections, strict=True):
        leaves[up.id] = Operand("tile", f"{pj.psum}[0:ph, 0:cw]", memory="psum")
    cols = tuple(kernel_arg(n.name) for n in stage_inputs(ir, m.mid_nodes) if n.name)
    for nid in m.mid_nodes:
        node = ir.node(nid)
        if node.op == "input":  # vector j: the packed input's columns from j * n_h, in SBUF as `i_cols`
            j = cols.index(kernel_arg(str(node.name)))
            col = f"hg + {j} * _cdiv(I, _P)" if j else "hg"
            leaves[nid] = Operand("vec", f"i_cols[0:ph, {col}:{col} + 1]")

    def kind_of(node: Node) -> str:
        return "scalar" if node.shape == () else ("tile" if node.shape == (m.rows, m.inter) else "vec")

    builder = StageBuilder(ir, leaves, kind_of, free_size=lambda n: m.rows)
    sel = Selector(Layout(part="ph", free="cw", free_alloc="fw"), prefix="m")  # fw: the kernel's slice width
    weight_dtype = m.combine.dtype  # the down-projection's stationary: x's dtype (the matcher checked)
    result = sel.value(builder.expr(m.combine.id), dtype=weight_dtype)
    if result.memory != "sbuf" or result.dtype != weight_dtype:
        result = sel.copy(result, "tile", weight_dtype)
    return sel, result.code.split("[")[0], cols


def _accumulator(
    ir: KernelIR, m: FfnMatch, inputs: dict[str, tuple[str, ...]]
) -> tuple[str | None, tuple[str, ...], int]:
    """How the fp32 accumulator starts, and which node it holds after the last chunk.

    An input added straight to the down-projection is folded in for free: an [R, K] residual is
    DMA'd into the accumulator before the first chunk, a [K] bias is added while evicting the first
    chunk from PSUM (which costs one pass either way; the bias comes in one [P, F_MOV] piece a time).
    """
    acc = "acc[rs][0:pr, k0:k0 + nk]"
    ps = "ps[0:pr, 0:nk]"
    add = f"nisa.tensor_tensor(dst={acc}, data1={acc}, data2={ps}, op=nl.add)"
    users = ir.users(m.down.id)
    outputs = {o.node for o in ir.outputs}
    # fold only when nothing else reads what the fold hides: the bare down-projection (an output, or
    # another user) or the partner input (a residual the epilogue reads again)
    # (`d + d` has no partner to fold)
    partners = [a for a in users[0].args if a != m.down.id] if len(users) == 1 else []
    if partners and users[0].op == "add" and users[0].id in m.epi_nodes and m.down.id not in outputs:
        partner = ir.node(partners[0])
        used_once = partner.op == "input" and _epilogue_users(ir, m, partner) == [users[0].id]
        name = kernel_arg(str(partner.name)) if used_once else None
        if name in inputs["tile"]:
            return name, (add,), users[0].id
        if name in inputs["row"]:
            return (
                None,
                (
                    "if k0 == s0:  # the bias of the block's span, in one load",
                    "    bias = nl.ndarray((_P, sw), dtype=nl.float32, buffer=nl.sbuf)",
                    f"    nisa.dma_copy(dst=bias[0:pr, 0:sw], src={name}.ap(pattern=[[0, pr], [1, sw]], "
                    "offset=s0))",
                    f"nisa.tensor_tensor(dst={acc}, data1={ps}, data2=bias[0:pr, k0 - s0:k0 - s0 + nk], "
                    "op=nl.add)",
                ),
                users[0].id,
            )
    return None, (f"nisa.tensor_copy(dst={acc}, src={ps})",), m.down.id


def _epilogue_users(ir: KernelIR, m: FfnMatch, node: Node) -> list[int]:
    """Ids of the epilogue nodes reading `node` (once each), and -1 if it is also an output."""
    users = sorted({u.id for u in ir.users(node.id) if u.id in m.epi_nodes})
    return users + [-1] * any(o.node == node.id for o in ir.outputs)


def _column_epilogue(
    ir: KernelIR, m: FfnMatch, inputs: dict[str, tuple[str, ...]]
) -> tuple[BlockedStage, BlockedStage | None, BlockPass | None, str]:
    """Column-blocked plans: (the eviction, the statistics passes after the blocks, the first of those
    passes when the evictions accumulate it instead, what `_acc_hbm` is)."""
    evict, saved, value = lower_eviction(ir, m, inputs)
    if saved is None:
        return evict, None, None, ""
    scratch, written = scratch_tensor(ir, saved)  # `written`: the output the evictions write, none later
    epilogue = deferred_writes(*_lower_epilogue(ir, m, inputs, saved, None, True, written))
    # [R, 1] input columns are loaded per row tile after the column blocks (the epilogue's loop), so a pass
    # the evictions accumulate could not read them yet
    folded = None if inputs["vec"] else fold_first(epilogue)
    if folded is None:
        return evict, epilogue, None, scratch
    first, rest = folded  # the first statistics pass rides the evictions: one pass fewer over the scratch
    first = replace(first, lines=tuple(line.replace(_SCRATCH_BLOCK, value) for line in first.lines))
    return with_pass(evict, first), rest, first, scratch


_ACC_BLOCK = "acc[rs][0:pr, k0:k0 + nb]"  # the accumulator's block
_SCRATCH_BLOCK = "acc_blk[0:pr, 0:nb]"  # column-blocked plans: a block of the fp32 scratch, loaded
_RECEIVED = "blk[0:pr, 0:nb]"  # a block's sums in a tile of their own (K halves, late: the other core's)


def _lower_epilogue(
    ir: KernelIR,
    m: FfnMatch,
    inputs: dict[str, tuple[str, ...]],
    acc_node: int,
    acc_init: str | None,
    from_hbm: bool = False,
    written: str = "",
    block: bool = False,
) -> tuple[BlockedStage, tuple[OutputWrite, ...]]:
    """The epilogue over an SBUF accumulator (`block`: over the sums of one of its K-blocks in a tile
    `blk` of their own), or (`from_hbm`, column-blocked plans) over the bare down-projection's blocks
    loaded from the fp32 scratch `_acc_hbm`, every other input a block load, the output `written` (the
    scratch itself) left out."""
    acc = _RECEIVED if block else _ACC_BLOCK
    leaf = _SCRATCH_BLOCK if from_hbm else acc
    exprs, loads = _epilogue_exprs(ir, m, inputs, acc_node, acc_init, leaf)
    if from_hbm:
        acc = ""
        loads["acc_blk"] = BlockLoad("acc_blk", "_acc_hbm[r0:r0 + pr, k0:k0 + nb]", 4, broadcast=False)
    writes: list[OutputWrite] = []
    kept = [(o, e) for o, e in zip(ir.outputs, exprs, strict=True) if kernel_arg(str(o.name)) != written]
    outputs, roots = [out for out, _ in kept], [e for _, e in kept]
    # the Vector engine evicts the down-projection's sums: the epilogue's final casts go to the Scalar engine
    finish = output_writes(outputs, roots, writes, act_casts=True)
    sel = block_selector("u" if from_hbm else "e")  # names distinct from the other epilogue's
    stage = emit_blocked(sel, roots, loads, finish, writes=_row_outputs(outputs), accumulator=acc)
    return _with_column_writes(stage, writes), tuple(writes)


def _epilogue_exprs(
    ir: KernelIR,
    m: FfnMatch,
    inputs: dict[str, tuple[str, ...]],
    acc_node: int,
    acc_init: str | None,
    acc: str,
) -> tuple[list[Expr], dict[str, BlockLoad]]:
    """The outputs' expressions over `acc`, the tile holding node `acc_node`'s block, and the block loads
    of the epilogue's other inputs."""
    leaves, loads = row_leaves(ir, m.epi_nodes, inputs, acc_init)
    leaves[acc_node] = Operand("tile", acc)
    builder = row_builder(ir, m.hidden, leaves)
    exprs = [builder.expr(out.node) for out in ir.outputs]  # all first: users counts must be complete
    # the accumulator returned as it is is read by its output's write: never computed over in place
    builder.exprs[acc_node].users += sum(out.node == acc_node for out in ir.outputs)
    return exprs, loads


def _lower_received(
    ir: KernelIR, m: FfnMatch, inputs: dict[str, tuple[str, ...]], acc_node: int, acc_init: str | None
) -> BlockedStage | None:
    """K halves, late: the block epilogue whose input is `blk + acc`, the other core's sums (received into
    `blk`) plus this core's accumulator block, when all it does is cast that input to its one output: the
    add itself writes the cast's destination, on GpSimd (idle after the exchange, while the Vector engine
    evicts), one instruction after the exchange instead of two. None for any other epilogue: the template
    adds into `blk`, then runs the block epilogue over it (`epilogue_block`)."""
    exprs, _ = _epilogue_exprs(ir, m, inputs, acc_node, acc_init, _RECEIVED)
    out = ir.outputs[0]
    held = _cast_of(exprs[0], out.dtype) if len(exprs) == 1 else None
    if held is None or held.leaf is None or held.leaf.code != _RECEIVED:
        return None
    total = Expr("add", (held, Expr("leaf", kind="tile", leaf=Operand("tile", _ACC_BLOCK))), kind="tile")
    sel = block_selector("e", tile_engine=GPSIMD)
    return emit_blocked(sel, [total], {}, output_writes([out], [total], []), writes=1)


def _cast_of(value: Expr, dtype: str) -> Expr | None:
    """The leaf `value` only casts to `dtype` (a bare leaf: its output's write casts it); None if `value` is
    more than that, or `dtype` is f32 (no cast)."""
    leaf = value.args[0] if value.op == "cast" and value.dtype == dtype else value
    return leaf if leaf.op == "leaf" and dtype != "f32" else None


def _row_outputs(outputs: Sequence[OutputDecl]) -> int:
    """Outputs written a block at a time (not the per-token [R, 1] ones)."""
    return sum(1 for out in outputs if out.shape[-1] != Dim.const(1))


def _with_column_writes(stage: BlockedStage, writes: list[OutputWrite]) -> BlockedStage:
    """Per-token [R, 1] outputs leave once per row tile, after the statistics passes: their DMAs join the
    last pass's lines before its block loop (their columns are computed there, from finished statistics)."""
    lines = tuple(w.line() for w in writes if w.shape == "(R, 1)")
    if not lines:
        return stage
    last = stage.passes[-1]
    passes = (*stage.passes[:-1], replace(last, before=last.before + lines))
    return replace(stage, passes=passes)
