"""Lowering of a matched row reduction: weight prep, chunked reduction passes and the epilogue, as NKI lines.

Three stages share the stage/select machinery with the FFN family:
- prep (per head, once per launch if it fits SBUF, else per token tile): weights broadcast to all
  partitions and combined in fp32;
- reduction passes (per token tile and head): each level's reductions over chunks of HB columns, the
  per-chunk partial results folded into one [P, 1] accumulator column per reduction;
- epilogue (per token tile and head): per-row scalar math on the columns, the full-width combine, and
  the outputs ([T, G, H] tiles stored directly, [T, G] columns staged per token tile).
The prep and the reduction passes (`RowPasses`) are shared with the backward kernel (rowreduce_backward.py),
whose epilogue is chunked like the passes and accumulates sums over heads and tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from fusegen.codegen import select_pe
from fusegen.codegen.engines import GPSIMD, VECTOR, gpsimd_allows
from fusegen.codegen.family import kernel_arg
from fusegen.codegen.rowreduce.budget import P, RowModel
from fusegen.codegen.rowreduce.loads import (
    Load,
    column_bytes,
    column_leaves,
    column_load,
    leaf_name,
    load_row,
)
from fusegen.codegen.rowreduce.match import RowLoad, RowReduceMatch
from fusegen.codegen.rowreduce.prep import lower_prep, prepare_body, root_copies, row_kind
from fusegen.codegen.select import Layout, Selector
from fusegen.codegen.select_span import HEAD, Span
from fusegen.codegen.select_tables import NL_DTYPE, EngineLoad
from fusegen.codegen.stage import Expr, Operand, StageBuilder, dim_source, inverse_code
from fusegen.dsl.ir import DTYPE_BYTES, KernelIR, Node, OutputDecl

_T = TypeVar("_T")
ONE_COLUMN = "0:1"
CHUNK = "c0:c0 + hw"  # the current chunk's columns of a full-width tile (and of an HBM row)
LOCAL = "0:hw"  # the current chunk in a tile that holds only that chunk (streamed rows)


@dataclass(frozen=True)
class Combine:
    """Folding one chunk's partial reduction into its accumulator column."""

    acc: str
    part: str
    op: str  # nl.add | nl.maximum

    @property
    def engine(self) -> str:
        """GpSimd where engines.py allows the op (keeps [P, 1] work off the Vector queue), else Vector."""
        return GPSIMD if gpsimd_allows("tensor_tensor", (self.op,), reads_psum=False) else VECTOR


@dataclass(frozen=True)
class Level:
    """One pass over the width: per-row math on lower levels (once per head), the chunk's lines, and how
    each partial result is accumulated."""

    columns: tuple[str, ...]
    lines: tuple[str, ...]
    combines: tuple[Combine, ...]
    loads: tuple[Load, ...] = ()  # the chunk's row inputs from HBM at the top of each chunk (streamed rows)


@dataclass(frozen=True)
class RowPasses:
    """The weight prep, the loads and the reduction passes: the part every row-reduction kernel shares."""

    rows: str
    heads: str
    width: str
    prepare: tuple[str, ...]  # body of `prepare_weights(h, ...)`: head h's prepared weights
    shared_loads: tuple[Load, ...]  # head-shared rows, once per token tile
    head_loads: tuple[Load, ...]
    column_loads: tuple[Load, ...]  # [T, G] columns, once per token tile into [P, G]
    levels: tuple[Level, ...]
    resident: dict[int, str]  # prep root id -> its code in the prep step
    chunk_bytes: int  # the widest pass's temporaries per chunk column
    column_tiles: int  # [P, 1] tiles of the passes, per head
    hoisted: dict[int, Operand]  # per-row values computed before a pass's chunk loop, by node id
    constants: tuple[str, ...]  # constant columns the passes read, built once per launch


@dataclass(frozen=True)
class ColumnOutput:
    """A [T, G] output: its HBM tensor, staging tile, the column it copies per head, and whether optional."""

    hbm: str
    staging: str
    source: str
    optional: bool


