"""Shared-HBM race detection: per-element, per-core codes of the last read/write (epoch, instruction).

A code is ``epoch << 32 | instruction index``. Cores run in lock-step between barriers, so another
core's entry belongs to the current epoch exactly when its code is >= ``epoch << 32``: the check is
independent of thread interleaving. Arrays are created on the first write; reads before that are only
logged (read-only inputs then cost one list append per read).
"""

from __future__ import annotations

import threading

import torch

Conflict = tuple[int, int, str]  # (other core, its instruction index, 'read' | 'write')
_View = tuple[tuple[int, ...], tuple[int, ...], int]


class RaceTracker:
    """Per-allocation access history of each core for the current barrier epoch."""

    def __init__(self, numel: int, cores: int) -> None:
        self.numel = numel
        self.cores = cores
        self.lock = threading.Lock()
        self.reads: list[torch.Tensor] | None = None
        self.writes: list[torch.Tensor] | None = None
        self.read_log: list[tuple[int, int, int, _View]] = []  # (core, epoch, instr, view) before arrays

    def on_read(self, core: int, epoch: int, instr: int, view: _View) -> Conflict | None:
        """Record a read; report another core's write of the same elements in this epoch."""
        with self.lock:
            if self.writes is None or self.reads is None:
                self.read_log = [e for e in self.read_log if e[1] >= epoch]
                self.read_log.append((core, epoch, instr, view))
                return None
            conflict = self._find(self.writes, core, epoch, view, "write")
            _mark(self.reads[core], view, epoch, instr)
            return conflict

    def on_write(self, core: int, epoch: int, instr: int, view: _View) -> Conflict | None:
        """Record a write; report another core's read or write of the same elements in this epoch."""
        with self.lock:
            if self.writes is None or self.reads is None:
                self._start_tracking()
            assert self.writes is not None and self.reads is not None
            conflict = self._find(self.writes, core, epoch, view, "write")
            conflict = conflict or self._find(self.reads, core, epoch, view, "read")
            _mark(self.writes[core], view, epoch, instr)
            return conflict

    def _start_tracking(self) -> None:
        """Allocate the code arrays and replay the logged reads."""
        fresh = [torch.full((self.numel,), -1, dtype=torch.int64) for _ in range(self.cores)]
        self.writes = fresh
        self.reads = [torch.full((self.numel,), -1, dtype=torch.int64) for _ in range(self.cores)]
        for core, epoch, instr, view in self.read_log:
            _mark(self.reads[core], view, epoch, instr)
        self.read_log = []

    def _find(
        self, arrays: list[torch.Tensor], core: int, epoch: int, view: _View, kind: str
    ) -> Conflict | None:
        """First element another core touched (per `arrays`) in this epoch."""
        floor = epoch << 32
        for other in range(self.cores):
            if other == core:
                continue
            codes = torch.as_strided(arrays[other], *view)
            hit = codes >= floor
            if bool(hit.any()):
                code = int(codes[hit].reshape(-1)[0])
                return other, code & 0xFFFFFFFF, kind
        return None


def _mark(array: torch.Tensor, view: _View, epoch: int, instr: int) -> None:
    """Store this access's code over the view's elements."""
    torch.as_strided(array, *view).fill_((epoch << 32) | instr)
