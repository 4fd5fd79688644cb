"""The execution path shared by all instructions: operand checks, reads, writes, trace record."""

from __future__ import annotations

import warnings

import torch

from . import dtypes
from .context import Context, current
from .errors import (
    EngineMemoryError,
    RaceError,
    ShapeMismatchError,
    SimError,
    UninitializedReadError,
    UninitializedReadWarning,
    user_site,
)
from .memory import MemoryRegion
from .tensor import NkiTensor, contiguous_strides
from .trace import Record


class Instr:
    """One executing instruction: collects operands and bytes, then appends its Record."""

    __slots__ = ("bytes", "ctx", "engine", "index", "op", "operands", "site")

    def __init__(self, op: str, engine: str) -> None:
        self.ctx: Context = current()
        self.op = op
        self.engine = engine
        self.site = user_site()
        self.index = len(self.ctx.sites)
        self.ctx.sites.append(self.site)
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
        return value

    def forbid(self, t: NkiTensor, regions: tuple[MemoryRegion, ...], role: str, why: str) -> None:
        """Raise EngineMemoryError if `t` lives in one of `regions`."""
        if t.alloc.region in regions:
            raise self.fail(EngineMemoryError, f"{role} in {t.alloc.region.value}: {why} ({t.alloc.label()})")

    def on_chip(self, *pairs: tuple[NkiTensor, str]) -> None:
        """Compute engines read and write SBUF/PSUM only."""
        for t, role in pairs:
            if not t.alloc.on_chip:
                raise self.fail(
                    EngineMemoryError,
                    f"{role} in {t.alloc.region.value}: {self.engine} engine "
                    f"accesses SBUF/PSUM only; move HBM data with nisa.dma_copy",
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
        self._before_read(t, role)
        return t.materialize()

    def read_f32(self, t: NkiTensor, role: str = "in") -> torch.Tensor:
        """Like read, but as fp32 (cached per allocation: engines upcast every input)."""
        self._before_read(t, role)
        return t.materialize(t.alloc.as_float32())

    def _before_read(self, t: NkiTensor, role: str) -> None:
        """Initialization and race checks, accounting."""
        alloc = t.alloc
        if not alloc.all_written and t.key not in alloc.known_written:
            self._check_initialized(t, role)
        if alloc.race is not None:
            self._track_race(t, write=False)
        self.account(t, "r", 0)

    def write(self, t: NkiTensor, value: torch.Tensor, matmul: bool = False) -> None:
        """Store `value` (any dtype, t.numel elements) into `t`, rounding to t.dtype (RNE)."""
        alloc = t.alloc
        if alloc.race is not None:
            self._track_race(t, write=True)
        alloc.make_private()
        target = t.materialize()
        if value.untyped_storage().data_ptr() == alloc.data.untyped_storage().data_ptr():
            value = value.clone()  # e.g. a shifting copy within one tile: source and target overlap
        value = dtypes.cast_for_store(value, alloc.dtype)
        target.copy_(value if value.shape == t.shape else value.reshape(t.shape))
        self.mark_written(t)
        if alloc.mm_any and not matmul:  # non-matmul writes end an accumulation group
            t.materialize(alloc.matmul_flags()).fill_(False)
            alloc.mm_full.clear()
        self.account(t, "w", 1)

    def mark_written(self, t: NkiTensor) -> None:
        """Set the written mask over `t` (a write of the whole allocation needs no mask)."""
        alloc = t.alloc
        alloc.dirty = True
        alloc.shadow = None
        if alloc.all_written:
            return
        if t.numel == alloc.numel and t.key == (alloc.shape, contiguous_strides(alloc.shape), 0):
            alloc.all_written = True
            alloc.written = None
            return
        mask = alloc.written_mask()
        t.materialize(mask).fill_(True)
        alloc.known_written.add(t.key)
        if t.numel >= alloc.numel:
            alloc.all_written = bool(mask.all())

    def account(self, t: NkiTensor, role: str, write: int) -> None:
        """Bytes per memory level, liveness bounds and the operand list."""
        alloc = t.alloc
        self.bytes[alloc.level + write] += t.numel * alloc.itemsize
        if alloc.on_chip:
            if alloc.first_use is None:
                alloc.first_use = self.index
            alloc.last_use = self.index
        self.operands.append((role, alloc.id, alloc.region_name, t.shape, alloc.dtype_name))

    def _check_initialized(self, t: NkiTensor, role: str) -> None:
        """Reads of never-written elements: error, or a warning (and NaN data) when strict=False."""
        missing = unwritten_count(t)
        if not missing:
            t.alloc.known_written.add(t.key)
            return
        detail = f"{role} reads {missing} of {t.numel} never-written elements of {t.alloc.label()}"
        if self.ctx.strict and t.alloc.race is not None:
            # Shared HBM under LNC: another core may be about to write these elements, which is a race
            # (reported when it happens); the read itself is reported after the run if no race is.
            self.ctx.launch.deferred.append(self.fail(UninitializedReadError, detail))
        elif self.ctx.strict:
            raise self.fail(UninitializedReadError, detail)
        else:
            warnings.warn(
                f"{self.site[0]}:{self.site[1]}: {self.op}: {detail}", UninitializedReadWarning, stacklevel=4
            )
        t.alloc.poison_unwritten()

    def _track_race(self, t: NkiTensor, write: bool) -> None:
        """Raise RaceError when another core touched these elements in this barrier epoch."""
        tracker = t.alloc.race
        assert tracker is not None
        view = (t.shape, t.strides, t.offset)
        track = tracker.on_write if write else tracker.on_read
        conflict = track(self.ctx.core, self.ctx.epoch, self.index, view)
        if conflict is None:
            return
        other, other_index, kind = conflict
        file, line = self.ctx.launch.contexts[other].sites[other_index]
        mine = "writes" if write else "reads"
        raise self.fail(
            RaceError,
            f"core {self.ctx.core} {mine} elements of {t.alloc.label()} that core "
            f"{other} {kind}s at {file}:{line} in the same barrier epoch {self.ctx.epoch} "
            f"(separate them with nisa.core_barrier)",
        )

    def finish(self, partitions: int, elems: int, psum_bank: int | None = None) -> None:
        """Append this instruction's trace record."""
        b = self.bytes
        self.ctx.records.append(
            Record(
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


def unwritten_count(t: NkiTensor) -> int:
    """How many elements of `t` were never written."""
    alloc = t.alloc
    if alloc.all_written:
        return 0
    if alloc.written is None:
        return t.numel
    mask = t.materialize(alloc.written)
    return 0 if bool(mask.all()) else int((~mask).sum())