@dataclass(frozen=True)
class RowReduceLowering:
    """Everything the row-reduction template formats."""

    passes: RowPasses
    epi_columns: tuple[str, ...]  # the per-row math, in head_passes (ahead of the previous head's epilogue)
    epi_lines: tuple[str, ...]  # the full-width rest (and per-row math reading it)
    save_lines: tuple[str, ...]  # extra epilogue lines for optional outputs
    tile_outputs: tuple[tuple[str, str, str], ...]  # (hbm name, nl dtype, source access)
    required_columns: tuple[ColumnOutput, ...]
    optional_columns: tuple[ColumnOutput, ...]
    model: RowModel
    constants: tuple[str, ...]  # constant columns of the passes and the epilogue, built once per launch
    streamed: bool = False  # row inputs streamed from HBM per chunk in every pass and in a chunked epilogue
    epi_loads: tuple[Load, ...] = ()  # the row-input chunks the streamed epilogue reads
    psum_banks: int = 0  # PSUM banks of the epilogue's PE-formed outputs (besides the prep's broadcasts)
    # rows through identity matmuls (mixing a tile's non-finite values): passes if HB fits PSUM, epilogue if
    # the width does (PE-formed outputs, with diagonals: at every width)
    pe_passes: bool = False
    pe_epilogue: bool = False
    # the Scalar engine is the less loaded: it may take a share of the PE-formed output's evictions
    scalar_share: bool = False
    # per-row math once per token tile for all heads (tile_math.py): per-tile allocations, the chain's body,
    # the accumulators it reads from their `[P, heads]` tiles, the head's state for the shared epilogue
    # (its column `hc`, the Scalar share's condition); `head_math`: the per-head lowering of such a kernel,
    # which runs the same chain over its head's one column
    tile_allocs: tuple[str, ...] = ()
    tile_math: tuple[str, ...] = ()
    tile_accs: tuple[str, ...] = ()
    head_state: tuple[str, ...] = ()
    head_math: bool = False


def lower_rowreduce(ir: KernelIR, m: RowReduceMatch) -> RowReduceLowering:
    """Compile the three stages of `m` into NKI lines for the template, balancing the per-row affine steps
    between the Scalar and Vector engines by the totals of a first lowering."""
    return balanced(lambda load: _lower_rowreduce(ir, m, load))


def rows_on_pe(ir: KernelIR, m: RowReduceMatch) -> bool:
    """Whether rows may pass through the Tensor engine (identity matmuls into PSUM, select_pe.py; other PSUM
    staging needs no matmul and is always allowed): only when every row input is declared `finite`. There a
    row's inf or nan times the identity's zeros is nan in every other token of its tile (0 x inf = nan),
    which a masked softmax's -inf would hit."""
    finite = {t.name for t in ir.inputs if t.finite}
    return all(ld.input in finite for ld in m.loads)


def balanced(lower: Callable[[EngineLoad], _T]) -> _T:
    """`lower` run twice: once counting each engine's full-width work, then balanced by those totals."""
    count = EngineLoad()
    lower(count)
    return lower(EngineLoad(planned=dict(count.busy)))


