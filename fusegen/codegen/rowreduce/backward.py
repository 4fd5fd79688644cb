"""The row-reduction family's backward kernels: the backward IR (autodiff.py) lowered into the same loop nest.

The backward IR of a row-reduction spec is rewritten (rewrites.py) and matched by the family's own matcher;
its prep and reduction passes are lowered as the forward's (`lower_passes`). Its epilogue differs: it is
chunked like the passes (a backward holds many width-long temporaries), and besides [T, G, H] outputs it
- accumulates sums over the heads (grad_v: Σ_h grad_out·gate) in a [P, H] fp32 tile across the head loop,
  written to its head slice of a packed output (grad_kv) once per token tile;
- accumulates sums over the tokens (weight gradients) in PSUM: per 128 columns, the chunk's product tile
  [tokens, 128] is the stationary and a ones column [tokens, 1] the moving operand, so each matmul adds
  the token sum of 128 columns into one [128, 1] PSUM column, accumulated across token tiles; each core
  writes its sums to a per-core partial [cores, sums, G, H]. A second kernel adds the partials up and
  evaluates the elementwise post-ops on the whole sums (grad_w_h = Σ_T(...)·w_e), every [G, H] value
  viewed as [128, G*H/128].
"""

from __future__ import annotations

from dataclasses import dataclass

from fusegen.codegen.family import kernel_arg
from fusegen.codegen.rowreduce import budget as rb
from fusegen.codegen.rowreduce.budget import RowModel
from fusegen.codegen.rowreduce.loads import Load, column_leaves
from fusegen.codegen.rowreduce.lower import (
    ColumnOutput,
    RowPasses,
    acc,
    balanced,
    chunk_leaves,
    lower_column,
    lower_columns,
    lower_passes,
    output_value,
    row_kind,
    tile_bytes,
)
from fusegen.codegen.rowreduce.match import RowReduceMatch
from fusegen.codegen.select import Layout, Selector
from fusegen.codegen.select_tables import NL_DTYPE, EngineLoad
from fusegen.codegen.stage import Operand, StageBuilder, dim_source
from fusegen.dsl.ir import DTYPE_BYTES, Dim, KernelIR

CHUNK = "c0:c0 + hw"
#: a [G, H] value as the reduce kernel's [P, G*H/P] tile: rows r0:r0 + pr of this core, fg columns each
FLAT = "ap(pattern=[[fg, pr], [1, fg]], offset=r0 * fg)"


@dataclass(frozen=True)
class Write:
    """One DMA of computed values into an output."""

    dst: str
    src: str


@dataclass(frozen=True)
class HeadSum:
    """A sum over the heads: its [P, width] accumulator and the chunk value added per head."""

    acc: str
    part: str


@dataclass(frozen=True)
class TokenSum:
    """A sum over the tokens: its PSUM accumulator of [128, 1] columns and the chunk tile summed into it."""

    psum: str
    stationary: str
    staged: str  # its columns in the per-core staging tile, e.g. `0 * d_HC * nb:1 * d_HC * nb`


@dataclass(frozen=True)
class ReduceLowering:
    """The second kernel: the cores' partial token sums added up, then the post-ops that give the outputs."""

    args: tuple[str, ...]  # kernel arguments after the partials: the post-ops' weights and params
    loads: tuple[Load, ...]  # [G, H] weights as [P, G*H/P] tiles
    lines: tuple[str, ...]  # the post-ops over the summed tiles and the weights
    writes: tuple[Write, ...]
    outputs: tuple[tuple[str, str], ...]  # (hbm name, nl dtype)


