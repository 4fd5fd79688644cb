"""Row kernels of the FFN backward: elementwise stages with a norm's row reductions, and sums over the
tokens that no weight gradient carries (a norm's dγ and dβ, LayerScale's dλ).

A norm's backward reduces over the row ([R, N] -> [R, 1]: the mean, the variance, Σ dz·x̂) and uses the
result across the row again, possibly to reduce once more (LayerNorm's backward nests three reductions).
A row kernel streams each 128-row tile through passes over its 512-column chunks: pass p recomputes, per
chunk, the values the level-p reductions read (from the leaves in HBM and the earlier passes' columns)
and folds each chunk's partial result into a [128, 1] accumulator (sum and mean are linear: the chunks'
partial means add up to the mean); after the chunk loop, the per-row math on the accumulators (rstd, the
scaled sums) gives the columns the next passes read. The last pass computes the values the kernel
writes. Of the row tiles only chunks and columns live in SBUF (each pass re-reads its leaves from HBM,
the streamed-rows trade the rowreduce family makes for wide rows); a token sum's [1, N] fp32 row is the
one SBUF use that grows with N (4 N bytes of one partition: 64 KiB at N = 16384), and nothing budgets it
yet.

A token sum without a GEMM (Σ_tokens of an [R, N] value) rides on the last pass: each chunk's column sums
are a ones-column matmul on the PE ([1, 512] in PSUM), added into a [1, N] fp32 row per core; the cores'
rows are per-core partials that the host adds with _add_cores_kernel, as the token GEMMs' are.
"""

from __future__ import annotations

from fusegen.codegen.engines import GPSIMD, VECTOR, gpsimd_allows
from fusegen.codegen.family import Mismatch
from fusegen.codegen.ffn.backward_parts import FAMILY, SCALARS, Elementwise, Leaf, RowPass, Write, var
from fusegen.codegen.rowreduce.lower import output_value
from fusegen.codegen.select import Layout, SelectError, Selector
from fusegen.codegen.select_tables import NL_DTYPE
from fusegen.codegen.stage import Operand, StageBuilder, StageError
from fusegen.dsl.ir import Dim, KernelIR, Node

ROW_REDUCTIONS = ("sum", "mean")  # linear: a row's result is the sum of its chunks' results


def is_row_reduction(ir: KernelIR, n: Node) -> bool:
    """Whether `n` reduces an [R, N] value over its last axis to [R, 1]."""
    if n.op not in ROW_REDUCTIONS or not n.attr("keepdim") or len(n.shape) != 2:
        return False
    return n.attr("axis") == 1 and len(ir.node(n.args[0]).shape) == 2


def closure(ir: KernelIR, roots: list[int], done: set[int]) -> list[int]:
    """The nodes a kernel computes for `roots`: back through the unwritten nodes to the values in HBM
    (`done`) and the scalars, in id order."""
    seen = {r for r in roots if r not in done}
    todo = list(seen)
    while todo:
        for a in ir.node(todo.pop()).args:
            if a not in seen and a not in done and ir.node(a).op not in SCALARS:
                seen.add(a)
                todo.append(a)
    return sorted(seen)


def needs_rows(ir: KernelIR, nodes: list[int], done: set[int]) -> bool:
    """Whether computing `nodes` takes a row kernel: a row reduction, or a dim's value (which the row
    kernel binds from its leaves' shapes)."""
    computed = closure(ir, nodes, done)
    dims = [a for nid in computed for a in ir.node(nid).args if ir.node(a).op == "dim"]
    return bool(dims) or any(is_row_reduction(ir, ir.node(nid)) for nid in computed)


def _kind(n: Node) -> str:
    """A node's stage kind: a trace-time scalar, an [R, 1] column, or a tile (an [N] vector broadcasts)."""
    if n.shape == ():
        return "scalar"
    return "vec" if len(n.shape) == 2 and n.shape[-1].constant == 1 else "tile"


def _free_size(ir: KernelIR, n: Node) -> Dim:
    """The reduced axis' size for a mean's 1/N: its operand's last dim."""
    return ir.node(n.args[0]).shape[-1]


