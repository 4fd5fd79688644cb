"""The execution path shared by all instructions: operand checks, reads, writes, trace record."""

from __future__ import annotations

import warnings

import torch

from . import dtypes
from .conformance import violation
from .context import current
from .errors import (
    BarrierError,
    RaceError,
    ShapeMismatchError,
    SimError,
    UninitializedReadError,
    UninitializedReadWarning,
    user_site,
)
from .memory import Alloc, MemoryRegion
from .rule_tables import FREE_SIZE_ENGINES, FREE_SIZE_MAX, MAX_VIEW_DIMS, START_PARTITIONS
from .tensor import NkiTensor, contiguous_strides

_SMALLEST_FREE_MAX = min(FREE_SIZE_MAX.values())
OFF_TURN_COPY = 1 << 17  # elements (>= ~100 us of copy, well above the cost of a turn hand-over): stores
# at least this big copy off the instance's turn


class Instr:
    """One executing instruction: collects operands and bytes, then appends its trace record."""

    __slots__ = ("bytes", "ctx", "engine", "index", "op", "operands", "site")

    def __init__(self, op: str, engine: str) -> None:
        ctx = self.ctx = current()
        self.op = op
        self.engine = engine
        self.site = user_site()
        if ctx.core > ctx.launch.stop_above:
            raise self.fail(BarrierError, f"core {ctx.core} stopped: core {ctx.launch.stop_above} failed")
        self.index = len(ctx.sites)
        ctx.sites.append(self.site)
        ctx.ops.append(op)
        self.operands: list[tuple[str, int, str, tuple[int, ...], str]] = []
        self.bytes = [0, 0, 0, 0, 0, 0]  # hbm r/w, sbuf r/w, psum r/w

    def fail(self, cls: type[SimError], detail: str) -> SimError:
        """An exception located at this instruction's source line."""
        return cls(f"{self.site[0]}:{self.site[1]}: {self.op}: {detail}")

    # ---- operand validation ----------------------------------------------------------------------
    def tensor(self, value: object, role: str) -> NkiTensor:
        """Require an NkiTensor operand."""
        if not isinstance(value, NkiTensor):
            raise self.fail(ShapeMismatchError, f"{role} must be a tensor, got {type(value).__name__}")
        if len(value.shape) > MAX_VIEW_DIMS and value.alloc.on_chip:
            violation(self, "view-dims", f"{role} is a {len(value.shape)}-D view {value.shape}")
        return value

    def forbid(self, t: NkiTensor, regions: tuple[MemoryRegion, ...], role: str, rule: str) -> None:
        """Report `rule` (rules.py) if `t` lives in one of `regions`."""
        if t.alloc.region in regions:
            violation(self, rule, f"{role} in {t.alloc.region.value} ({t.alloc.label()})")

    def on_chip(self, *pairs: tuple[NkiTensor, str]) -> None:
        """Compute engines read and write SBUF/PSUM only, within the start-partition and free-size rules."""
        for t, role in pairs:
            alloc = t.alloc
            if not alloc.on_chip:
                violation(self, "compute-on-chip", f"{role} in {alloc.region.value} ({self.engine} engine)")
            if t.offset >= alloc.pstride or t.free_size > _SMALLEST_FREE_MAX:  # rare: most views pass both
                self._access_rules(t, role)

    def _access_rules(self, t: NkiTensor, role: str) -> None:
        """rules.py start-partition and engine-free-size for one on-chip operand."""
        alloc = t.alloc
        first = t.offset // alloc.pstride
        if first not in START_PARTITIONS[min(t.partitions, len(START_PARTITIONS) - 1)]:
            violation(
                self, "start-partition", f"{role} spans {t.partitions} partitions from partition {first}"
            )
        limit = FREE_SIZE_MAX[alloc.region_name]
        if self.engine in FREE_SIZE_ENGINES and t.free_size > limit:
            violation(
                self,
                "engine-free-size",
                f"{role} has {t.free_size} elements per partition in {alloc.region_name} (limit {limit})",
            )

    def same_layout(self, a: NkiTensor, b: NkiTensor, roles: str) -> None:
        """Elementwise rule: equal partitions and equal elements per partition."""
        if a.partitions != b.partitions or a.free_size != b.free_size:
            raise self.fail(
                ShapeMismatchError,
                f"{roles}: shapes {a.shape} and {b.shape} differ in "
                f"partitions "
                f"({a.partitions} vs {b.partitions}) or elements per partition "
                f"({a.free_size} vs {b.free_size})",
            )

    # ---- data access -----------------------------------------------------------------------------
    def read(self, t: NkiTensor, role: str = "in") -> torch.Tensor:
        """Storage view of `t` (its real dtype), after init/race checks and accounting."""
        self.check_read(t, role)
        return t.materialize()

    def read_f32(self, t: NkiTensor, role: str = "in") -> torch.Tensor:
        """Like read, but as fp32 (cached per allocation: engines upcast every input)."""
        self.check_read(t, role)
        return t.alloc.f32_view(t.key)

    def check_read(self, t: NkiTensor, role: str) -> None:
        """Initialization and race checks, accounting."""
        alloc = t.alloc
        if alloc.pending:
            self.ctx.matmuls.flush(alloc)
        if not alloc.all_written and t.key not in alloc.known_written:
            self._check_initialized(t, role)
        if alloc.race is not None:
            self._track_race(t, write=False)
        self.account(t, "r", 0)

    def write(self, t: NkiTensor, value: torch.Tensor) -> None:
        """Store `value` (any dtype, t.numel elements) into `t`, rounding to t.dtype (RNE)."""
        alloc = self._writable(t)
        target = t.materialize()
        start = alloc.data.data_ptr()
        if start <= value.data_ptr() < start + alloc.numel * alloc.itemsize:
            value = value.clone()  # e.g. a shifting copy within one tile: source and target overlap
        value = dtypes.cast_for_store(value, alloc.dtype)
        if t.numel >= OFF_TURN_COPY and self.ctx.grid > 1:  # the copy releases the GIL: another instance
            self.ctx.off_turn(lambda: _store(target, value))  # takes its turn meanwhile (barrier.py)
        else:
            _store(target, value)
        self._written(t)

    def write_later(self, t: NkiTensor, source: torch.Tensor) -> None:
        """Like write, for `source` of t's dtype that stays unchanged until the launch ends (an unwritten
        caller input's view): the copy is made when t's storage is next viewed (Alloc.defer_copy)."""
        self._writable(t).defer_copy(t.key, source)
        self._written(t)

    def _writable(self, t: NkiTensor) -> Alloc:
        """Before a write to `t`: pending matmuls reading its old data run, race check, copy on write."""
        alloc = t.alloc
        if alloc.pending or alloc.readers:
            self.ctx.matmuls.flush(alloc)
        if alloc.race is not None:
            self._track_race(t, write=True)
        alloc.make_private()
        return alloc

    def _written(self, t: NkiTensor) -> None:
        """After a write to `t`: written mask, end of any accumulation group there, accounting."""
        alloc = t.alloc
        self.mark_written(t)
        if alloc.mm_any:  # non-matmul writes end an accumulation group
            t.materialize(alloc.matmul_flags()).fill_(False)
            alloc.mm_full.clear()
        self.account(t, "w", 1)

    def mark_written(self, t: NkiTensor) -> None:
        """Set the written mask over `t` (a write of the whole allocation needs no mask)."""
        alloc = t.alloc
        alloc.dirty = True
        alloc.shadow_ok = False
        alloc.version += 1
        if alloc.all_written or t.key in alloc.known_written:
            return
        if t.numel == alloc.numel and t.key == (alloc.shape, contiguous_strides(alloc.shape), 0):
            alloc.all_written = True
            alloc.written = None
            alloc.written_pending.clear()
            return
        alloc.known_written.add(t.key)
        alloc.written_pending.append(t.key)  # set in the mask when a check needs it (Alloc.written_mask)
        if t.numel >= alloc.numel:
            alloc.all_written = bool(alloc.written_mask().all())

    def account(self, t: NkiTensor, role: str, write: int) -> None:
        """Bytes per memory level, liveness bounds and the operand list."""
        alloc = t.alloc
        self.bytes[alloc.level + write] += t.numel * alloc.itemsize
        span = alloc.span
        if span is not None:
            if span.first_use is None:
                span.first_use = self.index
            span.last_use = self.index
        use = (role, t.shape)
        operand = alloc.operands.get(use)
        if operand is None:  # one tuple per distinct use: fewer objects for the cyclic GC to scan later
            operand = alloc.operands[use] = (role, alloc.id, alloc.region_name, t.shape, alloc.dtype_name)
        self.operands.append(operand)

    def _check_initialized(self, t: NkiTensor, role: str) -> None:
        """Reads of never-written elements: error, or a warning (and NaN data) when strict=False."""
        if any(t.within(key) for key in t.alloc.known_written):  # no mask reduction (~30 us) needed
            t.alloc.known_written.add(t.key)
            return
        missing = unwritten_count(t)
        if not missing:
            t.alloc.known_written.add(t.key)
            return
        detail = f"{role} reads {missing} of {t.numel} never-written elements of {t.alloc.label()}"
        if self.ctx.strict and t.alloc.race is not None:
            # Shared HBM under LNC: another core may be about to write these elements, which is a race
            # (reported when it happens); the read itself is reported after the run if no race is.
            self.ctx.launch.deferred.append((self.ctx.core, self.fail(UninitializedReadError, detail)))
        elif self.ctx.strict:
            raise self.fail(UninitializedReadError, detail)
        else:
            warnings.warn(
                f"{self.site[0]}:{self.site[1]}: {self.op}: {detail}", UninitializedReadWarning, stacklevel=4
            )
        if t.alloc.readers:  # poisoning writes the data pending matmuls are still to read
            self.ctx.matmuls.flush(t.alloc)
        t.alloc.poison_unwritten(t.key)

    def _track_race(self, t: NkiTensor, write: bool) -> None:
        """Raise RaceError when another core touched these elements in this barrier epoch of the tensor."""
        tracker = t.alloc.race
        assert tracker is not None
        view = (t.shape, t.strides, t.offset)
        track = tracker.on_write if write else tracker.on_read
        conflict = track(self.ctx.core, self.index, view)
        if conflict is None:
            return
        other, other_index, kind = conflict
        ctx = self.ctx
        them = ctx.launch.contexts[other]
        accesses = [
            (ctx.core, "write" if write else "read", self.site, self.op),
            (other, kind, them.sites[other_index], them.ops[other_index]),
        ]
        # Named from the higher core's side whichever core noticed: the message does not depend on timing
        late, early = sorted(accesses, reverse=True)
        (file, line), early_file, early_line = late[2], *early[2]
        raise RaceError(
            f"{file}:{line}: {late[3]}: core {late[0]} {late[1]}s elements of {t.alloc.label()} that core "
            f"{early[0]} {early[1]}s at {early_file}:{early_line} with no core_barrier on this tensor "
            f"between them (a barrier orders only its data: separate them with "
            f"nisa.core_barrier(data=<this tensor>))"
        )

    def finish(self, partitions: int, elems: int, psum_bank: int | None = None) -> None:
        """Append this instruction's trace record (as a Row: trace.py)."""
        b = self.bytes
        self.ctx.records.append(
            (
                self.index,
                self.ctx.core,
                self.engine,
                self.op,
                tuple(self.operands),
                partitions,
                elems,
                b[0],
                b[1],
                b[2],
                b[3],
                b[4],
                b[5],
                psum_bank,
                self.site[0],
                self.site[1],
                self.ctx.epoch,
            )
        )


def _store(target: torch.Tensor, value: torch.Tensor) -> None:
    """Copy `value` (of target's element count) into the storage view `target`."""
    target.copy_(value if value.shape == target.shape else value.reshape(target.shape))


def unwritten_count(t: NkiTensor) -> int:
    """How many elements of `t` were never written."""
    alloc = t.alloc
    if alloc.all_written:
        return 0
    if not alloc.has_writes():
        return t.numel
    mask = t.materialize(alloc.written_mask())
    return 0 if bool(mask.all()) else int((~mask).sum())
