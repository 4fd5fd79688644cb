"""The FFN backward as a program of NKI kernels: the backward IR's GEMMs and its elementwise stages.

Every matmul of the backward IR becomes one GEMM kernel call (ffn_gemms.py.jinja): `transpose(P) @ D`
with P and D token-major is a reduction over the tokens (`token_gemm`: a weight gradient, and with it the
column sums of D where the IR sums D over the tokens: the bias gradient); `A @ transpose(B)` and `A @ B`
are row GEMMs (`row_gemm`: dH = dY @ W2^T, dX = dU @ W1^T, and the recomputed up-projections). The
elementwise nodes between them are lowered by the shared stage machinery (stage.py, select.py) into one
kernel per wave of GEMMs and value width, over [128 rows, 512 columns] tiles; a wave's elementwise kernel
reads the earlier waves' results from HBM, column slices of them at an offset, and writes a concatenation
of column slices' gradients into one buffer (backward_slices.py). A stage with a norm's row reductions, or
a sum over the tokens that no token GEMM carries (dγ, dβ), is a row kernel (backward_rows.py: passes over
each row tile's chunks). Backward IRs with anything else (a zero gradient) raise Mismatch: their ops train
through backward_reference.py.
"""

from __future__ import annotations

from collections import defaultdict

from fusegen.codegen.family import ELEMENTWISE, Mismatch
from fusegen.codegen.ffn import backward_rows
from fusegen.codegen.ffn.backward_parts import FAMILY, SCALARS, Call, Elementwise, Leaf, Program, Write, var
from fusegen.codegen.ffn.backward_slices import Concat, column_start, concats, dim_lines
from fusegen.codegen.rowreduce.lower import output_value
from fusegen.codegen.select import Layout, SelectError, Selector
from fusegen.codegen.select_tables import NL_DTYPE
from fusegen.codegen.stage import Operand, StageBuilder, StageError, dim_source
from fusegen.dsl.ir import Dim, KernelIR, Node


def _is_gemm(n: Node) -> bool:
    return n.op == "matmul" or (n.op == "sum" and n.attr("axis") == 0 and not n.attr("keepdim"))


def _check(ir: KernelIR, n: Node, rows: Dim) -> None:
    """Mismatch unless the program can carry node `n`."""
    if n.op in ("input", "transpose", *SCALARS) or n.op == "matmul" or backward_rows.is_row_reduction(ir, n):
        return
    if _is_gemm(n):
        if ir.node(n.args[0]).shape[0] != rows or len(ir.node(n.args[0]).shape) != 2:
            raise Mismatch(FAMILY, n.span, "a sum over an axis other than the tokens")
        return
    if n.op in ("index", "unindex") and column_start(n, rows) is None:
        raise Mismatch(FAMILY, n.span, f"an `{n.op}` other than a column slice keeping every row")
    if n.op not in ELEMENTWISE and n.op not in ("expand", "erf", "index", "unindex"):
        raise Mismatch(FAMILY, n.span, f"`{n.op}` has no backward kernel stage")
    if n.shape and (len(n.shape) != 2 or n.shape[0] != rows) and len(n.shape) != 1:
        raise Mismatch(FAMILY, n.span, "an elementwise value that is neither [R, N] nor [N]")