class _RowBuilder:
    """The passes of one row kernel, built section by section over shared leaves and columns."""

    def __init__(self, ir: KernelIR, done: set[int], shape: tuple[Dim, ...]) -> None:
        self.ir, self.done, self.shape = ir, done, shape
        self.columns: dict[int, Operand] = {}  # [R, 1] values of earlier sections, by node id
        self.leaves: dict[int, Leaf] = {}  # every HBM value the kernel reads: its arguments
        self.constants: list[str] = []

    def section(self, nodes: list[int], prefix: str) -> tuple[StageBuilder, Selector, list[Leaf]]:
        """A builder and selector over this section's HBM leaves (the chunk's tiles) and the columns."""
        loaded: dict[int, Operand] = {}
        leaves: list[Leaf] = []
        computed = closure(self.ir, nodes, self.done | set(self.columns))
        for a in [*nodes, *(a for nid in computed for a in self.ir.node(nid).args)]:
            arg = self.ir.node(a)
            if a in self.done and a not in loaded and a not in self.columns and arg.op not in SCALARS:
                leaves.append(self._leaf(arg))
                loaded[a] = Operand("tile", f"{var(arg)}_t[0:pr, 0:fw]", dtype=arg.dtype)
        builder = StageBuilder(self.ir, {**loaded, **self.columns}, _kind, lambda n: _free_size(self.ir, n))
        return builder, Selector(Layout(part="pr", free="fw", free_alloc="_F_MOV"), prefix=prefix), leaves

    def _leaf(self, n: Node) -> Leaf:
        if _kind(n) == "vec" or (len(n.shape) == 2 and n.shape != self.shape):
            raise Mismatch(FAMILY, n.span, "a row kernel reading an HBM value neither [R, N] nor [N]")
        return self.leaves.setdefault(n.id, Leaf(var(n), n.dtype, len(n.shape) == 1))

    def finish(self, sel: Selector) -> tuple[str, ...]:
        """A section's lines, its launch-wide constants kept for the kernel's setup."""
        self.constants += [c for c in sel.constants if c not in self.constants]
        return tuple(sel.lines)


def row_kernel(ir: KernelIR, nodes: list[int], sums: list[int], done: set[int], kernel: str,
               into: list[Write]) -> Elementwise:  # fmt: skip
    """One row kernel writing `nodes` (each into its own buffer, `into`) and the token sums `sums` (of
    [R, N] values) from the values in HBM (`done`); raises Mismatch."""
    roots = [*nodes, *(ir.node(s).args[0] for s in sums)]
    if any(w.column is not None for w in into):
        raise Mismatch(FAMILY, ir.node(roots[0]).span, "a row kernel writing into a concatenation")
    shape = ir.node(roots[0]).shape
    computed = closure(ir, roots, done)
    for nid in computed:
        n = ir.node(nid)
        if _kind(n) == "tile" and len(n.shape) == 2 and n.shape != shape:
            raise Mismatch(FAMILY, n.span, "a row kernel over values of two widths")
    level: dict[int, int] = {}
    for nid in computed:
        n = ir.node(nid)
        below = max((level.get(a, 0) for a in n.args), default=0)
        level[nid] = below + 1 if is_row_reduction(ir, n) else below
    rows = _RowBuilder(ir, done, shape)
    try:
        passes = tuple(_pass(rows, computed, level, p) for p in range(1, max(level.values(), default=0) + 1))
        builder, sel, leaves = rows.section(roots, "e")
        exprs = {nid: builder.expr(nid) for nid in roots}  # all first: users counts must be complete
        writes = tuple((f"_v{w.buffer}", output_value(sel, exprs[w.value], ir.node(w.buffer).dtype).code, "")
                       for w in into)  # fmt: skip
        accs = [_column_sum(sel, exprs[ir.node(s).args[0]], f"cs{j}") for j, s in enumerate(sums)]
    except (StageError, SelectError) as err:
        raise Mismatch(FAMILY, ir.node(roots[0]).span, f"a row stage the selector cannot take: {err}"
                       ) from None  # fmt: skip
    lines = rows.finish(sel)
    width = next((lf.name for lf in rows.leaves.values() if not lf.vector), "")
    if not width:
        raise Mismatch(FAMILY, ir.node(roots[0]).span, "a row kernel over vectors only")
    setup = [*_dim_bindings(ir, computed, rows.leaves), *rows.constants]
    if sums:
        setup += ["ones = nl.ndarray((_P, 1), dtype=nl.float32, buffer=nl.sbuf)",
                  "nisa.memset(dst=ones[0:_P, 0:1], value=1.0)"]  # fmt: skip
        setup += [line for j in range(len(sums)) for line in (
            f"cs{j} = nl.ndarray((1, N), dtype=nl.float32, buffer=nl.sbuf)",
            f"nisa.memset(dst=cs{j}[0:1, 0:N], value=0.0)")]  # fmt: skip
    params = tuple(sorted({f"{n.name}_arg" for n in ir.nodes if n.op == "param"}))
    buffers = tuple((f"_v{w.buffer}", NL_DTYPE[ir.node(w.buffer).dtype], "N") for w in into)
    return Elementwise(
        kernel, tuple(rows.leaves.values()), params, (*lines, *(ln for acc in accs for ln in acc)), writes,
        buffers, f"{width}_hbm.shape", passes=passes, setup=tuple(setup), final_leaves=tuple(leaves),
        sums=tuple((f"_v{s}", f"cs{j}") for j, s in enumerate(sums)),
    )  # fmt: skip


