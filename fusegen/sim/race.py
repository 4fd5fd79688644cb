"""Shared-HBM race detection: per-element, per-core codes of the last read/write (epoch, instruction).

A code is ``epoch << 32 | instruction index``. Cores run in lock-step between barriers, so another
core's entry belongs to the current epoch exactly when its code is >= ``epoch << 32``: the check is
independent of thread interleaving. Arrays are created once a tensor is first written (per core and
kind, when first needed); reads before that are only logged (read-only inputs cost a list append).
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
        self.tracking = False  # False until the first write: reads are only logged until then
        # code arrays per core, created when that core first reads / writes once tracking started
        self.reads: list[torch.Tensor | None] = [None] * cores
        self.writes: list[torch.Tensor | None] = [None] * cores
        self.read_log: list[tuple[int, int, int, _View]] = []  # (core, epoch, instr, view) before arrays
        self.log_epoch = 0  # entries of earlier epochs are dropped when a read of a later one comes

    def on_read(self, core: int, epoch: int, instr: int, view: _View) -> Conflict | None:
        """Record a read; report another core's write of the same elements in this epoch."""
        with self.lock:
            if not self.tracking:
                if epoch > self.log_epoch:
                    self.read_log = [e for e in self.read_log if e[1] >= epoch]
                    self.log_epoch = epoch
                self.read_log.append((core, epoch, instr, view))
                return None
            conflict = self._find(self.writes, core, epoch, view, "write")
            _mark(self._array(self.reads, core), view, epoch, instr)
            return conflict

    def on_write(self, core: int, epoch: int, instr: int, view: _View) -> Conflict | None:
        """Record a write; report another core's read or write of the same elements in this epoch."""
        with self.lock:
            if not self.tracking:
                self._start_tracking()
            conflict = self._find(self.writes, core, epoch, view, "write")
            conflict = conflict or self._find(self.reads, core, epoch, view, "read")
            _mark(self._array(self.writes, core), view, epoch, instr)
            return conflict

    def _array(self, arrays: list[torch.Tensor | None], core: int) -> torch.Tensor:
        """The core's code array of one kind (created filled with 'never')."""
        array = arrays[core]
        if array is None:
            array = arrays[core] = torch.full((self.numel,), -1, dtype=torch.int64)
        return array

    def _start_tracking(self) -> None:
        """Replay the logged reads into code arrays."""
        self.tracking = True
        for core, epoch, instr, view in self.read_log:
            _mark(self._array(self.reads, core), view, epoch, instr)
        self.read_log = []

    def _find(
        self, arrays: list[torch.Tensor | None], core: int, epoch: int, view: _View, kind: str
    ) -> Conflict | None:
        """First element another core touched (per `arrays`) in this epoch."""
        floor = epoch << 32
        for other, array in enumerate(arrays):
            if other == core or array is None:
                continue
            codes = torch.as_strided(array, *view)
            hit = codes >= floor
            if bool(hit.any()):
                code = int(codes[hit].reshape(-1)[0])
                return other, code & 0xFFFFFFFF, kind
        return None


def _mark(array: torch.Tensor, view: _View, epoch: int, instr: int) -> None:
    """Store this access's code over the view's elements."""
    torch.as_strided(array, *view).fill_((epoch << 32) | instr)
