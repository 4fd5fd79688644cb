"""Allocations: flat torch storage of the real dtype plus per-element bookkeeping masks."""

from __future__ import annotations

import enum
import itertools
import math
from typing import TYPE_CHECKING

import torch

from . import dtypes

if TYPE_CHECKING:
    from .race import RaceTracker


class MemoryRegion(enum.Enum):
    """Where a tensor lives."""

    sbuf = "sbuf"
    psum = "psum"
    private_hbm = "private_hbm"
    shared_hbm = "shared_hbm"


ON_CHIP = (MemoryRegion.sbuf, MemoryRegion.psum)
ViewKey = tuple[tuple[int, ...], tuple[int, ...], int]  # (shape, strides, offset)
_ids = itertools.count(1)


class Alloc:
    """One allocation: storage, written mask, PSUM matmul flags and interval-liveness bounds."""

    __slots__ = (
        "all_written", "bank_base", "bytes_per_partition", "data", "dirty", "dtype", "first_use", "id",
        "known_written", "last_use", "mm", "mm_any", "mm_full", "name", "on_chip", "pstride", "race",
        "region", "shadow", "shape", "site", "source", "written",
    )

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, region: MemoryRegion, name: str,
                 site: tuple[str, int], source: torch.Tensor | None = None) -> None:
        self.id = next(_ids)
        self.shape = shape
        self.dtype = dtype
        self.region = region
        self.name = name
        self.site = site
        self.on_chip = region in ON_CHIP
        numel = math.prod(shape)
        self.pstride = math.prod(shape[1:]) if shape else 1
        self.bytes_per_partition = self.pstride * dtype.itemsize
        self.source = source  # the caller's torch tensor for kernel inputs (written back if mutated)
        if source is not None:
            self.data = source.detach().reshape(-1).clone()
            self.written = torch.ones(0, dtype=torch.bool)
            self.all_written = True
        else:
            self.data = torch.full((numel,), dtypes.fill_value(dtype), dtype=dtype)
            self.written = torch.zeros(numel, dtype=torch.bool)
            self.all_written = numel == 0
        # PSUM only: "holds matmul data" flag per element (nki.md §4)
        self.mm = torch.zeros(numel, dtype=torch.bool) if region is MemoryRegion.psum else None
        # Mask reductions cost ~40 us, so remember views already known to be fully written / fully
        # matmul-flagged (the same view is typically written, then read or accumulated many times).
        self.known_written: set[ViewKey] = set()
        self.mm_any = False
        self.mm_full: set[ViewKey] = set()
        self.shadow: torch.Tensor | None = None  # fp32 copy of low-precision data, dropped on write
        self.first_use: int | None = None
        self.last_use: int | None = None
        self.bank_base: int | None = None
        self.race: RaceTracker | None = None
        self.dirty = False

    @property
    def numel(self) -> int:
        """Element count."""
        return self.data.numel()

    def as_float32(self) -> torch.Tensor:
        """Storage as fp32; non-fp32 storage is converted once and cached until the next write."""
        if self.dtype == torch.float32:
            return self.data
        if self.shadow is None:
            self.shadow = self.data.float()
        return self.shadow

    def label(self) -> str:
        """Short human-readable identity for messages."""
        name = f" '{self.name}'" if self.name else ""
        dims = "x".join(map(str, self.shape))
        return f"#{self.id}{name} {self.region.value} [{dims}] {str(self.dtype).removeprefix('torch.')}"