def _pass(rows: _RowBuilder, computed: list[int], level: dict[int, int], p: int) -> RowPass:
    """Pass p: the level-p reductions accumulated over the chunks, then the level-p per-row math."""
    ir = rows.ir
    reductions = [nid for nid in computed if level[nid] == p and is_row_reduction(ir, ir.node(nid))]
    builder, sel, leaves = rows.section(reductions, f"p{p}_")
    parts = [sel.value(builder.expr(r)) for r in reductions]  # the chunk's share of each reduction
    lines = list(rows.finish(sel))
    before: list[str] = []
    for r, part in zip(reductions, parts, strict=True):
        acc = f"acc{r}"
        before += [f"{acc} = nl.ndarray((_P, 1), dtype=nl.float32, buffer=nl.sbuf)",
                   f"nisa.memset(dst={acc}[0:pr, 0:1], value=0.0)"]  # fmt: skip
        engine = GPSIMD if gpsimd_allows("tensor_tensor", ("nl.add",), part.memory == "psum") else VECTOR
        lines.append(f"nisa.tensor_tensor(dst={acc}[0:pr, 0:1], data1={acc}[0:pr, 0:1], data2={part.code}, "
                     f"op=nl.add, engine={engine})")  # fmt: skip
        rows.columns[r] = Operand("vec", f"{acc}[0:pr, 0:1]")
    later = [n for n in computed if level[n] > p or _kind(ir.node(n)) == "tile"]
    wanted = [nid for nid in computed if level[nid] == p and _kind(ir.node(nid)) == "vec"
              and nid not in rows.columns and any(nid in ir.node(u).args for u in later)]  # fmt: skip
    after_builder, after_sel, _ = rows.section(wanted, f"c{p}_")
    for nid in wanted:
        rows.columns[nid] = after_sel.value(after_builder.expr(nid))
    return RowPass(tuple(before), tuple(leaves), tuple(lines), rows.finish(after_sel))


def _column_sum(sel: Selector, expr: object, acc: str) -> tuple[str, ...]:
    """The chunk's column sums of `expr` by a ones-column matmul (fp32 pairs with fp32 on the PE), added
    into the core's [1, N] row `acc`."""
    value = sel.value(expr, "f32")  # type: ignore[arg-type]
    if value.memory == "psum" or value.dtype != "f32" or value.kind != "tile":
        value = sel.copy(value, "tile", "f32")
    ps = f"{acc}_ps"
    return (f"{ps} = nl.ndarray((_P, _F_MOV), dtype=nl.float32, buffer=nl.psum)",
            f"nisa.nc_matmul(dst={ps}[0:1, 0:fw], stationary=ones[0:pr, 0:1], moving={value.code}, "
            "accumulate=False)",
            f"nisa.tensor_tensor(dst={acc}[0:1, c0:c0 + fw], data1={acc}[0:1, c0:c0 + fw], "
            f"data2={ps}[0:1, 0:fw], op=nl.add)")  # fmt: skip


def _dim_bindings(ir: KernelIR, computed: list[int], leaves: dict[int, Leaf]) -> list[str]:
    """`d_<dim> = <leaf>_hbm.shape[axis]` for each dim the kernel's lines name (a dim's value, a mean's N)."""
    dims: set[str] = set()
    for nid in computed:
        n = ir.node(nid)
        dims.update(s for a in n.args if ir.node(a).op == "dim" for s in ir.node(a).attr("dim").symbols())  # type: ignore[union-attr]
        if n.op == "mean":
            dims.update(_free_size(ir, n).symbols())
    lines = []
    for d in sorted(dims):
        src = next((f"{lf.name}_hbm.shape[{axis}]" for nid, lf in leaves.items()
                    for axis, size in enumerate(ir.node(nid).shape) if size == Dim.sym(d)), None)  # fmt: skip
        if src is None:
            raise Mismatch(FAMILY, ir.node(computed[0]).span, f"dim {d}: no HBM value has it")
        lines.append(f"d_{d} = {src}")
    return lines
