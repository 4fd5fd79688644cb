"""Deferred nc_matmul: an accumulation group is computed as one GEMM when its PSUM tile is next used.

Kernels accumulate a PSUM tile over the contraction dim in many small matmuls (the seed kernel: ten of
K=128 per tile). The group's GEMM runs when another instruction touches the PSUM tile, when too many
groups are pending, or when the instance ends; only then are its matmuls' operands copied as fp32 into
K-stacked buffers, so copies and GEMM both run off the instance's turn, overlapping the other instances'
Python work (CoreBarrier). An operand tile stays unchanged until then: writing it first runs the pending
groups that read it (Alloc.readers), as touching the PSUM tile does (Alloc.pending). One K-stacked GEMM
is cheaper than many small ones. The result equals accumulating in PSUM one matmul at a time, up to fp32
summation order.

Operands that are column ranges of whole partition rows are stacked as those whole rows (copying
rows is sequential, so fast, where column blocks are strided), and a stacked block is not copied again
while the buffer still holds it unchanged (same allocation, rows and write version): the seed kernel's
later matmuls mostly read other columns of rows stacked for an earlier group. A thread's groups share
its stacks over time, a few per side and stacked width ("ways"): a group takes the one that holds its
first block already, so interleaved accumulations over other operands (a gate's and an up-projection's
weights; a contraction split over two groups) do not evict each other's blocks. No two pending groups
share a stack, and each copies its blocks just before its GEMM, so any pending group may still grow: a
matmul joins the latest pending group into its PSUM tile (groups into other tiles commute with it), and
a kernel interleaving its K-blocks' accumulations I-tile by I-tile runs one GEMM per K-block, not one per
matmul. Operands that DMAs brought from a caller input are not stacked at all but read from fp32 data
shared by the instances (provenance.py).

Which blocks a group must copy is decided when its matmuls are queued (on the instance's turn); the
GEMM thread then makes one copy call for them all and one GEMM call. All Python work is serialized by
the GIL anyway, and the GEMM thread would otherwise wait for the GIL after each of many small torch
calls. When its GEMMs are done but another instance still holds the turn, a thread runs its next
pending groups that no later matmul can join, rather than idle until the turn is free.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Protocol

import torch

from .memory import Alloc, MemoryRegion, ViewKey
from .provenance import Piece, block, extend, piece
from .tensor import NkiTensor

_ROWS = 2048  # stacked contraction rows per group; a longer accumulation continues in a new group
_STACK = 1 << 20  # elements per stack (4 MiB): wide row-stacked operands allow fewer rows
_WIDE = 2048  # operand tiles up to this many elements per partition are stacked as whole rows
_PENDING = 4  # pending groups per instance
_threads = threading.local()  # stacks per thread, kept across launches (no fresh pages per launch)
Tag = tuple[int, int, ViewKey]  # (allocation id, write version, view): identifies an operand's data
Layout = tuple[ViewKey, int, int]  # (view to stack, stacked width, operand's first column in it)
Places = tuple[tuple[int, int], tuple[int, int]]  # (stacked width, column) of stationary and moving


class _Stack:
    """A flat fp32 buffer of K-stacked operand blocks, remembering which data each block holds."""

    __slots__ = ("flat", "matrices", "tags", "targets", "used")

    def __init__(self) -> None:
        self.used = 0  # when a group last took it (a count per thread)
        self.flat = torch.empty(0)
        self.tags: dict[int, tuple[Tag, int]] = {}  # start offset -> (tag, length) of blocks in place
        self.targets: dict[tuple[int, tuple[int, ...]], torch.Tensor] = {}  # (start, shape) -> view of flat
        self.matrices: dict[tuple[int, int, int, int, bool], torch.Tensor] = {}  # GEMM operand views of flat

    def reserve(self, size: int) -> None:
        """Make room for `size` elements (contents are lost when it grows)."""
        if self.flat.numel() < size:
            with torch.inference_mode(False):  # kept across launches: a normal tensor, writable in any mode
                self.flat = torch.empty(size)
            self.tags = {}
            self.targets = {}
            self.matrices = {}

    def put(self, start: int, t: NkiTensor, key: ViewKey, copies: _Copies) -> None:
        """Plan storing view `key` of t's allocation at flat offset `start` (contiguously), unless the
        buffer will hold it then anyway: appends (target, source) to `copies`, run before the GEMM."""
        alloc = t.alloc
        tag = (alloc.id, alloc.version, key)
        shape = key[0]
        length = math.prod(shape)
        if self.tags.get(start) == (tag, length):
            return
        target = self.targets.get((start, shape))
        if target is None:
            if len(self.targets) > 4096:  # a few hundred distinct blocks per kernel: never grows unbounded
                self.targets = {}
            target = self.targets[(start, shape)] = self.flat[start : start + length].view(shape)
        copies[0].append(target)
        copies[1].append(alloc.view(key))
        end = start + length
        for old in [s for s, (_, n) in self.tags.items() if s < end and start < s + n]:
            del self.tags[old]
        self.tags[start] = (tag, length)

    def matrix(self, rows: int, layout: tuple[int, int], cols: int, transposed: bool) -> torch.Tensor:
        """The stacked operand: [rows, cols] at column `col` of a [rows, width] stack (or its transpose),
        cached (groups of a kernel repeat a few shapes, and each torch view call costs microseconds)."""
        key = (rows, *layout, cols, transposed)
        view = self.matrices.get(key)
        if view is None:
            if len(self.matrices) > 256:  # kernels use a few group shapes: never grows unbounded
                self.matrices = {}
            width, col = layout
            view = self.flat[: rows * width].view(rows, width)[:, col : col + cols]
            view = self.matrices[key] = view.t() if transposed else view
        return view


_Copies = tuple[list[torch.Tensor], list[torch.Tensor]]  # copy targets (stack blocks) and their sources
_KEPT_STACKS = 16  # stacks per thread (side, width, way) before they start over (each <= 4 MiB)
_WAYS = 4  # stacks per side and width (more than the other pending groups can take: _PENDING - 1)


def _stack(side: int, width: int, first: Tag, busy: list[_Stack]) -> _Stack:
    """This thread's stack for a group's side (0 stationary, 1 moving) and stacked width whose first
    block is `first`: of up to _WAYS such stacks not `busy` (taken by another pending group), the one
    holding that block at its start, else the least recently used. Groups of a thread share them over
    time: a group copies its blocks just before its GEMM, so a block planned for it stays in place until
    it has run, as no other pending group plans on its stacks."""
    stacks: dict[tuple[int, int, int], _Stack] = getattr(_threads, "stacks", {})
    _threads.stacks = stacks
    live = {way: s for way in range(_WAYS) if (s := stacks.get((side, width, way))) is not None}
    live = {way: s for way, s in live.items() if not any(s is b for b in busy)}
    held = (first, math.prod(first[2][0]))
    way = next((way for way, s in live.items() if s.tags.get(0) == held), None)
    if way is None:
        free = [way for way in range(_WAYS) if stacks.get((side, width, way)) is None]
        way = free[0] if free else min(live, key=lambda way: live[way].used)
    stack = live.get(way)
    if stack is None:
        if len(stacks) >= _KEPT_STACKS:
            stacks.clear()  # pending groups keep the stacks they planned on
        stack = stacks[(side, width, way)] = _Stack()
        stack.reserve(min(_ROWS, _STACK // width) * width)  # a group's most: never grows under pending ones
    _threads.uses = stack.used = getattr(_threads, "uses", 0) + 1
    return stack


def _layout(t: NkiTensor) -> Layout:
    """How an operand is stacked: its whole partition rows when it is a wide enough column range of them
    (a narrow one would leave the GEMM a narrow strided operand, which MKL handles slowly)."""
    cache_key = (t.alloc.pstride, t.key)
    layout = _LAYOUTS.get(cache_key)
    if layout is None:
        if len(_LAYOUTS) > 4096:  # kernels use a few hundred distinct operand views: never grows unbounded
            _LAYOUTS.clear()
        layout = _LAYOUTS[cache_key] = _new_layout(t)
    return layout


_LAYOUTS: dict[tuple[int, ViewKey], Layout] = {}


def _new_layout(t: NkiTensor) -> Layout:
    """Uncached _layout."""
    w, p, n = t.alloc.pstride, t.partitions, t.free_size
    if len(t.shape) == 2 and t.strides[1] == 1 and (p == 1 or t.strides[0] == w) and n * 4 >= w <= _WIDE:
        row, col = divmod(t.offset, w)
        if col + n <= w:
            return ((p, w), (w, 1), row * w), w, col
    return t.key, n, 0  # any other view: its elements, stacked contiguously as [p, n]


class _Group:
    """Pending matmuls into one PSUM view: out (+)= A.T @ B over the K-stacked operands."""

    __slots__ = (
        "alloc",
        "beta",
        "copies",
        "held",
        "key",
        "limit",
        "out",
        "places",
        "readers",
        "reads",
        "rows",
        "runs",
        "stacks",
    )  # fmt: skip

    def __init__(self, d: NkiTensor, out: torch.Tensor, beta: float, places: Places) -> None:
        self.alloc = d.alloc  # keeps the tile (and its pooled storage) alive until the GEMM ran
        self.key = d.key
        self.out = out
        self.beta = beta
        self.rows = 0
        self.places = places
        self.copies: _Copies = ([], [])  # stack blocks to fill before the GEMM, and their sources
        self.readers: list[Alloc] = []  # operand allocations, per matmul
        self.reads: set[int] = set()  # ids of the operand allocations
        self.limit = min(_ROWS, _STACK // max(width for width, _ in self.places))
        self.stacks: list[_Stack | None] = [None, None]  # per side, taken when it first stacks a block
        # per side: its operands as consecutive rows of one caller input, while they are (provenance.py),
        # else None; and those operands as (row, tile, view), to stack after all if a later one breaks the run
        self.runs: list[list[Piece] | None] = [[], []]
        self.held: tuple[list[tuple[int, NkiTensor, ViewKey]], ...] = ([], [])

    def fits(self, d: NkiTensor, k: int, beta: float, places: Places) -> bool:
        """Can a matmul into `d` join this group (same view, accumulating, operands placed alike)?"""
        return (
            self.alloc is d.alloc
            and self.key == d.key
            and beta != 0.0
            and self.rows + k <= self.limit
            and self.places == places
        )

    def append(
        self, st: NkiTensor, key_a: ViewKey, mv: NkiTensor, key_b: ViewKey, pending: list[_Group]
    ) -> None:
        """Add one matmul's operands below the stacked rows so far (a stack taken now avoids those of the
        other `pending` groups)."""
        self._place(0, st, key_a, pending)
        self._place(1, mv, key_b, pending)
        self.rows += st.partitions
        self.readers += (st.alloc, mv.alloc)
        self.reads.update((st.alloc.id, mv.alloc.id))

    def _place(self, side: int, t: NkiTensor, key: ViewKey, pending: list[_Group]) -> None:
        """Extend the side's run of input rows with view `key` of t, or plan its stack copy."""
        run = self.runs[side]
        width = self.places[side][0]
        if run is not None:
            found = piece(t.alloc, t.key)  # the operand's own view: a DMA may have filled only that part
            if found is not None and extend(run, found):
                self.held[side].append((self.rows, t, key))
                return
            self.runs[side] = None
            for row, earlier, earlier_key in self.held[side]:  # the run is broken: stack it after all
                self._put(side, row * width, earlier, earlier_key, pending)
        self._put(side, self.rows * width, t, key, pending)

    def _put(self, side: int, start: int, t: NkiTensor, key: ViewKey, pending: list[_Group]) -> None:
        """Plan stacking view `key` of t at `start` of the side's stack (taken by its first block)."""
        stack = self.stacks[side]
        if stack is None:
            tag = (t.alloc.id, t.alloc.version, key)
            busy = [s for g in pending if g is not self for s in g.stacks if s is not None]  # once per side
            stack = self.stacks[side] = _stack(side, self.places[side][0], tag, busy)
        stack.put(start, t, key, self.copies)

    def _matrix(self, side: int, cols: int, keep: list[object]) -> torch.Tensor | Callable[[], torch.Tensor]:
        """The side's [rows, cols] operand (the stationary side transposed, as the GEMM reads it): a view
        of an input's fp32 copy (the copy appended to `keep`), or of the stack; or, for a copy not made
        yet, a function making it."""
        run = self.runs[side]
        if run:
            source, key = block(run)  # [rows, cols]: the pieces are the operands' own views
            keep.append(source)  # alive until the GEMM ran: its buffer returns to a pool when freed
            view = source.made(key)
            if view is not None:  # converted by an earlier GEMM: viewed here, on the turn
                return view.t() if side == 0 else view
            # converted by the first GEMM that needs it, off the turn
            return (lambda: source.view(key).t()) if side == 0 else (lambda: source.view(key))
        stack = self.stacks[side]
        assert stack is not None  # a side that is no run has stacked its blocks
        return stack.matrix(self.rows, self.places[side], cols, side == 0)

    def gemm(self) -> Callable[[], None]:
        """The group's work, to run off the turn: fill the stack blocks, then out (+)= the stacked
        product. Its views are made here, on the turn where they can be: the GEMM thread then only makes
        the copy and GEMM calls, which release the GIL, instead of waiting for the GIL (held by the other
        instance's Python) again after each small view call too."""
        copies, out, beta = self.copies, self.out, self.beta
        m, n = out.shape
        sources: list[object] = []  # the input copies the views read, held by the closure until it has run
        a, b = self._matrix(0, m, sources), self._matrix(1, n, sources)

        def run() -> None:
            """Stack, then multiply-accumulate."""
            if copies[0]:
                torch._foreach_copy_(*copies)
            out.addmm_(_made(a), _made(b), beta=beta)
            sources.clear()

        return run


