"""DMA provenance: which caller-input bytes an SBUF tile holds, so deferred GEMMs can read them directly.

Under LNC, both instances DMA the same weight blocks from HBM into their own SBUF tiles, and each would
convert its copies to fp32 for its GEMMs. A dma_copy of equal dtypes from a kernel input that was never
written records on the destination tile which input view it now holds (valid while the tile's write
version is unchanged). Kernel inputs are borrowed: the caller's storage is never written during a launch
(the first write copies it, and write-back waits for the end), so the data behind a recorded view stays
what the DMA read even if the kernel writes the input later. The deferred matmul groups (deferred.py)
map a run of operand tiles onto one view of fp32 data converted once per launch for all instances,
instead of stacking (converting) them per instance:

* consecutive row blocks of one input: a strided view of the input's fp32 copy;
* column tiles side by side in one band of rows (a host layout such as `[I/128, 128, K]`, whose
  partition rows hold the K-tiles of one I-tile next to each other, read one K-tile per matmul): that
  band re-laid in fp32 with its column tiles stacked one above the other, so the run is a 2-D view of it.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from typing import Protocol, cast

import torch

from .memory import Alloc, InputF32, MemoryRegion, ViewKey
from .tensor import NkiTensor

Tiling = tuple[int, int, int]  # (row stride, band height, tile width) of a band re-laid as stacked tiles


class _Pool:
    """fp32 buffers of inputs' copies, reused across launches: converting into fresh memory costs several
    times the conversion itself (page faults; measured 3-10x on a loaded machine)."""

    _KEPT = 1 << 24  # elements kept at most (64 MiB); the oldest go first

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.free: deque[torch.Tensor] = deque()
        self.kept = 0

    def take(self, numel: int) -> torch.Tensor:
        """A flat fp32 buffer of `numel` elements (contents undefined)."""
        with self.lock:
            for i, buffer in enumerate(self.free):
                if buffer.numel() == numel:
                    del self.free[i]  # by position: tensors compare elementwise
                    self.kept -= numel
                    return buffer
        with torch.inference_mode(False):  # kept across launches: a normal tensor, writable in any mode
            return torch.empty(numel)

    def give(self, buffers: list[torch.Tensor]) -> None:
        """Keep the buffers of a dead input's copies (nothing else views them: the GEMMs have run)."""
        with self.lock:
            for buffer in buffers:
                self.free.append(buffer)
                self.kept += buffer.numel()
            while self.kept > self._KEPT:
                self.kept -= self.free.popleft().numel()


_POOL = _Pool()


