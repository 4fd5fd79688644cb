"""Shared-HBM race detection: per-element, per-core codes of the last read/write (epoch, instruction).

Epochs are per tensor: a core_barrier orders accesses to its `data` tensor only [ISA core_barrier: "the
shared data that all cores need to synchronize on"], so it starts a new epoch of that tensor's tracker
alone. A code is ``epoch << 32 | instruction index``. Every core passes the same barriers on a tensor
(isa_lnc.barrier checks the cores name the same data), so cores run in lock-step between them, and
another core's entry belongs to this core's current epoch exactly when its code is >= ``epoch << 32``:
the check is independent of thread interleaving. Arrays are created once a tensor is first written (per
core and kind, when first needed); reads before that are only logged (read-only inputs cost a list append).
Each array has a hull (its latest epoch and the element range touched in it): a view outside another
core's hull of this epoch cannot conflict with it, so the scan is skipped (disjoint row blocks per core).
Arrays are kept for later launches (a fresh one costs a page fault per 4 KiB). Codes count epochs from
the tracker's base (above every epoch a released array holds), so a reused array needs no refill with
'never': its old codes all lie below the new tracker's epochs (an array released by a tracker created
later, possible with launches on several threads, is refilled).
"""

from __future__ import annotations

import threading

import torch

_KEEP_BYTES = 128 << 20  # code arrays kept for later launches (a fresh 14 MB array costs its page faults)
_spare: dict[int, list[tuple[torch.Tensor, int]]] = {}  # numel -> (released code array, its top epoch)
_spare_lock = threading.Lock()  # guards _spare and _next_base
_next_base = 0  # above every epoch (base + epoch) a released array holds: a new tracker's base
_MAX_BASE = 1 << 30  # codes are int64 ((base + epoch) << 32 | instr): start over well below overflow
Conflict = tuple[int, int, str]  # (other core, its instruction index, 'read' | 'write')
_View = tuple[tuple[int, ...], tuple[int, ...], int]
_Hull = tuple[int, int, int]  # (epoch, first element index, last element index)
_NO_HULL: _Hull = (-1, 0, -1)