def _made(operand: torch.Tensor | Callable[[], torch.Tensor]) -> torch.Tensor:
    """A GEMM operand view made on the turn, or made now (converting its data first)."""
    return operand if isinstance(operand, torch.Tensor) else operand()


class OffTurn(Protocol):
    """CoreBarrier.off_turn: run `fn` off the turn, then `idle` until the turn is free (or it is False)."""

    def __call__(self, fn: Callable[[], None], idle: Callable[[], bool] | None = None) -> None: ...


class MatmulQueue:
    """One instance's pending accumulation groups, computed in order by flush()."""

    def __init__(self, off_turn: OffTurn) -> None:
        self.groups: list[_Group] = []
        self.off_turn = off_turn

    def add(self, d: NkiTensor, out: torch.Tensor, st: NkiTensor, mv: NkiTensor, beta: float) -> None:
        """Queue out (+)= st.T @ mv (SBUF views of any dtype as [K, M] and [K, N]); beta 0 overwrites."""
        (key_a, width_a, col_a), (key_b, width_b, col_b) = _layout(st), _layout(mv)
        places = ((width_a, col_a), (width_b, col_b))
        group = self._joinable(d, st.partitions, beta, places)
        if group is None:
            if len(self.groups) == _PENDING:
                self.flush()
            group = _Group(d, out, beta, places)
            self.groups.append(group)
            d.alloc.pending = True
        group.append(st, key_a, mv, key_b, self.groups)
        st.alloc.readers += 1
        mv.alloc.readers += 1
        if not st.alloc.region is mv.alloc.region is MemoryRegion.sbuf:  # a rule broken in warn mode:
            self.flush()  # another core may write HBM operands (after a barrier) before a later flush

    def _joinable(self, d: NkiTensor, k: int, beta: float, places: Places) -> _Group | None:
        """The pending group a matmul into `d` joins: the latest into `d`'s tile, if it fits. An older
        group than the last may grow: groups into other tiles commute with it, and none shares its stacks.
        (A kernel interleaving K-blocks' accumulations I-tile by I-tile then runs a GEMM per K-block.)"""
        for group in reversed(self.groups):
            if group.alloc is d.alloc:
                return group if group.fits(d, k, beta, places) else None
        return None

    def flush(self, alloc: Alloc | None = None) -> None:
        """Run the pending GEMMs in issue order, up to the last one into or reading `alloc` (default: all).

        They run while other instances take their turn. Only what is needed runs: between two GEMMs
        this thread needs the GIL, which the instance holding the turn rarely yields (it may wait a
        whole switch interval), so one GEMM per flush keeps both cores busy.
        """
        if alloc is None:
            count = len(self.groups)
        else:
            count = 1 + max(i for i, g in enumerate(self.groups) if g.alloc is alloc or alloc.id in g.reads)
        if not count:
            return
        done, self.groups = self.groups[:count], self.groups[count:]

        work = [g.gemm() for g in done]

        def gemms() -> None:
            """The GEMMs of the flushed groups."""
            for run in work:
                run()

        try:
            self.off_turn(gemms, self._early)
        finally:  # a failed GEMM still leaves its tiles' flags consistent with the queue
            self._done(done)

    def _early(self) -> bool:
        """While the turn is taken: run the oldest pending group but the last (later matmuls into its tile
        start a new group), instead of idling; False if there is none. Off the turn, but the queue and the
        tiles it touches belong to this instance, whose own Python waits in flush() meanwhile."""
        if len(self.groups) < 2:
            return False
        group = self.groups.pop(0)
        try:
            group.gemm()()
        finally:  # even if it failed: its tile is no longer pending, its operands no longer read by it
            self._done([group])
        return True

    def _done(self, done: list[_Group]) -> None:
        """Bookkeeping after the GEMMs of `done` ran: their PSUM tiles and operands are free again."""
        for g in done:
            g.alloc.pending = any(p.alloc is g.alloc for p in self.groups)
            for operand in g.readers:
                operand.readers -= 1
