"""A rows-on-partitions FFN stage (epilogue or prologue) swept over K in F_MOV-wide blocks.

Row statistics (sum, max; LayerNorm's mean then variance) need a whole row, so the stage becomes
passes over the blocks: pass n finishes the statistics of nesting depth n, accumulating each block's
partial column into a running [P, 1] column; the [P, 1] arithmetic that only needs finished statistics
(a mean, an rstd) runs once between passes; the last pass computes the results block by block.
Every full-width value lives for one block only, so SBUF use does not grow with K; values a later
pass needs again are recomputed from their block loads (cheap next to the projections).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from fusegen.codegen.budget_base import Stage
from fusegen.codegen.select import Selector
from fusegen.codegen.stage import Expr, Operand
from fusegen.dsl.ir import DTYPE_BYTES

#: how a pass starts each kind of running statistic, and how a block's partial joins it
RUNNING = {"sum": ("0.0", "nl.add"), "max": ("-3.0e38", "nl.maximum")}


@dataclass
class BlockSelector(Selector):
    """A Selector that sweeps: values held across the block loop, and tiles forgotten between sweeps."""

    _pinned: set[int] = field(default_factory=set)

    def hold(self, e: Expr, operand: Operand) -> None:
        """From now on `e` is `operand` (a value computed elsewhere, e.g. a statistic finished by a pass)."""
        self._memo[(id(e), "f32")] = operand

    def holds(self, e: Expr) -> bool:
        """Whether `e` is already computed (or held) in f32."""
        return (id(e), "f32") in self._memo

    def pin(self, e: Expr, operand: Operand) -> None:
        """Hold `e` as `operand` for good: a tile kept across sweeps (e.g. written into the accumulator)."""
        self.hold(e, operand)
        self._pinned.add(id(e))

    def forget_tiles(self) -> None:
        """Drop memoised tiles (a new sweep over blocks recomputes them); columns and pinned tiles stay."""
        self._memo = {
            key: op for key, op in self._memo.items() if op.kind != "tile" or key[0] in self._pinned
        }


@dataclass(frozen=True)
class BlockLoad:
    """One input DMA'd per block: an [R, K] row block, or a [K] vector broadcast over the partitions."""

    tile: str  # the SBUF tile it lands in
    src: str  # source access expression
    nbytes: int  # bytes per element read from HBM
    broadcast: bool


@dataclass(frozen=True)
class BlockPass:
    """Code of one pass: once per row tile before the block loop, then per block (loads first); its share
    of the stage's figures (`Stage.act`, `dve`, the SBUF bytes of its block, its running columns)."""

    before: tuple[str, ...]
    loads: tuple[BlockLoad, ...]
    lines: tuple[str, ...]
    act: int = 0
    dve: int = 0
    block_bytes: int = 0
    running: tuple[str, ...] = ()  # the [P, 1] statistics it accumulates, allocated in `before`
    hoisted: tuple[str, ...] = ()  # a statistics pass's [P, 1] work before its blocks, first in `before`
    in_place: bool = False  # it computes the accumulator's spine into the accumulator's block
    after: tuple[str, ...] = ()  # once per row tile after the block loop (the last block's deferred writes)


@dataclass(frozen=True)
class BlockedStage:
    """A stage's passes and its counts for the budget model."""

    passes: tuple[BlockPass, ...]
    model: Stage


def block_reduction(e: Expr) -> bool:
    """A row statistic over the free axis: it needs every block of the row."""
    return e.op in RUNNING and e.kind == "vec" and bool(e.args) and e.args[0].kind == "tile"


def emit_blocked(
    sel: BlockSelector,
    roots: list[Expr],
    loads: dict[str, BlockLoad],
    finish: Callable[[BlockSelector], list[str]],
    writes: int,
    accumulator: str = "",
) -> BlockedStage:
    """Passes computing the statistics under `roots`, then `finish` (which reads the roots through `sel`
    and returns its per-block lines, `writes` DMA transfers per block among them); `loads` maps leaf
    tile names to their block loads. `accumulator`: the code of an f32 leaf whose block the first pass may
    overwrite with its only user, so later passes read that value instead of recomputing it."""
    depth: dict[int, int] = {}
    reductions: list[Expr] = []
    for root in roots:
        _levels(root, depth, reductions)
    spine = _spine(roots, accumulator, depth) if reductions else None
    passes, col_ops = [], 0
    for level in range(1, max((depth[id(r)] for r in reductions), default=0) + 1):
        stats = [r for r in reductions if depth[id(r)] == level]
        in_place = (spine, accumulator) if level == 1 and spine is not None else None
        calls = len(sel.calls)
        passes.append(_engines(sel, calls, _statistics_pass(sel, stats, loads, level, in_place)))
        col_ops += len(stats)
    sel.forget_tiles()
    calls = len(sel.calls)
    before = _hoist(sel, roots)
    needed = _needed(roots, sel, loads)
    mark = len(sel.lines)
    last = finish(sel)
    lines = tuple(sel.lines[mark:]) + tuple(last)
    del sel.lines[mark:]
    passes.append(_engines(sel, calls, BlockPass(before, needed, lines)))
    sized = _sized(sel, passes)
    return BlockedStage(sized, _count(sel, sized, col_ops, writes))


