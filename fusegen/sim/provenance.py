"""DMA provenance: which caller-input bytes an SBUF tile holds, so deferred GEMMs can read them directly.

Under LNC, both instances DMA the same weight blocks from HBM into their own SBUF tiles, and each would
convert its copies to fp32 for its GEMMs. A dma_copy of equal dtypes from a kernel input that was never
written records on the destination tile which input view it now holds (valid while the tile's write
version is unchanged). Kernel inputs are borrowed: the caller's storage is never written during a launch
(the first write copies it, and write-back waits for the end), so the data behind a recorded view stays
what the DMA read even if the kernel writes the input later. The deferred matmul groups (deferred.py)
map a run of operand tiles whose views are consecutive row blocks of one input onto a single strided
view of that input's fp32 copy, converted once per launch for all instances, instead of stacking them.
"""

from __future__ import annotations

from .memory import Alloc, InputF32, MemoryRegion, ViewKey
from .tensor import NkiTensor

Piece = tuple[InputF32, ViewKey]  # an input's fp32 copy, and a 2-D view of it: [rows, cols], stride 1


def record(d: NkiTensor, s: NkiTensor) -> None:
    """After `dma_copy(dst=d, src=s)`: note that d's 2-D block holds s's elements, if s is an unwritten
    caller input of d's dtype (any earlier note on d's allocation is dropped by the write's version)."""
    src = s.alloc
    if (
        d.alloc.region is MemoryRegion.sbuf
        and src.borrowed
        and src.version == 0
        and d.alloc.dtype == src.dtype
        and len(d.shape) == len(s.shape) == 2
        and d.shape == s.shape
        and d.strides[1] == 1
        and s.strides[1] == 1
    ):
        if src.f32_input is None:  # on the turn: one per input, shared by all instances
            src.f32_input = InputF32(src.data)
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
    return source, ((rows, cols), (sstrides[0], 1), soffset + row * sstrides[0] + col)


def extend(run: list[Piece], nxt: Piece) -> bool:
    """Append `nxt` to a run of pieces if it continues them as the next rows of one strided block."""
    if not run:
        run.append(nxt)
        return True
    source, ((rows, cols), strides, offset) = run[-1]
    (_, ncols), nstrides, noffset = nxt[1]
    if nxt[0] is source and ncols == cols and nstrides == strides and noffset == offset + rows * strides[0]:
        run.append(nxt)
        return True
    return False


def block(run: list[Piece]) -> Piece:
    """The run of pieces as one [rows, cols] view."""
    source, ((_, cols), strides, offset) = run[0]
    rows = sum(p[1][0][0] for p in run)
    return source, ((rows, cols), strides, offset)