def build_program(ir: KernelIR, rows: Dim) -> Program:
    """The host program of backward IR `ir` (rows: the token dim); raises Mismatch."""
    for n in ir.nodes:
        _check(ir, n, rows)
    level = _levels(ir)
    cats = concats(ir, rows)
    lone = _lone_sums(ir)
    wanted = _demanded(ir, lone)
    direct = wanted - set(cats)  # values written to their own buffers
    demanded = direct | {p for c in cats.values() if c.node in wanted for p, _ in c.parts}
    users: dict[int, list[Node]] = defaultdict(list)
    for n in ir.nodes:
        for a in n.args:
            users[a].append(n)
    done: set[int] = {n.id for n in ir.nodes if n.op == "input"}
    calls: list[Call] = []
    kernels: list[Elementwise] = []
    dims: set[str] = set()
    for wave in range(max(level.values(), default=0) + 1):
        groups, sums = _wave_groups(ir, level, wave, demanded - done, lone)
        for shape in dict.fromkeys([*groups, *sums]):
            nodes = groups[shape]
            kernel, launch = _launch(ir, nodes, sums[shape], done, f"_ew{len(kernels)}_kernel",
                                     _into(ir, cats, nodes, direct))  # fmt: skip
            kernels.append(kernel)
            calls += launch
            dims.update(p.removeprefix("d_") for p in kernel.params if p.startswith("d_"))
            done.update(nodes, sums[shape])
            done.update(c.node for c in cats.values() if c.parts[0][0] in nodes)
        for n in ir.nodes:
            if n.op == "matmul" and level[n.id] == wave + 1:
                calls.append(_gemm_call(ir, n, users))
                done.add(n.id)
                done.update(u.id for u in users[n.args[1]] if u.op == "sum" and _paired(ir, n, u))
    _check_written(ir, [c for c in cats if c in wanted], done)
    returns = tuple(var(ir.node(o.node)) for o in ir.outputs)
    bindings = [Call(name, source) for name, source in dim_lines(ir, dims)]
    return Program(tuple(bindings + calls), tuple(kernels), returns)


def _wave_groups(
    ir: KernelIR, level: dict[int, int], wave: int, pending: set[int], lone: list[int]
) -> tuple[dict[tuple[object, ...], list[int]], dict[tuple[object, ...], list[int]]]:
    """The wave's unwritten elementwise values and its lone token sums, each by value shape: one kernel
    per shape computes both."""
    groups: dict[tuple[object, ...], list[int]] = defaultdict(list)
    for nid in sorted(pending):
        if level[nid] == wave:
            groups[ir.node(nid).shape].append(nid)
    sums: dict[tuple[object, ...], list[int]] = defaultdict(list)
    for s in lone:
        if level[ir.node(s).args[0]] == wave:
            sums[ir.node(ir.node(s).args[0]).shape].append(s)
    return groups, sums


def _launch(ir: KernelIR, nodes: list[int], sums: list[int], done: set[int], name: str, into: list[Write]
            ) -> tuple[Elementwise, list[Call]]:  # fmt: skip
    """One stage's kernel (a row kernel where it reduces rows or sums over the tokens) and the host lines
    that launch it and add its token sums' per-core partials."""
    if sums or backward_rows.needs_rows(ir, nodes, done):
        kernel = backward_rows.row_kernel(ir, nodes, sums, done, name, into)
    else:
        kernel = _elementwise(ir, nodes, done, name, into)
    params = [p.removesuffix("_arg") for p in kernel.params]  # the host's own names for them
    args = ", ".join([*kernel.sources, *params])
    calls = [Call(", ".join(kernel.results), f"{kernel.kernel}[lnc]({args})")]
    return kernel, calls + [Call(s, f"_add_cores_kernel[lnc]({s})[0]") for s, _ in kernel.sums]


def _check_written(ir: KernelIR, cats: list[int], done: set[int]) -> None:
    """Mismatch unless the program wrote every concatenation and token sum and no gradient is an input."""
    unwritten = [c for c in cats if c not in done]  # e.g. a part that is an input
    if unwritten:
        raise Mismatch(
            FAMILY, ir.node(unwritten[0]).span, "a concatenation of values no elementwise stage computes"
        )
    left = [n for n in ir.nodes if _is_gemm(n) and n.op == "sum" and n.id not in done]
    if left:
        raise Mismatch(FAMILY, left[0].span, "a sum over the tokens of a value no kernel computes")
    if any(ir.node(o.node).op == "input" for o in ir.outputs):
        raise Mismatch(FAMILY, ir.outputs[0].span, "a gradient that is an input as given")


def _into(ir: KernelIR, cats: dict[int, Concat], nodes: list[int], direct: set[int]) -> list[Write]:
    """Where the kernel computing `nodes` writes each: its own buffer where something reads it whole, and the
    concatenations it is a part of at their columns; Mismatch for a concatenation split between kernels."""
    writes = [Write(n, n, None) for n in nodes if n in direct]
    for c in cats.values():
        mine = [p for p, _ in c.parts if p in nodes]
        if mine and len(mine) < len(c.parts):
            raise Mismatch(
                FAMILY, ir.node(c.node).span, "a concatenation whose parts different kernels compute"
            )
        writes += [Write(part, c.node, start) for part, start in c.parts if mine]
    return writes