def _engines(sel: BlockSelector, start: int, ps: BlockPass) -> BlockPass:
    """`ps` with its full-width instructions' weighted counts (those `sel` emitted since call `start`)."""
    return replace(ps, act=sel.passes("act", start), dve=sel.passes("dve", start))


def fold_first(stage: BlockedStage) -> tuple[BlockPass, BlockedStage] | None:
    """The stage's first statistics pass apart, when it reads nothing but its `accumulator` leaf's block
    (`acc_blk`) and sets up nothing but its running columns, so another loop producing that block (the
    column-blocked eviction) can accumulate it; and the stage without it, its figures less the pass's.
    None when the stage has no such pass."""
    first = stage.passes[0]
    if len(stage.passes) < 2 or [ld.tile for ld in first.loads] != ["acc_blk"] or first.hoisted:
        return None
    # folded, the pass reads the eviction's value tile, whose write to the scratch is already issued: a pass
    # computing in place would overwrite it under that write
    assert not first.in_place, "a folded pass must leave the block it reads as it is"
    st = stage.model
    rest = st._replace(
        sweeps=st.sweeps - 1,
        cols=st.cols - len(first.running),  # held per row tile in the evictions' loop instead (`folded`)
        act=st.act - first.act,
        dve=st.dve - first.dve,
        col_ops=st.col_ops - len(first.running),
        read_bytes=st.read_bytes - sum(ld.nbytes for ld in first.loads),
        loads=st.loads - len(first.loads),
    )
    return first, BlockedStage(stage.passes[1:], rest)


def _levels(e: Expr, depth: dict[int, int], order: list[Expr]) -> int:
    """Nesting depth of row statistics under `e` (memoised in `depth`); statistics collected in `order`."""
    if id(e) not in depth:
        below = max((_levels(a, depth, order) for a in e.args), default=0)
        depth[id(e)] = below + 1 if block_reduction(e) else below
        if block_reduction(e):
            order.append(e)
    return depth[id(e)]


def _spine(roots: list[Expr], accumulator: str, depth: dict[int, int]) -> Expr | None:
    """The top of the accumulator leaf's spine, computed in place into the accumulator's block by the
    first pass."""
    leaf = _find_leaf(roots, accumulator)
    chain = spine(roots, leaf, depth, columns=True) if leaf is not None else []
    return chain[-1] if chain else None


def _find_leaf(roots: list[Expr], code: str) -> Expr | None:
    """The leaf expression whose operand code is `code`, if the roots read it."""
    for e in walk(roots):
        if e.op == "leaf" and e.leaf is not None and e.leaf.code == code:
            return e
    return None


def walk(roots: list[Expr]) -> list[Expr]:
    """Every expression under `roots`, each once."""
    seen: dict[int, Expr] = {}
    todo = list(roots)
    while todo:
        e = todo.pop()
        if id(e) not in seen:
            seen[id(e)] = e
            todo.extend(e.args)
    return list(seen.values())


def spine(
    roots: list[Expr], leaf: Expr, depth: dict[int, int] | None = None, columns: bool = False
) -> list[Expr]:
    """The full-width values computable from `leaf` before any row statistic, bottom up: a chain in which
    every value below the top has one user and is no output (so overwriting it loses nothing); empty if
    the leaf's user does not qualify. `columns`: [P, 1] operands may join the chain."""
    if depth is None:
        depth = {}
        for root in roots:
            _levels(root, depth, [])
    parents: dict[int, list[Expr]] = {}
    for e in walk(roots):
        for a in dict.fromkeys(e.args):
            parents.setdefault(id(a), []).append(e)
    outputs = {id(r) for r in roots}
    chain, node = [], leaf
    while node.users == 1 and id(node) not in outputs and len(parents.get(id(node), [])) == 1:
        up = parents[id(node)][0]
        if up.kind != "tile" or depth[id(up)] != 0 or up.op == "cast":
            break
        if not columns and any(a.kind == "vec" for a in up.args):
            break
        chain.append(up)
        node = up
    return chain


def _in_place(sel: BlockSelector, stats: list[Expr], spine: Expr, accumulator: str) -> bool:
    """Whether `spine` may be computed into the accumulator's block: emitted on trial, no statistic, fused
    down to the accumulator's own value, reads the block after the spine's write (`sum(square(d))` is one
    activation_reduce of d: squared in place first, it gave d**4)."""
    trial = sel.fork()
    mark = len(trial.lines)
    for stat in stats:
        trial.value(stat)
    tile = trial.value(spine).code
    lines = trial.lines[mark:]
    written = next(i for i, line in enumerate(lines) if f"dst={tile}" in line)
    return not any(accumulator in line for line in lines[written + 1 :])