def _lower_rowreduce(ir: KernelIR, m: RowReduceMatch, load: EngineLoad) -> RowReduceLowering:
    """The three stages of `m`, full-width steps of the passes and the epilogue balanced by one `load`."""
    passes = lower_passes(ir, m, load, pe_staging=True)
    epi, n_required, tile_outs, col_outs = lower_epilogue(ir, m, passes.resident, load)
    n_columns = column_prefix(epi, n_required)
    constants = tuple(dict.fromkeys(passes.constants + tuple(epi.constants)))  # one PE identity per dtype
    columns = [ln for ln in constants if not select_pe.identity_line(ln)]
    model = RowModel(
        resident_per_head=4 * len(passes.resident),
        prep_scratch=0,  # the prep holds one 512-column chunk of each weight row at a time
        row_inputs=sum(DTYPE_BYTES[ir.node(ld.node).dtype] for ld in m.loads),
        epilogue=sum(DTYPE_BYTES[dt] for _, kind, dt in epi.tiles if kind == "tile"),
        chunk=passes.chunk_bytes,
        columns=4 * (sum(1 for _, k, _ in epi.tiles if k == "vec") + len(passes.levels) * 8 + len(col_outs)
                     + len(columns) // 2) + column_bytes(ir, m),
        row_copies=2,  # head_passes of the next head runs before this head's full-width epilogue
        launch_tiles=select_pe.identity_bytes(constants),
        diagonals=sum(P * DTYPE_BYTES[dt] for _, k, dt in epi.tiles if k == "diag"),
    )  # fmt: skip
    return RowReduceLowering(
        passes=passes, epi_columns=tuple(epi.lines[:n_columns]),
        epi_lines=tuple(epi.lines[n_columns:n_required]), save_lines=tuple(epi.lines[n_required:]),
        tile_outputs=tile_outs, required_columns=tuple(c for c in col_outs if not c.optional),
        optional_columns=tuple(c for c in col_outs if c.optional), model=model,
        constants=constants, psum_banks=epi.psum_banks,
        pe_passes=any(map(select_pe.identity_line, passes.constants)),
        pe_epilogue=any(map(select_pe.identity_line, epi.constants)), scalar_share=load.scalar_lighter(),
    )  # fmt: skip


def lower_passes(ir: KernelIR, m: RowReduceMatch, load: EngineLoad | None = None, pe_staging: bool = False
                 ) -> RowPasses:  # fmt: skip
    """The prep, the loads and the reduction passes of `m` (full-width steps balanced by `load`; two-tile
    steps through PSUM with `pe_staging`, which the forward kernel uses)."""
    width = dim_source(m.width)
    # the prep's copies on the Scalar engine when the kernel's full-width work leaves it the less busy one
    on_scalar = load is not None and load.scalar_lighter()
    prep, prep_loads, resident = lower_prep(ir, m, width, on_scalar)
    levels, chunk_bytes, column_tiles, hoisted, constants = lower_levels(
        ir, m, resident, load=load, pe_staging=pe_staging
    )
    row_loads = [load_row(ir, ld, f"0:{width}") for ld in m.loads]
    return RowPasses(
        rows=dim_source(m.rows), heads=dim_source(m.heads), width=width,
        prepare=prepare_body(prep_loads, prep.lines, root_copies(prep, resident, on_scalar), width),
        shared_loads=tuple(ld for ld, spec in zip(row_loads, m.loads, strict=True) if not spec.per_head),
        head_loads=tuple(ld for ld, spec in zip(row_loads, m.loads, strict=True) if spec.per_head),
        column_loads=tuple(column_load(ir, c, dim_source(m.heads)) for c in m.column_loads),
        levels=levels, resident=resident, chunk_bytes=chunk_bytes, column_tiles=column_tiles, hoisted=hoisted,
        constants=constants,
    )  # fmt: skip


def _resident_leaves(resident: dict[int, str], free: str) -> dict[int, Operand]:
    """Prepared weights of the current head: `prepared[i]`, as `prepare_weights` returns them."""
    return {root: Operand("tile", f"prepared[{i}][0:pt, {free}]") for i, root in enumerate(resident)}


def lower_levels(
    ir: KernelIR, m: RowReduceMatch, resident: dict[int, str], row_free: str = CHUNK, tag: str = "",
    load: EngineLoad | None = None, pe_staging: bool = False,
) -> tuple[tuple[Level, ...], int, int, dict[int, Operand], tuple[str, ...]]:
    """Each level's lines and accumulations, the widest level's chunk bytes per column, the [P, 1] tiles
    of all levels, the per-row values hoisted out of their chunk loops (later stages reuse them), and the
    launch-wide constant columns. Row inputs are read at `row_free` (LOCAL when each chunk is streamed in);
    `tag` prefixes the tile names; `load` balances full-width affine steps between Scalar and Vector;
    `pe_staging` lets two-tile steps go through PSUM on the Tensor engine (select_pe.py; forward only)."""
    levels, widest, vecs, constants = [], 0, 0, []
    hoisted: dict[int, Operand] = {}
    for depth, ids in enumerate(m.levels):
        lower_accs = {rid: acc(rid, ir) for lower in m.levels[:depth] for rid in lower}
        below = column_leaves(ir, m) | lower_accs | hoisted
        cols, new = lower_columns(ir, m, below, ids, prefix=f"{tag}k{depth}_")
        hoisted |= new
        leaves = chunk_leaves(ir, m, resident, row_free) | below | new
        builder = StageBuilder(ir, leaves, row_kind(m), free_size=lambda n: m.width)
        layout = Layout(part="pt", free="hw", free_alloc="HB")
        sel = Selector(
            layout, prefix=f"{tag}r{depth}_", column_engine=GPSIMD, load=load, pe_staging=pe_staging,
            rows_on_pe=pe_staging and rows_on_pe(ir, m),
        )
        combines = []
        for rid in ids:
            expr = builder.expr(rid)
            part = sel.value(expr.args[0] if deferred_mean(ir, rid) else expr)  # a deferred mean: its sum
            op = "nl.maximum" if ir.node(rid).op == "max" else "nl.add"
            combines.append(Combine(acc(rid).code.split("[")[0], part.code.split("[")[0], op))
        widest = max(widest, tile_bytes(sel))
        vecs += len(cols.tiles) + sum(1 for _, kind, _ in sel.tiles if kind == "vec")
        levels.append(Level(tuple(cols.lines), tuple(sel.lines), tuple(combines)))
        constants += cols.constants + sel.constants
    return tuple(levels), widest, vecs, hoisted, tuple(constants)


def tile_bytes(sel: Selector) -> int:
    """Bytes per free-axis column of the full tiles a stage allocates."""
    return sum(DTYPE_BYTES[dt] for _, kind, dt in sel.tiles if kind == "tile")


def chunk_leaves(ir: KernelIR, m: RowReduceMatch, resident: dict[int, str], row_free: str = CHUNK
                 ) -> dict[int, Operand]:  # fmt: skip
    """The loaded rows (at `row_free`) and prepared weights over the current chunk `c0:c0 + hw`."""
    loads = {ld.node: ld for ld in m.loads}
    return _row_leaves(ir, loads, row_free) | _resident_leaves(resident, CHUNK)


def lower_columns(
    ir: KernelIR, m: RowReduceMatch, leaves: dict[int, Operand], roots: Iterable[int], prefix: str
) -> tuple[Selector, dict[int, Operand]]:
    """The per-row values the chunks of `roots` read, computed once per head before the chunk loop
    (rather than once per chunk): their lines, and each as a leaf for the chunk stage."""
    kind = row_kind(m)
    builder = StageBuilder(ir, leaves, kind, free_size=lambda n: m.width)
    sel = Selector(Layout(part="pt", free="1", free_alloc="1"), prefix=prefix, column_engine=GPSIMD)
    hoisted = {nid: sel.value(builder.expr(nid)) for nid in frontier(ir, leaves, roots, kind)}
    return sel, hoisted


def frontier(ir: KernelIR, leaves: dict[int, Operand], roots: Iterable[int], kind: Callable[[Node], str]
              ) -> list[int]:  # fmt: skip
    """Per-row (vec) nodes outside `leaves` that a width-long node reads, in topological order."""
    found: set[int] = set()
    seen: set[int] = set()
    stack = [r for r in roots if r not in leaves]
    while stack:
        node = ir.node(stack.pop())
        if node.id in seen:
            continue
        seen.add(node.id)
        for a in node.args:
            arg = ir.node(a)
            if a in leaves or kind(arg) == "scalar" or arg.op == "input":  # inputs are loaded, never hoisted
                continue
            if kind(arg) == "vec" and kind(node) == "tile":
                found.add(a)
            else:
                stack.append(a)
    return sorted(found)


def acc(node_id: int, ir: KernelIR | None = None) -> Operand:
    """The [P, 1] accumulator column of reduction node `node_id` (marked positive when `ir` shows it is a
    sum of exponentials, so the selector may take its log: select_folds.py; read as the sum times 1/n
    when `ir` shows a deferred mean)."""
    if ir is None:
        return Operand("vec", f"acc{node_id}[0:pt, {ONE_COLUMN}]")
    node, operand = ir.node(node_id), ir.node(ir.node(node_id).args[0])
    positive = node.op == "sum" and operand.op == "exp"
    scale = inverse_code(operand.shape[-1]) if deferred_mean(ir, node_id) else ""
    return Operand("vec", f"acc{node_id}[0:pt, {ONE_COLUMN}]", positive=positive, scale=scale)


def deferred_mean(ir: KernelIR, node_id: int) -> bool:
    """Whether the mean `node_id` accumulates its sum, its 1/n applied where it is read: each reader
    adds a scalar to it (`rsqrt(mean + eps)`), so a consuming activation takes 1/n in its scale and the
    eps in its bias, where a scaled partial per chunk would be a [P, 1] step of its own."""
    if ir.node(node_id).op != "mean":
        return False
    users = ir.users(node_id)
    return bool(users) and all(
        u.op == "add" and all(a == node_id or ir.node(a).shape == () for a in u.args) for u in users
    )


def _row_leaves(ir: KernelIR, loads: dict[int, RowLoad], free: str) -> dict[int, Operand]:
    return {nid: Operand("tile", f"{leaf_name(ir.node(nid))}[0:pt, {free}]", dtype=ir.node(nid).dtype)
            for nid in loads}  # fmt: skip


def lower_epilogue(
    ir: KernelIR, m: RowReduceMatch, resident: dict[int, str], load: EngineLoad, span: Span | None = None,
    share_when: str = "",
) -> tuple[Selector, int, tuple[tuple[str, str, str], ...], tuple[ColumnOutput, ...]]:
    """Per-row math and the combine: the selector, how many of its lines the required outputs need, writes.
    With `span`, the per-row prefix over a token tile's heads (select_span.py; tile_math.py); `share_when`:
    the Selector's trace-time condition for the Scalar engine's share of PE-formed evictions."""
    full = f"0:{dim_source(m.width)}"
    loads = {ld.node: ld for ld in m.loads}
    leaves = _row_leaves(ir, loads, full) | _resident_leaves(resident, full) | column_leaves(ir, m)
    leaves |= {rid: acc(rid, ir) for level in m.levels for rid in level}
    builder = StageBuilder(ir, leaves, row_kind(m), free_size=lambda n: m.width)
    width = dim_source(m.width)
    layout = Layout(part="pt", free=width, free_alloc=width)
    sel = Selector(layout, prefix="e", column_engine=GPSIMD, load=load, pe_staging=True,
                   rows_on_pe=rows_on_pe(ir, m), span=span, share_when=share_when)  # fmt: skip
    exprs = {o.node: builder.expr(o.node) for o in m.tile_outputs}  # all first: users counts must be complete
    cols = {o.name: builder.expr(src) for o, src in m.column_outputs}
    # required [T, G] outputs first: per-row math only, so it joins the column prefix that runs in
    # head_passes, ahead of the previous head's epilogue in every engine's queue
    required = [o for o, _ in m.column_outputs if not o.optional]
    columns = [lower_column(sel, o, cols[o.name]) for o in required]
    tiles = []
    for out in m.tile_outputs:
        value = output_value(sel, exprs[out.node], out.dtype)
        tiles.append((kernel_arg(out.name), NL_DTYPE[out.dtype], value.code))
    n_required = len(sel.lines)
    if span is not None:  # the optional outputs' math runs per head, in the epilogue
        span.close(n_required)
    columns += [lower_column(sel, o, cols[o.name]) for o, _ in m.column_outputs if o.optional]
    return sel, n_required, tuple(tiles), tuple(columns)


def column_prefix(sel: Selector, end: int) -> int:
    """How many of the first `end` lines compute [P, 1] columns off the Vector engine: the per-row math
    that runs ahead of the previous head's full-width epilogue (a column op in the in-order Vector queue
    would wait there for this head's passes and hold that epilogue up, so it starts the epilogue)."""
    pairs = list(zip(sel.line_kinds[:end], sel.line_engines[:end], strict=True))
    return next((i for i, (kind, engine) in enumerate(pairs) if kind != "vec" or engine == "dve"), len(pairs))


def output_value(sel: Selector, expr: Expr, dtype: str) -> Operand:
    """`expr` in an output's dtype: written so when nothing else reads it, else computed in fp32 and cast;
    a value the Tensor engine's help left in PSUM (an f32 `layernorm(x, eps, w)`) goes through SBUF, since
    a DMA cannot read PSUM (on the Scalar engine, as rowstage.output_writes does)."""
    value = sel.value(expr, dtype if expr.users == 0 else "f32")
    if value.memory == "psum":
        return sel.convert(value, dtype)
    return value if value.dtype == dtype else sel.copy(value, "tile", dtype)


def lower_column(sel: Selector, out: OutputDecl, expr: Expr) -> ColumnOutput:
    value = sel.value(expr)
    return ColumnOutput(kernel_arg(out.name), f"{out.name}_sv", sel.at(value.code, HEAD), out.optional)