class RaceTracker:
    """Per-allocation access history of each core for its current barrier epoch (of this allocation)."""

    def __init__(self, numel: int, cores: int) -> None:
        with _spare_lock:
            self.base = _next_base  # epochs in codes count from here (module docstring)
        self.top = self.base - 1  # the highest base + epoch among this tracker's codes
        self.numel = numel
        self.cores = cores
        self.lock = threading.Lock()
        self.tracking = False  # False until the first write: reads are only logged until then
        # code arrays per core, created when that core first reads / writes once tracking started
        self.reads: list[torch.Tensor | None] = [None] * cores
        self.writes: list[torch.Tensor | None] = [None] * cores
        # per core: (latest epoch with codes in its array, first and last element index touched in it);
        # a view outside that range holds no code of that epoch, so needs no scan
        self.read_hulls: list[_Hull] = [_NO_HULL] * cores
        self.write_hulls: list[_Hull] = [_NO_HULL] * cores
        self.read_log: list[tuple[int, int, int, _View]] = []  # (core, epoch, instr, view) before arrays
        self.log_epoch = 0  # entries of earlier epochs are dropped when a read of a later one comes
        self.epochs = [0] * cores  # per core: the core_barriers on this tensor it has passed

    def barrier(self, core: int) -> None:
        """The core passed a core_barrier on this tensor: its later accesses are ordered after the others'."""
        self.epochs[core] += 1

    def on_read(self, core: int, instr: int, view: _View) -> Conflict | None:
        """Record a read; report another core's write of the same elements in this epoch."""
        with self.lock:
            epoch = self.epochs[core]
            if not self.tracking:
                if epoch > self.log_epoch:
                    self.read_log = [e for e in self.read_log if e[1] >= epoch]
                    self.log_epoch = epoch
                self.read_log.append((core, epoch, instr, view))
                return None
            conflict = self._find(self.writes, self.write_hulls, core, epoch, view, "write")
            self._record(self.reads, self.read_hulls, core, view, epoch, instr)
            return conflict

    def on_write(self, core: int, instr: int, view: _View) -> Conflict | None:
        """Record a write; report another core's read or write of the same elements in this epoch."""
        with self.lock:
            epoch = self.epochs[core]
            if not self.tracking:
                self._start_tracking()
            conflict = self._find(self.writes, self.write_hulls, core, epoch, view, "write")
            conflict = conflict or self._find(self.reads, self.read_hulls, core, epoch, view, "read")
            self._record(self.writes, self.write_hulls, core, view, epoch, instr)
            return conflict

    def _array(self, arrays: list[torch.Tensor | None], core: int) -> torch.Tensor:
        """The core's code array of one kind (created filled with 'never')."""
        array = arrays[core]
        if array is None:
            with _spare_lock:
                spare = _spare.get(self.numel)
                array, top = spare.pop() if spare else (None, 0)
            if array is None:
                with torch.inference_mode(False):  # kept across launches: writable in any mode
                    array = torch.empty(self.numel, dtype=torch.int64).fill_(-1)
            elif top >= self.base:  # codes of a tracker created after this one: they could look current
                array.fill_(-1)
            arrays[core] = array
        return array

    def release(self) -> None:
        """The launch is over: keep the code arrays for later launches (up to _KEEP_BYTES in all)."""
        global _next_base
        with _spare_lock:
            _next_base = max(_next_base, self.top + 1)
            if _next_base >= _MAX_BASE:  # start the bases over: every kept array needs its refill
                _next_base = 0
                _spare.clear()
            kept = sum(a.numel() * 8 for arrays in _spare.values() for a, _ in arrays)
            for array in [*self.reads, *self.writes]:
                if array is not None and kept + self.numel * 8 <= _KEEP_BYTES:
                    _spare.setdefault(self.numel, []).append((array, self.top if _next_base else _MAX_BASE))
                    kept += self.numel * 8
        self.reads = [None] * self.cores
        self.writes = [None] * self.cores
        self.read_hulls = [_NO_HULL] * self.cores
        self.write_hulls = [_NO_HULL] * self.cores

    def _start_tracking(self) -> None:
        """Replay the logged reads into code arrays."""
        self.tracking = True
        for core, epoch, instr, view in self.read_log:
            self._record(self.reads, self.read_hulls, core, view, epoch, instr)
        self.read_log = []

    def _record(
        self,
        arrays: list[torch.Tensor | None],
        hulls: list[_Hull],
        core: int,
        view: _View,
        epoch: int,
        instr: int,
    ) -> None:
        """Store the access's code in the core's array of its kind, and widen its hull."""
        _mark(self._array(arrays, core), view, self.base + epoch, instr)
        self.top = max(self.top, self.base + epoch)
        last, lo, hi = hulls[core]
        first, final = _extent(view)
        if epoch > last:
            hulls[core] = (epoch, first, final)
        elif epoch == last:
            hulls[core] = (epoch, min(lo, first), max(hi, final))

    def _find(
        self,
        arrays: list[torch.Tensor | None],
        hulls: list[_Hull],
        core: int,
        epoch: int,
        view: _View,
        kind: str,
    ) -> Conflict | None:
        """First element another core touched (per `arrays`) in this epoch."""
        floor = (self.base + epoch) << 32
        first, final = _extent(view)
        for other, array in enumerate(arrays):
            last, lo, hi = hulls[other]
            if other == core or array is None or last < epoch or final < lo or hi < first:
                continue
            codes = torch.as_strided(array, *view)
            hit = codes >= floor
            if bool(hit.any()):
                code = int(codes[hit].reshape(-1)[0])
                return other, code & 0xFFFFFFFF, kind
        return None


def _extent(view: _View) -> tuple[int, int]:
    """First and last element index a view addresses (last < first when it is empty)."""
    shape, strides, offset = view
    if 0 in shape:
        return offset, offset - 1
    return offset, offset + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))


def _mark(array: torch.Tensor, view: _View, epoch: int, instr: int) -> None:
    """Store this access's code over the view's elements."""
    torch.as_strided(array, *view).fill_((epoch << 32) | instr)
