"""Allocations: flat torch storage of the real dtype plus per-element bookkeeping masks."""

from __future__ import annotations

import enum
import functools
import itertools
import math
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from . import dtypes
from .pool import StoragePool, ViewKey, storage_span
from .trace import Operand

if TYPE_CHECKING:
    from .race import RaceTracker


class MemoryRegion(enum.Enum):
    """Where a tensor lives."""

    sbuf = "sbuf"
    psum = "psum"
    private_hbm = "private_hbm"
    shared_hbm = "shared_hbm"

    # Members are singletons compared by identity: hash them by identity too (C-level), not by Enum's
    # Python-level hash of the name; regions key the per-layout caches looked up at every instruction
    __hash__ = object.__hash__


ON_CHIP = (MemoryRegion.sbuf, MemoryRegion.psum)
_LEVEL = {MemoryRegion.private_hbm: 0, MemoryRegion.shared_hbm: 0, MemoryRegion.sbuf: 1, MemoryRegion.psum: 2}
_ids = itertools.count(1)
_VIEW_CACHE = 64  # views cached per allocation before the cache starts over
_LAZY_COPIES = 16  # deferred copies per allocation before they are made (a tile DMA'd into, never read)


class InputF32:
    """The fp32 copy of a caller input's original storage, made once by the first GEMM that needs it
    (provenance.py)."""

    __slots__ = ("f32", "lock", "storage")

    def __init__(self, storage: torch.Tensor) -> None:
        self.storage = storage  # the caller's storage (the input's flat span): unchanged during a launch
        self.lock = threading.Lock()  # instances convert off their turns, so possibly at the same time
        self.f32: torch.Tensor | None = None

    def view(self, key: ViewKey) -> torch.Tensor:
        """View `key` (offsets relative to the storage span) of the fp32 copy."""
        with self.lock:
            if self.f32 is None:
                self.f32 = self.storage.float()
        return torch.as_strided(self.f32, *key)

    def made(self, key: ViewKey) -> torch.Tensor | None:
        """View `key` of the fp32 copy if it is made (set only once complete), else None: takes no lock,
        so the instance holding the turn never waits while another converts."""
        f32 = self.f32
        return None if f32 is None else torch.as_strided(f32, *key)


class Span:
    """Interval-liveness record of an on-chip allocation; outlives the allocation (and its storage)."""

    __slots__ = (
        "bank_base",
        "bytes_per_partition",
        "dtype",
        "first_use",
        "id",
        "last_use",
        "name",
        "region",
        "shape",
        "site",
    )

    def __init__(self, alloc: Alloc) -> None:
        self.id, self.name, self.region = alloc.id, alloc.name, alloc.region
        self.shape, self.dtype, self.site = alloc.shape, alloc.dtype, alloc.site
        self.bytes_per_partition = alloc.bytes_per_partition
        self.first_use: int | None = None
        self.last_use: int | None = None
        self.bank_base: int | None = None

    def label(self) -> str:
        """The allocation's label (see Alloc.label)."""
        return label(self.id, self.name, self.region, self.shape, self.dtype)


