"""The FFN backward as a program of NKI kernels: the backward IR's GEMMs and its elementwise stages.

Every matmul of the backward IR becomes one GEMM kernel call (ffn_gemms.py.jinja): `transpose(P) @ D`
with P and D token-major is a reduction over the tokens (`token_gemm`: a weight gradient, and with it the
column sums of D where the IR sums D over the tokens: the bias gradient); `A @ transpose(B)` and `A @ B`
are row GEMMs (`row_gemm`: dH = dY @ W2^T, dX = dU @ W1^T, and the recomputed up-projections). The
elementwise nodes between them are lowered by the shared stage machinery (stage.py, select.py) into one
kernel per wave of GEMMs and value width, over [128 rows, 512 columns] tiles; a wave's elementwise kernel
reads the earlier waves' results from HBM. A stage with a norm's row reductions, or a sum over the tokens
that no token GEMM carries (dγ, dβ), is a row kernel (backward_rows.py: passes over each row tile's
chunks). Backward IRs with anything else (an index, a zero gradient) raise Mismatch: their ops train
through backward_reference.py.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from fusegen.codegen.family import ELEMENTWISE, Mismatch
from fusegen.codegen.ffn import backward_rows  # imports this module back: only its functions use it
from fusegen.codegen.rowreduce.lower import output_value
from fusegen.codegen.select import Layout, SelectError, Selector
from fusegen.codegen.select_tables import NL_DTYPE
from fusegen.codegen.stage import Operand, StageBuilder, StageError
from fusegen.dsl.ir import Dim, KernelIR, Node

FAMILY = "ffn backward"
SCALARS = ("const", "param", "dim")


@dataclass(frozen=True)
class Leaf:
    """An HBM value an elementwise kernel reads: token-major [R, N], or an [N] vector broadcast over rows."""

    name: str  # the host's variable and the kernel's argument (`<name>_hbm`)
    dtype: str
    vector: bool

    @property
    def nl_dtype(self) -> str:
        """Its dtype in the kernel's source."""
        return NL_DTYPE[self.dtype]


@dataclass(frozen=True)
class Elementwise:
    """One elementwise kernel: its leaves, the lines of one tile, and the values it writes."""

    kernel: str
    leaves: tuple[Leaf, ...]
    params: tuple[str, ...]
    lines: tuple[str, ...]
    writes: tuple[tuple[str, str, str], ...]  # (result name, nl dtype, tile access)
    width: str  # a [R, N] leaf's name whose shape gives R and N
    # a row kernel's (backward_rows.py): its reduction passes, launch-wide lines, the last pass's loads
    # (None: all leaves) and its token sums (result name, the core's [1, N] accumulator)
    passes: tuple[backward_rows.RowPass, ...] = ()
    setup: tuple[str, ...] = ()
    final_leaves: tuple[Leaf, ...] | None = None
    sums: tuple[tuple[str, str], ...] = ()

    @property
    def results(self) -> tuple[str, ...]:
        """What the kernel returns: the written values, then the token sums' per-core partials."""
        return (*(w[0] for w in self.writes), *(s[0] for s in self.sums))


@dataclass(frozen=True)
class Call:
    """One host line: results = a GEMM helper's or an elementwise kernel's call."""

    results: str
    call: str


@dataclass(frozen=True)
class Program:
    """The FFN backward's host program and the elementwise kernels it launches."""

    calls: tuple[Call, ...]
    kernels: tuple[Elementwise, ...]
    returns: tuple[str, ...]


def _var(n: Node) -> str:
    """The host's variable holding node `n`: an input's own name, `_v<id>` for a computed value."""
    return str(n.name) if n.op == "input" else f"_v{n.id}"


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
    if n.op not in ELEMENTWISE and n.op != "expand":
        raise Mismatch(FAMILY, n.span, f"`{n.op}` has no backward kernel stage")
    if n.shape and (len(n.shape) != 2 or n.shape[0] != rows) and len(n.shape) != 1:
        raise Mismatch(FAMILY, n.span, "an elementwise value that is neither [R, N] nor [N]")