def _paired(ir: KernelIR, mm: Node, s: Node) -> bool:
    """Whether sum `s` is the column sum of the token GEMM `mm`'s right operand."""
    return ir.node(mm.args[0]).op == "transpose" and s.args[0] == mm.args[1]


def _levels(ir: KernelIR) -> dict[int, int]:
    """Wave of each node: a GEMM runs one wave after its operands; elementwise nodes join their operands'."""
    level: dict[int, int] = {}
    for n in ir.nodes:
        below = max((level[a] for a in n.args), default=0)
        level[n.id] = below + 1 if n.op == "matmul" else below
    for n in ir.nodes:  # a column sum is produced with its token GEMM (or its value's row kernel)
        if n.op == "sum" and _is_gemm(n):
            level[n.id] = max(level[n.id], level[n.args[0]] + 1)
    return level


def _lone_sums(ir: KernelIR) -> list[int]:
    """Sums over the tokens that are no token GEMM's column sums: their row kernels sum them."""
    gemms = [m for m in ir.nodes if m.op == "matmul"]
    return [n.id for n in ir.nodes if n.op == "sum" and _is_gemm(n)
            and not any(_paired(ir, m, n) for m in gemms)]  # fmt: skip


def _demanded(ir: KernelIR, lone: list[int]) -> set[int]:
    """Elementwise nodes some GEMM, sum or output reads: what the elementwise kernels must write (a lone
    token sum's value only where something else reads it)."""
    want = {o.node for o in ir.outputs}
    for n in ir.nodes:
        if _is_gemm(n) and n.id not in lone:
            want.update(n.args)
    want = {w for w in want if ir.node(w).op not in ("input", "transpose", "matmul", "sum", *SCALARS)}
    for n in ir.nodes:  # a transpose's operand is what the GEMM reads
        if n.op == "transpose" and n.id in {a for m in ir.nodes if m.op == "matmul" for a in m.args}:
            arg = ir.node(n.args[0])
            if arg.op not in ("input", "matmul", *SCALARS):
                want.add(arg.id)
    return want


def _operand(ir: KernelIR, nid: int) -> tuple[str, bool]:
    """A GEMM operand's host variable and whether it is transposed."""
    n = ir.node(nid)
    return (var(ir.node(n.args[0])), True) if n.op == "transpose" else (var(n), False)


def _gemm_call(ir: KernelIR, n: Node, users: dict[int, list[Node]]) -> Call:
    (a, a_t), (b, b_t) = _operand(ir, n.args[0]), _operand(ir, n.args[1])
    if a_t and not b_t:
        sums = [u for u in users[n.args[1]] if u.op == "sum" and _paired(ir, n, u)]
        return Call(f"_v{n.id}, {var(sums[0]) if sums else '_'}", f"_token_gemm({a}, {b}, lnc)")
    if a_t:
        raise Mismatch(FAMILY, n.span, "a GEMM with both operands transposed")
    return Call(f"_v{n.id}", f"_row_gemm({a}, {b}, {b_t}, lnc)")