class Alloc:
    """One allocation: storage, written mask, PSUM matmul flags and its liveness span."""

    __slots__ = (
        "all_written",
        "base",
        "borrowed",
        "bytes_per_partition",
        "data",
        "dirty",
        "dtype",
        "dtype_name",
        "f32_input",
        "fviews",
        "id",
        "itemsize",
        "known_written",
        "lazy",
        "level",
        "mm",
        "mm_any",
        "mm_full",
        "mm_pending",
        "name",
        "on_chip",
        "operands",
        "origin",
        "pending",
        "pool",
        "pstride",
        "race",
        "readers",
        "region",
        "region_name",
        "shadow",
        "shadow_ok",
        "shape",
        "site",
        "source",
        "span",
        "strides",
        "version",
        "views",
        "written",
        "written_pending",
    )

    def __init__(
        self,
        shape: tuple[int, ...],
        dtype: torch.dtype,
        region: MemoryRegion,
        name: str,
        site: tuple[str, int],
        pool: StoragePool,
        source: torch.Tensor | None = None,
    ) -> None:
        self.pool = pool  # first: __del__ needs it even if construction fails below
        self.id = next(_ids)
        self.shape = shape
        self.dtype = dtype
        self.region = region
        self.name = name
        self.site = site
        # cached for the per-instruction trace path (and per shape, dtype and memory: tiles repeat)
        (numel, self.pstride, self.bytes_per_partition, self.on_chip, self.region_name, self.dtype_name,
         self.itemsize, self.level, strides) = _layout(shape, dtype, region)  # fmt: skip
        self.source = source  # the caller's torch tensor for kernel inputs (written back if mutated)
        # Storage starts uninitialized (possibly a freed allocation's data); elements read before any
        # write are poisoned (NaN / int max) at that moment, which is indistinguishable from filling at
        # allocation but skips a full pass. The written mask only exists once a check needs one.
        if source is None:
            self.data, self.views = pool.take(numel, dtype)
            self.strides = strides
        else:  # HBM as the caller laid it out: its storage from its offset, addressed with its strides
            self.data, self.views = storage_span(source.detach()), {}
            self.strides = tuple(source.stride())
        self.base = self.data.storage_offset()  # as_strided offsets count from the storage's start
        self.borrowed = source is not None  # shares the caller's memory until the first write (copy on write)
        self.written: torch.Tensor | None = None
        # Views marked written but not yet set in the mask: a mask (and its fill) is made only when a
        # check needs one (most partial writes are later read through the same or a covered view)
        self.written_pending: list[ViewKey] = []
        self.all_written = source is not None or numel == 0
        # PSUM only: "holds matmul data" flag per element (nki.md §4), created by the first matmul
        self.mm: torch.Tensor | None = None
        self.mm_any = False
        self.mm_pending: list[ViewKey] = []  # views flagged but not yet set in mm (as written_pending)
        # Mask reductions cost ~40 us, so remember views already known to be fully written / fully
        # matmul-flagged (the same view is typically written, then read or accumulated many times).
        self.known_written: set[ViewKey] = set()
        self.mm_full: set[ViewKey] = set()
        self.shadow: torch.Tensor | None = None  # fp32 copy of low-precision data, refreshed after writes
        self.shadow_ok = False
        # self.views / fviews: torch views of data / shadow by ViewKey (as_strided costs microseconds and
        # kernels reuse a handful of views a lot); they travel with the storage through the pool
        self.fviews: dict[ViewKey, torch.Tensor] = {}
        self.race: RaceTracker | None = None
        self.dirty = False
        self.pending = False  # PSUM tile with deferred matmuls (deferred.py): flushed before any other use
        self.readers = 0  # deferred matmuls that read this tile when they run: flushed before it is written
        self.operands: dict[tuple[str, tuple[int, ...]], Operand] = {}  # trace operand tuples, shared
        self.version = 0  # write count: tells deferred.py whether stacked operand copies are current
        self.span = Span(self) if self.on_chip else None
        # DMA provenance (provenance.py): the input view an SBUF tile holds, and an input's fp32 copy
        self.origin: tuple[int, ViewKey, InputF32, ViewKey] | None = None
        self.f32_input: InputF32 | None = None
        # Copies of unwritten caller inputs a DMA put here (view, source), made when the storage is next
        # viewed: GEMMs read such tiles from the input's fp32 copy (provenance.py), so most never are
        self.lazy: list[tuple[ViewKey, torch.Tensor]] = []

    def __del__(self) -> None:
        """The kernel dropped its last view: recycle the storage this allocation owns."""
        if hasattr(self, "mm"):  # fully constructed
            self.pool.give(
                None if self.borrowed else (self.data, self.views),
                None if self.shadow is None else (self.shadow, self.fviews),
                None if self.written is None else (self.written, {}),
                None if self.mm is None else (self.mm, {}),
            )

    def hand_over(self) -> torch.Tensor:
        """The storage as a tensor of the allocation's shape that now belongs to the caller (not pooled)."""
        self.borrowed = True  # like a caller's input: not recycled, copied before any further write
        # a tensor of its own over the storage, as a device returns one, not a view of the flat buffer:
        # autograd refuses in-place writes to a view a custom op returns (`h = op(...); h += x`)
        mine = torch.empty(0, dtype=self.data.dtype, device=self.data.device)
        return mine.set_(self.data.untyped_storage(), self.data.storage_offset(), self.shape,
                         contiguous_strides(self.shape))  # fmt: skip

    @property
    def numel(self) -> int:
        """Element count."""
        return self.data.numel()

    def make_private(self) -> None:
        """Copy a borrowed input before its first write, so the caller's tensor changes only by write-back."""
        if self.borrowed:
            self.data = self.data.clone()
            self.base = 0
            self.views = {}
            self.borrowed = False

    def defer_copy(self, key: ViewKey, source: torch.Tensor) -> None:
        """Copy `source` (an unwritten caller input's view, unchanged until the launch ends) into view `key`
        when the storage is next viewed."""
        if len(self.lazy) >= _LAZY_COPIES:
            self.fill()
        self.lazy.append((key, source))

    def fill(self) -> None:
        """Make the deferred copies, in order."""
        lazy, self.lazy = self.lazy, []
        for key, source in lazy:
            target = self._view(key)
            target.copy_(source if source.shape == target.shape else source.reshape(target.shape))

    def view(self, key: ViewKey) -> torch.Tensor:
        """The storage viewed as (shape, strides, offset), cached."""
        if self.lazy:
            self.fill()
        return self._view(key)

    def _view(self, key: ViewKey) -> torch.Tensor:
        """view() without the deferred copies."""
        v = self.views.get(key)
        if v is None:
            if len(self.views) >= _VIEW_CACHE:
                self.views = {}
            shape, strides, offset = key
            v = self.views[key] = torch.as_strided(self.data, shape, strides, self.base + offset)
        return v

    def f32_view(self, key: ViewKey) -> torch.Tensor:
        """Like view(), on the fp32 version of the storage (see as_float32)."""
        if self.dtype == torch.float32:
            return self.view(key)
        shadow = self.as_float32()
        v = self.fviews.get(key)
        if v is None:
            if len(self.fviews) >= _VIEW_CACHE:
                self.fviews = {}
            v = self.fviews[key] = torch.as_strided(shadow, *key)
        return v

    def has_writes(self) -> bool:
        """True when some view was marked written (the written mask, possibly still to be made, is not all
        False)."""
        return self.written is not None or bool(self.written_pending)

    def written_mask(self) -> torch.Tensor:
        """Per-element written flags, with every view marked written so far set."""
        if self.written is None:
            self.written = self.pool.take(self.numel, torch.bool)[0].zero_()
        if self.written_pending:
            _apply(self.written, self.written_pending, True)
        return self.written

    def matmul_flags(self) -> torch.Tensor:
        """Per-element 'holds matmul data' flags of a PSUM tile, with every view flagged so far set."""
        if self.mm is None:
            self.mm = self.pool.take(self.numel, torch.bool)[0].zero_()
        if self.mm_pending:
            _apply(self.mm, self.mm_pending, True)
        return self.mm

    def poison_unwritten(self, key: ViewKey) -> None:
        """Give the view's never-written elements the documented fill value (NaN for floats)."""
        index = torch.as_strided(torch.arange(self.numel), *key).reshape(-1)  # views may overlap (stride 0)
        if self.has_writes():
            index = index[~self.written_mask()[index]]
        if self.lazy:
            self.fill()
        self.data[index] = dtypes.fill_value(self.dtype)
        self.shadow_ok = False
        self.version += 1

    def as_float32(self) -> torch.Tensor:
        """Storage as fp32; non-fp32 storage is converted once and cached until the next write."""
        if self.dtype == torch.float32:
            return self.data
        if self.shadow is None:
            self.shadow, self.fviews = self.pool.take(self.numel, torch.float32)
        if self.lazy:
            self.fill()
        if not self.shadow_ok:
            self.shadow.copy_(self.data)
            self.shadow_ok = True
        return self.shadow

    def label(self) -> str:
        """Short human-readable identity for messages."""
        return label(self.id, self.name, self.region, self.shape, self.dtype)


