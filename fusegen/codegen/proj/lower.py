"""Lowering of a matched projection: the prologue into x^T, each projection's epilogue into its PSUM
eviction (computed on the way out of PSUM, one [P, F_MOV] piece at a time), and the budget model."""

from __future__ import annotations

from dataclasses import dataclass

from fusegen.codegen.blocks import BlockedStage, BlockLoad, emit_blocked
from fusegen.codegen.budget_base import NO_STAGE
from fusegen.codegen.family import kernel_arg
from fusegen.codegen.proj.budget import ProjModel
from fusegen.codegen.proj.match import Projection, ProjMatch
from fusegen.codegen.rowstage import (
    OutputWrite,
    block_selector,
    lower_prologue,
    output_writes,
    row_builder,
    row_leaves,
    row_stage_inputs,
    transpose_block,
)
from fusegen.codegen.select_tables import NL_DTYPE
from fusegen.codegen.stage import Operand, dim_source
from fusegen.dsl.ir import DTYPE_BYTES, Dim, KernelIR

#: the PSUM accumulator of row tile `rs`, column piece `jq` of the current block: the epilogue's leaf
PSUM_LEAF = "acc_ps[(rs - rs0) * n_q + jq][0:pr, 0:nb]"


@dataclass(frozen=True)
class ProjectionLowering:
    """One projection as the template formats it: weight, columns, epilogue and outputs."""

    weight: str  # kernel argument holding the weight's columns
    w_nl_dtype: str  # its tiles' dtype: the weight's own (an fp8 weight stays fp8 on the PE)
    first: str  # source of its first column ("" for a whole input)
    width: str  # source of N
    row_columns: tuple[str, ...]  # [R, 1] inputs of the epilogue, loaded once per row tile
    block_rows: tuple[BlockLoad, ...]  # [N] inputs broadcast over the partitions once per column block
    epilogue: BlockedStage  # one pass: its loads and lines per [P, F_MOV] piece
    outputs: tuple[OutputWrite, ...]


@dataclass(frozen=True)
class ProjLowering:
    """Everything the projection template formats."""

    x: str
    x_nl_dtype: str
    x_transpose: tuple[str, ...]  # the staged K-block `x_blk` into x^T (without a prologue)
    prologue: BlockedStage | None
    projections: tuple[ProjectionLowering, ...]
    model: ProjModel


def lower_proj(ir: KernelIR, m: ProjMatch) -> ProjLowering:
    """Compile the prologue and every projection's epilogue of `m` into NKI lines for the template."""
    prologue = lower_prologue(ir, m.x, m.prologue_nodes, m.rows, m.hidden)
    projections = tuple(_projection(ir, m, pj, n) for n, pj in enumerate(m.projections))
    model = ProjModel(
        x_bytes=DTYPE_BYTES[m.x.dtype],
        pro=prologue.model if prologue else NO_STAGE,
        epi=tuple(pj.epilogue.model for pj in projections),
        block_rows=tuple(len(pj.block_rows) for pj in projections),
        w_bytes=tuple(DTYPE_BYTES[pj.weight.dtype] for pj in m.projections),
    )
    return ProjLowering(
        x=kernel_arg(str(m.source.name)),
        x_nl_dtype=NL_DTYPE[m.x.dtype],
        x_transpose=transpose_block("x_blk", NL_DTYPE[m.x.dtype]),
        prologue=prologue,
        projections=projections,
        model=model,
    )


def _projection(ir: KernelIR, m: ProjMatch, pj: Projection, n: int) -> ProjectionLowering:
    """The epilogue of one projection over a piece of its PSUM accumulator: every output written."""
    inputs = row_stage_inputs(ir, pj.epi_nodes, m.rows, pj.width)
    leaves, loads = row_leaves(ir, pj.epi_nodes, inputs, skip=None)
    block_rows = _hoisted_rows(leaves, loads, inputs["row"])
    leaves[pj.matmul.id] = Operand("tile", PSUM_LEAF, memory="psum")
    builder = row_builder(ir, pj.width, leaves)
    outputs = [ir.outputs[i] for i in pj.outputs]
    exprs = [builder.expr(out.node) for out in outputs]
    writes: list[OutputWrite] = []
    finish = output_writes(outputs, exprs, writes)
    stage = emit_blocked(block_selector(f"e{n}_"), exprs, loads, finish, writes=len(outputs))
    assert len(stage.passes) == 1, "the matcher admits no row statistics in a projection's epilogue"
    first = "" if pj.first == Dim.const(0) else dim_source(pj.first)
    return ProjectionLowering(
        kernel_arg(str(pj.weight.name)),
        NL_DTYPE[pj.weight.dtype],
        first,
        dim_source(pj.width),
        inputs["vec"],
        block_rows,
        stage,
        tuple(writes),
    )


def _hoisted_rows(
    leaves: dict[int, Operand], loads: dict[str, BlockLoad], rows: tuple[str, ...]
) -> tuple[BlockLoad, ...]:
    """[N] inputs (a bias) broadcast once per NB-column block for every row tile of the super-block,
    rather than per row tile and piece: their leaves read piece `jq` of the block's tile."""
    hoisted = []
    for name in rows:
        load = loads.pop(f"{name}_row")
        src = f"{name}.ap(pattern=[[0, _P], [1, nw]], offset=n0)"
        hoisted.append(BlockLoad(load.tile, src, load.nbytes, broadcast=True))
        for nid, leaf in leaves.items():
            if leaf.code == f"{load.tile}[0:pr, 0:nb]":
                leaves[nid] = Operand(leaf.kind, f"{load.tile}[0:pr, jq * _F_MOV:jq * _F_MOV + nb]")
    return tuple(hoisted)