@dataclass(frozen=True)
class BackwardLowering:
    """Everything the backward template formats."""

    passes: RowPasses
    epi_columns: tuple[str, ...]  # per-row math, once per head
    epi_lines: tuple[str, ...]  # per chunk
    head_writes: tuple[Write, ...]  # per head and chunk
    head_sums: tuple[HeadSum, ...]
    shared_writes: tuple[Write, ...]  # after the head loop, per token tile
    column_outputs: tuple[ColumnOutput, ...]  # [T, G] outputs (a column input's gradient), staged per tile
    token_sums: tuple[TokenSum, ...]
    reduce: ReduceLowering
    model: RowModel
    constants: tuple[str, ...]  # constant columns, built once per launch


def lower_backward(ir: KernelIR, m: RowReduceMatch) -> BackwardLowering:
    """Compile a matched backward IR: the shared passes, then the chunked epilogue with its accumulators
    (per-row affine steps balanced between the Scalar and Vector engines, as in the forward)."""
    return balanced(lambda load: _lower_backward(ir, m, load))


def _lower_backward(ir: KernelIR, m: RowReduceMatch, load: EngineLoad) -> BackwardLowering:
    """lower_backward with the full-width steps of the passes and the token pass balanced by `load`."""
    passes = lower_passes(ir, m, load)
    below = column_leaves(ir, m) | {rid: acc(rid, ir) for level in m.levels for rid in level} | passes.hoisted
    roots = _epilogue_roots(ir, m)
    cols, hoisted = lower_columns(ir, m, below, roots, prefix="ke_")
    col_builder = StageBuilder(ir, below | hoisted, row_kind(m), free_size=lambda n: m.width)
    col_exprs = {o.name: col_builder.expr(src) for o, src in m.column_outputs}  # all first, as below
    col_outs = tuple(lower_column(cols, o, col_exprs[o.name]) for o, _ in m.column_outputs)
    builder = StageBuilder(ir, chunk_leaves(ir, m, passes.resident) | below | hoisted, row_kind(m),
                           free_size=lambda n: m.width)  # fmt: skip
    sel = Selector(Layout(part="pt", free="hw", free_alloc="HB"), prefix="e", load=load)
    exprs = {nid: builder.expr(nid) for nid in roots}  # all first: users counts must be complete
    writes = [Write(f"{kernel_arg(o.name)}[t0:t0 + pt, h, {CHUNK}]",
                    output_value(sel, exprs[o.node], o.dtype).code) for o in m.tile_outputs]  # fmt: skip
    shared = []
    for packed in m.packed_outputs:
        hbm = kernel_arg(packed.output.name)
        for term in packed.terms:
            if term.per_head:
                value = output_value(sel, exprs[term.node], packed.output.dtype)
                writes.append(Write(f"{hbm}[t0:t0 + pt, {_row(term.start, 'h')}, {CHUNK}]", value.code))
            else:
                full = f"0:{dim_source(m.width)}"
                shared.append(Write(f"{hbm}[t0:t0 + pt, {_row(term.start, '')}, {full}]",
                                    f"{_head_acc(term.node)}[0:pt, {full}]"))  # fmt: skip
    head_sums = [HeadSum(_head_acc(nid), sel.value(exprs[ir.node(nid).args[0]]).code) for nid in m.head_sums]
    heads = dim_source(m.heads)
    token_sums = [
        TokenSum(f"tsum{i}", _stationary(sel, exprs[ir.node(nid).args[0]]),
                 f"{i} * {heads} * nb:{i + 1} * {heads} * nb")
        for i, nid in enumerate(m.token_sums)
    ]  # fmt: skip
    model = RowModel(
        resident_per_head=4 * len(passes.resident),
        prep_scratch=0,  # the prep holds one 512-column chunk of each weight row at a time
        row_inputs=sum(DTYPE_BYTES[ir.node(ld.node).dtype] for ld in m.loads),
        epilogue=4 * len(m.head_sums),  # the head-sum accumulators are the only width-long epilogue tiles
        chunk=max(passes.chunk_bytes, tile_bytes(sel)),
        columns=4 * (passes.column_tiles + len(cols.tiles) + len(m.column_loads) + len(col_outs)
                     + (len(passes.constants) + len(cols.constants)) // 2),
    )  # fmt: skip
    return BackwardLowering(
        passes=passes, epi_columns=tuple(cols.lines), epi_lines=tuple(sel.lines), head_writes=tuple(writes),
        head_sums=tuple(head_sums), shared_writes=tuple(shared), column_outputs=col_outs,
        token_sums=tuple(token_sums),
        reduce=lower_reduce(ir, m), model=model,
        constants=passes.constants + tuple(cols.constants + sel.constants),
    )  # fmt: skip


def lower_reduce(ir: KernelIR, m: RowReduceMatch) -> ReduceLowering:
    """The reduce kernel's post-ops: a stage over the summed [P, G*H/P] tiles and the weights in the same
    layout, so an elementwise op pairs matching elements."""
    sums = {nid: Operand("tile", f"totals[0:pr, {i} * fg:{i + 1} * fg]")
            for i, nid in enumerate(m.token_sums)}  # fmt: skip
    weights = [n for n in m.post_inputs if n.op == "input"]
    tiles = {n.id: Operand("tile", f"{n.name}_fl[0:pr, 0:fg]", dtype=n.dtype) for n in weights}
    builder = StageBuilder(ir, sums | tiles, row_kind(m), free_size=lambda n: m.width)
    sel = Selector(Layout(part="pr", free="fg", free_alloc="fg"), prefix="g")
    exprs = {o.node: builder.expr(o.node) for o in m.token_outputs}  # all first: users counts complete
    writes = [Write(f"{kernel_arg(o.name)}.{FLAT}", output_value(sel, exprs[o.node], o.dtype).code)
              for o in m.token_outputs]  # fmt: skip
    loads = [Load(f"{n.name}_fl", NL_DTYPE[n.dtype], f"{kernel_arg(str(n.name))}.{FLAT}") for n in weights]
    return ReduceLowering(
        # params are read as scalars `<name>_arg`, as in any stage
        args=tuple(kernel_arg(str(n.name)) if n.op == "input" else f"{n.name}_arg" for n in m.post_inputs),
        loads=tuple(loads), lines=tuple(sel.lines), writes=tuple(writes),
        outputs=tuple((kernel_arg(o.name), NL_DTYPE[o.dtype]) for o in m.token_outputs),
    )  # fmt: skip


def _epilogue_roots(ir: KernelIR, m: RowReduceMatch) -> list[int]:
    """The width-long values the epilogue writes or accumulates."""
    roots = [o.node for o in m.tile_outputs]
    roots += [t.node for p in m.packed_outputs for t in p.terms if t.per_head]
    roots += [ir.node(nid).args[0] for nid in m.head_sums]
    roots += [ir.node(nid).args[0] for nid in m.token_sums]
    return roots


def _head_acc(node_id: int) -> str:
    return f"hsum{node_id}"


def _row(start: Dim, head: str) -> str:
    """The output row of head `head` (a head-shared row when empty) in a slice starting at `start`."""
    base = dim_source(start)
    if not head:
        return base
    return head if base == "0" else f"{base} + {head}"


def _stationary(sel: Selector, expr: object) -> str:
    """The chunk tile a token sum multiplies by the ones column: fp32 in SBUF (fp32 pairs only with fp32)."""
    value = sel.value(expr)  # type: ignore[arg-type]
    if value.memory != "sbuf" or value.dtype != "f32" or value.kind != "tile":
        value = sel.copy(value, "tile", "f32")
    return value.code.split("[")[0]


def psum_banks(m: RowReduceMatch) -> int:
    """PSUM banks the kernel holds at once: one per token sum, plus the prep step's broadcast weights."""
    return len(m.token_sums) + len(m.weights)


def token_sum_fits(heads: int, width: int) -> bool:
    """Whether one token sum's [128, heads * width / 128] fp32 columns fit one 2 KiB PSUM bank."""
    return width % rb.P == 0 and heads * width // rb.P * 4 <= 2048