def _elementwise(
    ir: KernelIR, nodes: list[int], done: set[int], kernel: str, into: list[Write]
) -> Elementwise:
    """One kernel computing `nodes` from the values already in HBM (`done`), one [pr, fw] tile at a time."""
    leaves, leaf_decls, dims = _frontier(ir, nodes, done)
    builder = StageBuilder(ir, leaves, lambda n: "scalar" if n.shape == () else "tile", lambda n: n.shape[-1])
    sel = Selector(Layout(part="pr", free="fw", free_alloc="_F_MOV"), prefix="e")
    try:
        exprs = {nid: builder.expr(nid) for nid in nodes}  # all first: users counts must be complete
        writes = tuple((f"_v{w.buffer}", output_value(sel, exprs[w.value], ir.node(w.buffer).dtype).code,
                        _offset(w.column)) for w in into)  # fmt: skip
    except (StageError, SelectError) as err:
        raise Mismatch(FAMILY, ir.node(nodes[0]).span, f"an elementwise stage the selector cannot take: {err}"
                       ) from None  # fmt: skip
    tiles = {lf.tile or f"{lf.name}_t" for lf in leaf_decls}
    if not leaf_decls or any(w[1].split("[")[0] in tiles for w in writes):
        raise Mismatch(FAMILY, ir.node(nodes[0]).span, "an elementwise stage that only copies")
    buffers = tuple(dict.fromkeys(_buffer(ir, w, dims) for w in into))
    width = _width(ir.node(nodes[0]), leaf_decls, dims)
    params = sorted({f"{n.name}_arg" for n in ir.nodes if n.op == "param"}) + [f"d_{d}" for d in sorted(dims)]
    return Elementwise(kernel, tuple(leaf_decls), tuple(params), tuple(sel.lines), writes, buffers, width)


def _buffer(ir: KernelIR, w: Write, dims: set[str]) -> tuple[str, str, str]:
    """A write's HBM buffer: its name, nl dtype and columns (`N`, or a concatenation's over `dims`)."""
    buffer = ir.node(w.buffer)
    if w.column is None:
        return f"_v{w.buffer}", NL_DTYPE[buffer.dtype], "N"
    dims.update((*buffer.shape[-1].symbols(), *w.column.symbols()))
    return f"_v{w.buffer}", NL_DTYPE[buffer.dtype], dim_source(buffer.shape[-1])


def _offset(column: Dim | None) -> str:
    """A first column's source in a kernel, "" for none or 0."""
    return "" if column is None or column == Dim.const(0) else dim_source(column)


def _frontier(
    ir: KernelIR, nodes: list[int], done: set[int]
) -> tuple[dict[int, Operand], list[Leaf], set[str]]:
    """The values in HBM (`done`, or a column slice of one) that `nodes` read through unwritten elementwise
    nodes: their operands by node, their leaf declarations, and the dims their column offsets read."""
    leaves: dict[int, Operand] = {}
    decls: list[Leaf] = []
    dims: set[str] = set()
    todo, seen = list(nodes), set(nodes)
    while todo:
        n = ir.node(todo.pop())
        for a in n.args:
            arg = ir.node(a)
            if a in seen or arg.op in SCALARS:
                continue
            seen.add(a)
            start = column_start(arg, arg.shape[0]) if arg.op == "index" and arg.args[0] in done else None
            if a in done:
                if len(arg.shape) == 2 and arg.shape != ir.node(nodes[0]).shape:  # an [R, 1] column
                    raise Mismatch(FAMILY, arg.span, "an elementwise stage reading neither [R, N] nor [N]")
                name = var(arg)
                leaves[a] = Operand("tile", f"{name}_t[0:pr, 0:fw]", dtype=arg.dtype)
                decls.append(Leaf(name, arg.dtype, len(arg.shape) == 1))
            elif start is not None:
                leaves[a] = Operand("tile", f"_s{a}_t[0:pr, 0:fw]", dtype=arg.dtype)
                decls.append(Leaf(var(ir.node(arg.args[0])), arg.dtype, False, _offset(start), f"_s{a}_t"))
                dims.update(start.symbols())
            else:
                todo.append(a)
    return leaves, decls, dims


def _width(n: Node, leaves: list[Leaf], dims: set[str]) -> str:
    """The source of the kernel's (R, N): a whole [R, N] leaf's shape, else a slice's rows and N's dims."""
    whole = next((lf.name for lf in leaves if not lf.vector and not lf.tile), "")
    if whole:
        return f"{whole}_hbm.shape"
    sliced = next((lf.name for lf in leaves if lf.tile), "")
    if not sliced:
        raise Mismatch(FAMILY, n.span, "an elementwise stage over vectors only")
    dims.update(n.shape[-1].symbols())
    return f"{sliced}_hbm.shape[0], {dim_source(n.shape[-1])}"