class InputCopies(InputF32):
    """An input's fp32 copy, plus its row bands re-laid as stacked column tiles (made on first use)."""

    __slots__ = ("__weakref__", "bands", "buffers")

    def __init__(self, storage: torch.Tensor) -> None:
        super().__init__(storage)
        self.bands: dict[tuple[Tiling, int], torch.Tensor] = {}
        self.buffers: list[torch.Tensor] = []  # pooled memory of the copies, returned when this dies
        weakref.finalize(self, _POOL.give, self.buffers)

    def _pooled(self, numel: int) -> torch.Tensor:
        """A buffer for a copy (under self.lock)."""
        buffer = _POOL.take(numel)
        self.buffers.append(buffer)
        return buffer

    def convert(self) -> None:
        """Make the whole input's fp32 copy (InputF32.view then finds it), in pooled memory."""
        with self.lock:
            if self.f32 is None:
                self.f32 = self._pooled(self.storage.numel()).copy_(self.storage)

    def band(self, tiling: Tiling, index: int) -> torch.Tensor:
        """Band `index` (rows [index * height, (index + 1) * height) of the storage as [*, stride]) in
        fp32, laid out [tile, row, column]. The first request lays out every whole band of the input in
        one copy: a kernel reads all of a weight's bands (an I-tile each), and one copy instead of one per
        band spares the GEMM thread a GIL round trip (waiting for the turn holder's Python) per band."""
        with self.lock:  # instances run their GEMMs off their turns, so possibly at the same time
            laid = self.bands.get((tiling, index))
            if laid is None:
                stride, height, width = tiling
                size = height * stride
                count = self.storage.numel() // size  # _tiles admits whole bands only
                tiles = self.storage[: count * size].view(count, height, stride // width, width)
                every = self._pooled(count * size)
                every.view(count, stride // width, height, width).copy_(tiles.permute(0, 2, 1, 3))
                for i in range(count):  # entered complete: made() reads them without the lock
                    self.bands[(tiling, i)] = every[i * size : (i + 1) * size]
                laid = self.bands[(tiling, index)]
        return laid


class Source(Protocol):
    """fp32 data a GEMM operand can be viewed from."""

    def view(self, key: ViewKey) -> torch.Tensor:
        """View `key` of the data (converted on first use, off the turn)."""
        ...

    def made(self, key: ViewKey) -> torch.Tensor | None:
        """View `key` of the data if it is converted already, else None (takes no lock: the turn holder
        must not wait while another instance converts)."""
        ...


class Rows:
    """An input's fp32 copy, viewed by a GEMM (made on first use, in pooled memory)."""

    __slots__ = ("copies",)

    def __init__(self, copies: InputCopies) -> None:
        self.copies = copies

    def view(self, key: ViewKey) -> torch.Tensor:
        """View `key` of the input's fp32 copy."""
        self.copies.convert()
        return self.copies.view(key)

    def made(self, key: ViewKey) -> torch.Tensor | None:
        """View `key` of the input's fp32 copy if it is made, else None."""
        return self.copies.made(key)


class Band:
    """One re-laid band of an input (InputCopies.band), viewed by a GEMM."""

    __slots__ = ("copies", "index", "tiling")

    def __init__(self, copies: InputCopies, tiling: Tiling, index: int) -> None:
        self.copies, self.tiling, self.index = copies, tiling, index

    def view(self, key: ViewKey) -> torch.Tensor:
        """View `key` of the re-laid band."""
        return _within(self.copies.band(self.tiling, self.index), key)

    def made(self, key: ViewKey) -> torch.Tensor | None:
        """View `key` of the band if it is made (entered only once complete), else None."""
        laid = self.copies.bands.get((self.tiling, self.index))
        return None if laid is None else _within(laid, key)


def _within(laid: torch.Tensor, key: ViewKey) -> torch.Tensor:
    """View `key` of a band, its offset counted from the band's start (a band is a slice of the buffer
    holding all bands of its input, and as_strided counts offsets from the buffer's start)."""
    shape, strides, offset = key
    return torch.as_strided(laid, shape, strides, laid.storage_offset() + offset)


Piece = tuple[InputCopies, ViewKey]  # an input's fp32 copies, and a 2-D view of it: [rows, cols], stride 1


def from_input(d: NkiTensor, s: NkiTensor) -> bool:
    """Is `dma_copy(dst=d, src=s)` a copy into SBUF from a caller input of d's dtype, unwritten so far?
    (Its storage is the caller's, which stays unchanged until the launch ends.)"""
    src = s.alloc
    sbuf = d.alloc.region is MemoryRegion.sbuf
    return sbuf and src.borrowed and src.version == 0 and d.alloc.dtype == src.dtype


def record(d: NkiTensor, s: NkiTensor) -> None:
    """After `dma_copy(dst=d, src=s)` of an unwritten caller input (`from_input`): note that d's 2-D block
    holds s's elements (any earlier note on d's allocation is dropped by the write's version)."""
    src = s.alloc
    if (
        len(d.shape) == len(s.shape) == 2
        and d.shape == s.shape
        and d.strides[1] == 1
        and s.strides[1] == 1
    ):
        if src.f32_input is None:  # on the turn: one per input, shared by all instances
            src.f32_input = InputCopies(src.data)
        d.alloc.origin = (d.alloc.version, d.key, src.f32_input, s.key)  # offsets count from data's start


def piece(alloc: Alloc, key: ViewKey) -> Piece | None:
    """The input view that view `key` (2-D, stride 1 along rows) of an SBUF tile holds, if known."""
    origin = alloc.origin
    if origin is None or origin[0] != alloc.version or len(key[0]) != 2 or len(key[1]) != 2:
        return None  # unknown, stale, or a view that is not 2-D (a [P, a, b] tile's whole view)
    _, (dshape, dstrides, doffset), source, (_, sstrides, soffset) = origin
    (rows, cols), (pstride, step), offset = key
    if step != 1 or (rows > 1 and pstride != dstrides[0]) or offset < doffset:
        return None
    row, col = divmod(offset - doffset, dstrides[0]) if dshape[0] > 1 else (0, offset - doffset)
    if row + rows > dshape[0] or col + cols > dshape[1]:
        return None
    copies = cast(InputCopies, source)  # origins are made by record() only
    return copies, ((rows, cols), (sstrides[0], 1), soffset + row * sstrides[0] + col)


def extend(run: list[Piece], nxt: Piece) -> bool:
    """Append `nxt` to a run of pieces if it continues them as the next rows of one strided block, or
    as the next column tile of one band (same step each time; all tiles full height but the last)."""
    if not run:
        run.append(nxt)
        return True
    first, (source, ((rows, cols), strides, offset)) = run[0][1], run[-1]
    (_, ncols), nstrides, noffset = nxt[1]
    if nxt[0] is not source or ncols != cols or nstrides != strides:
        return False
    rows_step = len(run) == 1 or run[1][1][2] == first[2] + first[0][0] * strides[0]
    if rows_step and noffset == offset + rows * strides[0]:
        run.append(nxt)
        return True
    step = noffset - offset if len(run) == 1 else run[1][1][2] - first[2]
    if (
        (len(run) == 1 or not rows_step)
        and noffset - offset == step
        and rows == first[0][0] >= nxt[1][0][0]
        and noffset // strides[0] == first[2] // strides[0]  # in the first tile's band of rows
        and (len(run) > 1 or _tiles(source, first, step))  # checked for this first tile and step already
    ):
        run.append(nxt)
        return True
    return False


def _tiles(source: InputCopies, first: ViewKey, step: int) -> bool:
    """Can runs of tiles `step` apart from `first` on be read from a re-laid band of the input?"""
    (height, cols), (stride, _), offset = first
    row = offset // stride
    return (
        0 < step
        and stride % step == 0
        and offset % step + cols <= step
        and row % height == 0
        and (row + height) * stride <= source.storage.numel()
    )


def block(run: list[Piece]) -> tuple[Source, ViewKey]:
    """The run of pieces as one [rows, cols] view: of the input's fp32 copy, or of a re-laid band."""
    source, ((height, cols), strides, offset) = run[0]
    rows = sum(p[1][0][0] for p in run)
    if len(run) == 1 or run[1][1][2] == offset + height * strides[0]:
        return Rows(source), ((rows, cols), strides, offset)
    step, stride = run[1][1][2] - offset, strides[0]
    row, col = divmod(offset, stride)
    band = Band(source, (stride, height, step), row // height)
    return band, ((rows, cols), (step, 1), (col // step) * height * step + col % step)
