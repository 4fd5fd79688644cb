"""NkiTensor: a strided view (shape, element strides, offset) onto one allocation's storage."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

import torch

from . import dtypes
from .errors import InvalidArgumentError, OutOfBoundsError, PartitionError, UnsupportedError, fault
from .memory import Alloc, MemoryRegion, ViewKey, contiguous_strides, is_contiguous


class NkiTensor:
    """A view of an allocation; views share storage, so writes through any view are seen by all."""

    __slots__ = ("alloc", "free_size", "key", "numel", "offset", "partitions", "shape", "strides")

    def __init__(self, alloc: Alloc, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> None:
        self.alloc = alloc
        self.shape = shape
        self.strides = strides
        self.offset = offset
        self.key = (shape, strides, offset)  # identifies the addressed elements (cache key)
        self.partitions = shape[0] if shape else 1  # size of dim 0 (the partition dim on chip)
        self.free_size = shape[1] if len(shape) == 2 else math.prod(shape[1:])  # elements per partition
        self.numel = self.free_size * self.partitions

    @classmethod
    def whole(cls, alloc: Alloc) -> NkiTensor:
        """A view covering the full allocation (a caller's tensor with its own strides)."""
        return cls(alloc, alloc.shape, alloc.strides, 0)

    # ---- metadata -------------------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        """Element dtype (a torch dtype)."""
        return self.alloc.dtype

    @property
    def buffer(self) -> MemoryRegion:
        """Memory region of the underlying allocation."""
        return self.alloc.region

    @property
    def name(self) -> str:
        """Allocation name."""
        return self.alloc.name

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    def __repr__(self) -> str:
        return f"NkiTensor(shape={self.shape}, alloc={self.alloc.label()})"

    def materialize(self, base: torch.Tensor | None = None) -> torch.Tensor:
        """A torch view of the storage (or of a same-sized mask) with this view's layout."""
        if base is None:
            return self.alloc.view(self.key)
        return torch.as_strided(base, self.shape, self.strides, self.offset)

    def matrix(self) -> torch.Tensor:
        """The storage viewed as [partitions, elements per partition] (a copy if not viewable)."""
        view = self.materialize()
        return view if view.dim() == 2 else view.reshape(self.partitions, self.free_size)

    def within(self, key: ViewKey) -> bool:
        """True when view `key` of the same allocation holds every element of this one.

        Only for 2-D row-major blocks with equal strides (other views answer False).
        """
        shape, strides, offset = key
        rows = strides[0]
        if len(shape) != 2 or strides != self.strides or strides[1] != 1 or rows <= 0 or len(self.shape) != 2:
            return False
        (r0, c0), (r, c) = divmod(offset, rows), divmod(self.offset, rows)
        return (
            c0 + shape[1] <= rows
            and c + self.shape[1] <= rows
            and r0 <= r
            and r + self.shape[0] <= r0 + shape[0]
            and c0 <= c
            and c + self.shape[1] <= c0 + shape[1]
        )

    def free_byte_range(self) -> tuple[int, int]:
        """First and last byte touched within a partition row (on-chip views)."""
        start = self.offset % self.alloc.pstride
        if len(self.shape) == 2:  # the common case, without the generic sum
            span = (self.shape[1] - 1) * self.strides[1] if self.shape[1] > 0 else 0
        else:
            span = sum((n - 1) * s for n, s in zip(self.shape[1:], self.strides[1:], strict=True) if n > 0)
        size = self.alloc.dtype.itemsize
        return start * size, (start + span) * size + size - 1

    # ---- indexing --------------------------------------------------------------------------------
    def __getitem__(self, key: Any) -> NkiTensor:
        """Index with ints and slices; dim 0 of on-chip tensors keeps size 1 under an int."""
        if type(key) is tuple and len(key) == 2 and len(self.shape) == 2:  # tiles: most indexing, kept cheap
            k0, k1 = key
            if type(k0) is slice and type(k1) is slice and k0.step is None and k1.step is None:
                a, b, c, d = k0.start, k0.stop, k1.start, k1.stop
                n0, n1 = self.shape
                if (
                    type(a) is int and type(b) is int and type(c) is int and type(d) is int
                    and 0 <= a <= b <= n0 and 0 <= c <= d <= n1
                ):  # fmt: skip
                    s0, s1 = self.strides
                    return NkiTensor(self.alloc, (b - a, d - c), self.strides, self.offset + a * s0 + c * s1)
        keys = key if isinstance(key, tuple) else (key,)
        if len(keys) == len(self.shape):
            view = _plain_slices(self, keys)  # the common case, kept cheap
            if view is not None:
                return view
        if any(k is Ellipsis for k in keys):
            at = keys.index(Ellipsis)
            fill = (slice(None),) * (len(self.shape) - len(keys) + 1)
            keys = keys[:at] + fill + keys[at + 1 :]
        if len(keys) > len(self.shape):
            raise fault(OutOfBoundsError, "index", f"{len(keys)} indices for a {len(self.shape)}-D tensor")
        shape: list[int] = []
        strides: list[int] = []
        offset = self.offset
        for dim, (n, s) in enumerate(zip(self.shape, self.strides, strict=True)):
            k = keys[dim] if dim < len(keys) else slice(None)
            if isinstance(k, slice):
                start, count, step = _slice_bounds(k, n, dim)
                offset += start * s
                shape.append(count)
                strides.append(s * step)
            elif hasattr(k, "__index__"):  # ints, numpy ints
                k = operator.index(k)
                if not -n <= k < n:
                    raise fault(
                        OutOfBoundsError, "index", f"index {k} out of range for dim {dim} of size {n}"
                    )
                offset += (k % n) * s
                if dim == 0 and self.alloc.on_chip:  # the partition dim is kept (size 1)
                    shape.append(1)
                    strides.append(s)
            else:
                raise fault(UnsupportedError, "index", f"unsupported index {k!r} (use ints and slices)")
        view = NkiTensor(self.alloc, tuple(shape), tuple(strides), offset)
        if self.alloc.on_chip:  # a step over partitions (`t[0:128:2]`): the hardware has no partition stride
            view._check_partition_layout("index")
        return view

    def __setitem__(self, key: Any, value: Any) -> None:
        """Item assignment is not NKI; writes go through nisa instructions."""
        raise fault(UnsupportedError, "setitem", "assign through nisa instructions (e.g. nisa.tensor_copy)")

    def ap(
        self,
        pattern: list[list[int]],
        offset: int | None = None,
        scalar_offset: Any = None,
        vector_offset: Any = None,
        indirect_dim: int = 0,
        dtype: Any = None,
    ) -> NkiTensor:
        """Address the underlying storage with explicit [[stride, count], ...] pairs."""
        if scalar_offset is not None or vector_offset is not None:
            raise fault(UnsupportedError, "ap", "indirect access (scalar/vector_offset) is not modelled")
        if dtype is not None and dtypes.to_torch(dtype) != self.dtype:
            raise fault(UnsupportedError, "ap", "dtype reinterpretation is not modelled")
        if not pattern or any(len(pair) != 2 for pair in pattern):
            raise fault(InvalidArgumentError, "ap", f"pattern must be [[stride, count], ...], got {pattern}")
        strides = tuple(int(p[0]) for p in pattern)
        shape = tuple(int(p[1]) for p in pattern)
        view = NkiTensor(self.alloc, shape, strides, self.offset + (offset or 0))
        view.check_extent("ap")
        return view

    def reshape(self, shape: Sequence[int]) -> NkiTensor:
        """Reinterpret a contiguous view with a new shape (same element count)."""
        shape = tuple(int(n) for n in shape)
        if math.prod(shape) != self.numel:
            raise fault(OutOfBoundsError, "reshape", f"cannot reshape {self.shape} to {shape}")
        if not is_contiguous(self.shape, self.strides) and self.numel > 1:
            raise fault(UnsupportedError, "reshape", f"view {self.shape} is not contiguous")
        if self.alloc.on_chip and shape and shape[0] > self.alloc.shape[0]:
            raise fault(PartitionError, "reshape", f"{shape} has more partitions than {self.alloc.label()}")
        view = NkiTensor(self.alloc, shape, contiguous_strides(shape), self.offset)
        if self.alloc.on_chip:  # partitions are separate memories: a reshape cannot merge or split them
            view._check_partition_layout("reshape")
        return view

    def check_extent(self, op: str) -> None:
        """Raise OutOfBoundsError unless every addressed element lies inside the allocation."""
        if any(n < 0 for n in self.shape) or any(s < 0 for s in self.strides):
            raise fault(UnsupportedError, op, f"negative counts/strides are not modelled: {self.strides}")
        if 0 in self.shape:
            return
        last = self.offset + sum((n - 1) * s for n, s in zip(self.shape, self.strides, strict=True))
        if self.offset < 0 or last >= self.alloc.numel:
            raise fault(
                OutOfBoundsError,
                op,
                f"elements {self.offset}..{last} outside {self.alloc.label()} ({self.alloc.numel} elements)",
            )
        if self.alloc.on_chip:
            self._check_partition_layout(op)

    def _check_partition_layout(self, op: str) -> None:
        """On-chip patterns: dim 0 steps whole partitions and free dims stay inside one partition row."""
        pstride = self.alloc.pstride
        if self.shape[0] > 1 and self.strides[0] != pstride:
            raise fault(
                OutOfBoundsError,
                op,
                f"partition stride {self.strides[0]} must equal the "
                f"per-partition element count {pstride} of {self.alloc.label()}",
            )
        _, hi = self.free_byte_range()
        if hi >= pstride * self.alloc.dtype.itemsize:
            raise fault(
                OutOfBoundsError,
                op,
                f"free-dim access reaches byte {hi} of a "
                f"{pstride * self.alloc.dtype.itemsize}-byte partition row of {self.alloc.label()}",
            )


def _plain_slices(t: NkiTensor, keys: tuple[Any, ...]) -> NkiTensor | None:
    """Fast path of __getitem__ for in-range unit-step int-bounded slices of every dim; None otherwise."""
    shape = []
    offset = t.offset
    for k, n, s in zip(keys, t.shape, t.strides, strict=True):
        if type(k) is not slice or k.step is not None:
            return None
        start, stop = k.start, k.stop
        if type(start) is not int or type(stop) is not int or not 0 <= start <= stop <= n:
            return None
        offset += start * s
        shape.append(stop - start)
    return NkiTensor(t.alloc, tuple(shape), t.strides, offset)


def _slice_bounds(k: slice, n: int, dim: int) -> tuple[int, int, int]:
    """Start, count and step of a slice; an out-of-range bound is an error, never a silent clamp."""
    try:
        step = 1 if k.step is None else operator.index(k.step)
        start = 0 if k.start is None else operator.index(k.start)
        stop = n if k.stop is None else operator.index(k.stop)
    except TypeError:
        raise fault(UnsupportedError, "index", f"slice {k} must use integer bounds") from None
    if step <= 0:
        raise fault(UnsupportedError, "index", f"slice step {step} (only positive steps are modelled)")
    start = start + n if start < 0 else start
    stop = stop + n if stop < 0 else stop
    if not 0 <= start <= n or not 0 <= stop <= n:
        raise fault(
            OutOfBoundsError, "index", f"slice {k.start}:{k.stop} out of range for dim {dim} of size {n}"
        )
    count = max(0, (stop - start + step - 1) // step)
    return start, count, step