def _statistics_pass(
    sel: BlockSelector,
    stats: list[Expr],
    loads: dict[str, BlockLoad],
    level: int,
    in_place: tuple[Expr, str] | None,
) -> BlockPass:
    """The pass accumulating `stats` (nesting depth `level`) block by block into running [P, 1] columns."""
    sel.forget_tiles()
    hoisted = _hoist(sel, stats)
    before = list(hoisted)
    running, names = [], []
    for n, stat in enumerate(stats):
        name = f"{sel.prefix}s{level}_{n}"
        init, _ = RUNNING[stat.op]
        before += [
            f"{name} = nl.ndarray((_P, 1), dtype=nl.float32, buffer=nl.sbuf)",
            f"nisa.memset(dst={name}[0:pr, 0:1], value={init})",
        ]
        running.append(Operand("vec", f"{name}[0:pr, 0:1]"))
        names.append(name)
    needed = _needed(stats, sel, loads)
    spine, accumulator = in_place or (None, "")
    placed = spine is not None and _in_place(sel, stats, spine, accumulator)
    if spine is not None and placed:  # the spine's value is written into the accumulator's block
        sel.into[id(spine)] = Operand("tile", accumulator)
    mark = len(sel.lines)
    parts = [sel.value(stat) for stat in stats]
    if spine is not None and placed:  # held there across the sweeps (computed now if no statistic did)
        sel.pin(spine, sel.value(spine))
        del sel.into[id(spine)]
    lines = sel.lines[mark:]
    del sel.lines[mark:]
    for stat, part, total in zip(stats, parts, running, strict=True):
        op = RUNNING[stat.op][1]
        lines.append(f"nisa.tensor_tensor(dst={total.code}, data1={total.code}, data2={part.code}, op={op})")
        sel.hold(stat, total)
    return BlockPass(
        tuple(before), needed, tuple(lines), running=tuple(names), hoisted=hoisted, in_place=placed
    )


def _hoist(sel: BlockSelector, roots: list[Expr]) -> tuple[str, ...]:
    """Emit the [P, 1] values under `roots` that need only finished statistics; their lines."""
    mark = len(sel.lines)
    seen: set[int] = set()

    def visit(e: Expr) -> None:
        if id(e) in seen:
            return
        seen.add(id(e))
        if e.kind == "vec" and e.op != "leaf" and _ready(sel, e):
            sel.value(e)
            return
        for a in e.args:
            visit(a)

    for root in roots:
        visit(root)
    lines = tuple(sel.lines[mark:])
    del sel.lines[mark:]
    return lines


def _ready(sel: BlockSelector, e: Expr) -> bool:
    """Computable before a block loop: a held statistic, or [P, 1] / scalar work over ready values."""
    if sel.holds(e):
        return True
    if e.kind == "tile" or block_reduction(e):
        return False
    return all(_ready(sel, a) for a in e.args)


def _needed(roots: list[Expr], sel: BlockSelector, loads: dict[str, BlockLoad]) -> tuple[BlockLoad, ...]:
    """The block loads the leaves under `roots` read, stopping at values already held."""
    found: dict[str, BlockLoad] = {}
    seen: set[int] = set()
    todo = list(roots)
    while todo:
        e = todo.pop()
        if id(e) in seen or sel.holds(e):
            continue
        seen.add(id(e))
        if e.op == "leaf" and e.leaf is not None:
            name = e.leaf.code.split("[")[0]
            if name in loads:
                found[name] = loads[name]
        todo.extend(e.args)
    return tuple(found[n] for n in sorted(found))


def _sized(sel: BlockSelector, passes: list[BlockPass]) -> tuple[BlockPass, ...]:
    """Each pass with the bytes per block column of its temporaries and block loads."""
    dtypes = {name: DTYPE_BYTES[dtype] for name, kind, dtype in sel.tiles if kind == "tile"}
    sized = []
    for ps in passes:
        made = {line.split(" = nl.ndarray")[0] for line in ps.lines if " = nl.ndarray((_P, kb)" in line}
        sized.append(replace(ps, block_bytes=sum(dtypes.get(t, 4) for t in made) + 4 * len(ps.loads)))
    return tuple(sized)


def _count(sel: BlockSelector, passes: tuple[BlockPass, ...], col_ops: int, writes: int) -> Stage:
    """The stage's figures for the budget model, from the code emitted."""
    cols = sum(1 for _, kind, _ in sel.tiles if kind == "vec") + col_ops
    return Stage(
        block_bytes=max(ps.block_bytes for ps in passes),
        cols=cols,
        sweeps=len(passes),
        act=sel.passes("act"),
        dve=sel.passes("dve"),
        col_ops=col_ops,
        read_bytes=sum(ld.nbytes for ps in passes for ld in ps.loads if not ld.broadcast),
        bcast=sum(1 for ps in passes for ld in ps.loads if ld.broadcast),
        loads=sum(len(ps.loads) for ps in passes) + writes,
    )