def build_program(ir: KernelIR, rows: Dim) -> Program:
    """The host program of backward IR `ir` (rows: the token dim); raises Mismatch."""
    for n in ir.nodes:
        _check(ir, n, rows)
    level = _levels(ir)
    lone = _lone_sums(ir)
    demanded = _demanded(ir, lone)
    users: dict[int, list[Node]] = defaultdict(list)
    for n in ir.nodes:
        for a in n.args:
            users[a].append(n)
    done: set[int] = {n.id for n in ir.nodes if n.op == "input"}
    calls: list[Call] = []
    kernels: list[Elementwise] = []
    for wave in range(max(level.values(), default=0) + 1):
        groups: dict[tuple[object, ...], list[int]] = defaultdict(list)
        for nid in sorted(demanded):
            if level[nid] == wave and nid not in done:
                groups[ir.node(nid).shape].append(nid)
        sums: dict[tuple[object, ...], list[int]] = defaultdict(list)  # lone token sums, by value shape
        for s in lone:
            if level[ir.node(s).args[0]] == wave:
                sums[ir.node(ir.node(s).args[0]).shape].append(s)
        for shape in dict.fromkeys([*groups, *sums]):
            nodes, name = groups[shape], f"_ew{len(kernels)}_kernel"
            if sums[shape] or backward_rows.needs_rows(ir, nodes, done):
                kernel = backward_rows.row_kernel(ir, nodes, sums[shape], done, name)
            else:
                kernel = _elementwise(ir, nodes, done, name)
            kernels.append(kernel)
            params = [p.removesuffix("_arg") for p in kernel.params]  # the host's own names for them
            args = ", ".join([*(lf.name for lf in kernel.leaves), *params])
            calls.append(Call(", ".join(kernel.results), f"{kernel.kernel}[lnc]({args})"))
            calls += [Call(s, f"_add_cores_kernel[lnc]({s})[0]") for s, _ in kernel.sums]
            done.update(nodes, sums[shape])
        for n in ir.nodes:
            if n.op == "matmul" and level[n.id] == wave + 1:
                calls.append(_gemm_call(ir, n, users))
                done.add(n.id)
                done.update(u.id for u in users[n.args[1]] if u.op == "sum" and _paired(ir, n, u))
    left = [n for n in ir.nodes if _is_gemm(n) and n.op == "sum" and n.id not in done]
    if left:
        raise Mismatch(FAMILY, left[0].span, "a sum over the tokens of a value no kernel computes")
    if any(ir.node(o.node).op == "input" for o in ir.outputs):
        raise Mismatch(FAMILY, ir.outputs[0].span, "a gradient that is an input as given")
    returns = tuple(_var(ir.node(o.node)) for o in ir.outputs)
    return Program(tuple(calls), tuple(kernels), returns)


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
    return (_var(ir.node(n.args[0])), True) if n.op == "transpose" else (_var(n), False)


def _gemm_call(ir: KernelIR, n: Node, users: dict[int, list[Node]]) -> Call:
    (a, a_t), (b, b_t) = _operand(ir, n.args[0]), _operand(ir, n.args[1])
    if a_t and not b_t:
        sums = [u for u in users[n.args[1]] if u.op == "sum" and _paired(ir, n, u)]
        return Call(f"_v{n.id}, {_var(sums[0]) if sums else '_'}", f"_token_gemm({a}, {b}, lnc)")
    if a_t:
        raise Mismatch(FAMILY, n.span, "a GEMM with both operands transposed")
    return Call(f"_v{n.id}", f"_row_gemm({a}, {b}, {b_t}, lnc)")


def _elementwise(ir: KernelIR, nodes: list[int], done: set[int], kernel: str) -> Elementwise:
    """One kernel computing `nodes` from the values already in HBM (`done`), one [pr, fw] tile at a time."""
    leaves: dict[int, Operand] = {}
    leaf_decls: list[Leaf] = []
    todo, seen = list(nodes), set(nodes)
    while todo:  # the frontier: values in HBM that the nodes read through unwritten elementwise nodes
        n = ir.node(todo.pop())
        for a in n.args:
            arg = ir.node(a)
            if a in seen or arg.op in SCALARS:
                continue
            seen.add(a)
            if a in done:
                name = _var(arg)
                leaves[a] = Operand("tile", f"{name}_t[0:pr, 0:fw]", dtype=arg.dtype)
                leaf_decls.append(Leaf(name, arg.dtype, len(arg.shape) == 1))
            else:
                todo.append(a)
    builder = StageBuilder(ir, leaves, lambda n: "scalar" if n.shape == () else "tile", lambda n: n.shape[-1])
    sel = Selector(Layout(part="pr", free="fw", free_alloc="_F_MOV"), prefix="e")
    try:
        exprs = {nid: builder.expr(nid) for nid in nodes}  # all first: users counts must be complete
        writes = tuple((f"_v{nid}", NL_DTYPE[ir.node(nid).dtype],
                        output_value(sel, exprs[nid], ir.node(nid).dtype).code) for nid in nodes)  # fmt: skip
    except (StageError, SelectError) as err:
        raise Mismatch(FAMILY, ir.node(nodes[0]).span, f"an elementwise stage the selector cannot take: {err}"
                       ) from None  # fmt: skip
    if any(w[2].split("[")[0] in {lf.name + "_t" for lf in leaf_decls} for w in writes) or not leaf_decls:
        raise Mismatch(FAMILY, ir.node(nodes[0]).span, "an elementwise stage that only copies")
    params = tuple(sorted({f"{n.name}_arg" for n in ir.nodes if n.op == "param"}))
    width = next((lf.name for lf in leaf_decls if not lf.vector), "")
    if not width:
        raise Mismatch(FAMILY, ir.node(nodes[0]).span, "an elementwise stage over vectors only")
    return Elementwise(kernel, tuple(leaf_decls), params, tuple(sel.lines), writes, width)
