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
_LEVEL = {MemoryRegion.private_hbm: 0, MemoryRegion.shared_hbm: 0, MemoryRegion.sbuf: 1, MemoryRegion.psum: 2}
ViewKey = tuple[tuple[int, ...], tuple[int, ...], int]  # (shape, strides, offset)
_ids = itertools.count(1)


class Alloc:
    """One allocation: storage, written mask, PSUM matmul flags and interval-liveness bounds."""

    __slots__ = (
        "all_written",
        "bank_base",
        "borrowed",
        "bytes_per_partition",
        "data",
        "dirty",
        "dtype",
        "dtype_name",
        "first_use",
        "id",
        "itemsize",
        "known_written",
        "last_use",
        "level",
        "mm",
        "mm_any",
        "mm_full",
        "name",
        "on_chip",
        "pstride",
        "race",
        "region",
        "region_name",
        "shadow",
        "shape",
        "site",
        "source",
        "written",
    )

    def __init__(
        self,
        shape: tuple[int, ...],
        dtype: torch.dtype,
        region: MemoryRegion,
        name: str,
        site: tuple[str, int],
        source: torch.Tensor | None = None,
    ) -> None:
        self.id = next(_ids)
        self.shape = shape
        self.dtype = dtype
        self.region = region
        self.name = name
        self.site = site
        self.on_chip = region in ON_CHIP
        # cached for the per-instruction trace path
        self.region_name = region.value
        self.dtype_name = str(dtype).removeprefix("torch.")
        self.itemsize = dtype.itemsize
        self.level = 2 * _LEVEL[region]  # index of this memory's read counter in Instr.bytes
        numel = math.prod(shape)
        self.pstride = math.prod(shape[1:]) if shape else 1
        self.bytes_per_partition = self.pstride * dtype.itemsize
        self.source = source  # the caller's torch tensor for kernel inputs (written back if mutated)
        # Storage starts uninitialized; elements read before any write are poisoned (NaN / int max) at
        # that moment, which is indistinguishable from filling at allocation but skips a full pass.
        # The written mask only exists once a partial write happens.
        self.data = torch.empty(numel, dtype=dtype) if source is None else source.detach().reshape(-1)
        self.borrowed = source is not None  # shares the caller's memory until the first write (copy on write)
        self.written: torch.Tensor | None = None
        self.all_written = source is not None or numel == 0
        # PSUM only: "holds matmul data" flag per element (nki.md §4), created by the first matmul
        self.mm: torch.Tensor | None = None
        self.mm_any = False
        # Mask reductions cost ~40 us, so remember views already known to be fully written / fully
        # matmul-flagged (the same view is typically written, then read or accumulated many times).
        self.known_written: set[ViewKey] = set()
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

    def make_private(self) -> None:
        """Copy a borrowed input before its first write, so the caller's tensor changes only by write-back."""
        if self.borrowed:
            self.data = self.data.clone()
            self.borrowed = False

    def written_mask(self) -> torch.Tensor:
        """Per-element written flags (created on first partial write)."""
        if self.written is None:
            self.written = torch.zeros(self.numel, dtype=torch.bool)
        return self.written

    def matmul_flags(self) -> torch.Tensor:
        """Per-element 'holds matmul data' flags of a PSUM tile."""
        if self.mm is None:
            self.mm = torch.zeros(self.numel, dtype=torch.bool)
        return self.mm

    def poison_unwritten(self) -> None:
        """Give never-written elements the documented fill value (NaN for floats)."""
        value = dtypes.fill_value(self.dtype)
        if self.written is None:
            self.data.fill_(value)
        else:
            self.data[~self.written] = value
        self.shadow = None

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