def _apply(mask: torch.Tensor, pending: list[ViewKey], value: bool) -> None:
    """Set the views `pending` of a flat mask to `value`, and forget them."""
    for shape, strides, offset in pending:
        torch.as_strided(mask, shape, strides, offset).fill_(value)
    pending.clear()


@functools.lru_cache(maxsize=1024)
def _layout(
    shape: tuple[int, ...], dtype: torch.dtype, region: MemoryRegion
) -> tuple[int, int, int, bool, str, str, int, int, tuple[int, ...]]:
    """An allocation's derived constants: element count, partition row length, bytes per partition,
    on chip, memory and dtype names, item size, index of its read counter in Instr.bytes, strides."""
    pstride = math.prod(shape[1:]) if shape else 1
    name = str(dtype).removeprefix("torch.")
    level = 2 * _LEVEL[region]
    return (math.prod(shape), pstride, pstride * dtype.itemsize, region in ON_CHIP, region.value, name,
            dtype.itemsize, level, contiguous_strides(shape))  # fmt: skip


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major element strides for a shape."""
    if type(shape) is tuple:
        return _contiguous(shape)
    return _contiguous(tuple(shape))


def is_contiguous(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether a view addresses its elements in row-major order without gaps; as in torch, the stride of
    an axis of one element does not matter (a one-row slice of a wider matrix is contiguous)."""
    rowmajor = contiguous_strides(shape)
    return all(n == 1 or s == c for n, s, c in zip(shape, strides, rowmajor, strict=True))


@functools.lru_cache(maxsize=1024)
def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Uncached contiguous_strides."""
    strides = []
    step = 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def label(ident: int, name: str, region: MemoryRegion, shape: tuple[int, ...], dtype: torch.dtype) -> str:
    """'#id 'name' region [AxB] dtype': an allocation in messages."""
    quoted = f" '{name}'" if name else ""
    dims = "x".join(map(str, shape))
    return f"#{ident}{quoted} {region.value} [{dims}] {str(dtype).removeprefix('torch.')}"
