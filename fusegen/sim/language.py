"""`nki.language` (nl): dtypes, buffers, op constants, allocation, program ids, loop ranges."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from . import isa_move
from .conformance import violation_here
from .context import active_target, current
from .dtypes import (  # noqa: F401 -- re-exported as nl.<dtype>
    bfloat16,
    bool_,
    float8_e4m3,
    float8_e4m3fn,
    float8_e5m2,
    float16,
    float32,
    int8,
    int16,
    int32,
    tfloat32,
    to_torch,
    uint8,
    uint16,
    uint32,
)
from .errors import CapacityError, InvalidArgumentError, PartitionError, fault, unmodelled_names, user_site
from .instr import Instr
from .memory import Alloc, MemoryRegion
from .ops import OPS
from .tensor import NkiTensor

globals().update(OPS)  # nl.add, nl.exp, ... as op constants

sbuf = MemoryRegion.sbuf
psum = MemoryRegion.psum
private_hbm = MemoryRegion.private_hbm
hbm = MemoryRegion.private_hbm
shared_hbm = MemoryRegion.shared_hbm


class _TileSize:
    """Hardware tile-size constants of the active target."""

    pmax = 128
    psum_fmax = 2048  # deprecated name kept for old kernels
    psum_bank_fmax = 512
    psum_bank_fmax_bytes = 2048
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = 512
    psum_min_align = 4
    sbuf_min_align = 4

    @property
    def psum_num_banks(self) -> int:
        """Usable PSUM banks per partition."""
        return active_target().psum_banks

    @property
    def sbuf_size_bytes(self) -> int:
        """Total SBUF capacity (all partitions)."""
        tgt = active_target()
        return tgt.partitions * tgt.sbuf_bytes_per_partition

    @property
    def sbuf_fmax_bytes(self) -> int:
        """Usable SBUF bytes per partition."""
        return active_target().sbuf_usable_bytes

    @property
    def sbuf_fmax(self) -> int:
        """Usable SBUF fp32 elements per partition."""
        return active_target().sbuf_usable_bytes // 4

    @property
    def total_available_sbuf_size(self) -> int:
        """Deprecated alias of sbuf_fmax_bytes."""
        return self.sbuf_fmax_bytes


tile_size = _TileSize()


def _region(buffer: object) -> MemoryRegion:
    """Accept a MemoryRegion or (NKI 0.2.0, rules.py buffer-objects) its name."""
    if isinstance(buffer, MemoryRegion):
        return buffer
    if isinstance(buffer, str) and buffer in ("sbuf", "psum", "hbm", "private_hbm", "shared_hbm"):
        return MemoryRegion.private_hbm if buffer == "hbm" else MemoryRegion(buffer)
    raise fault(InvalidArgumentError, "ndarray", f"buffer={buffer!r} is not nl.sbuf/psum/hbm/shared_hbm")


def _check_on_chip(shape: tuple[int, ...], dtype: torch.dtype, region: MemoryRegion, address: Any) -> None:
    """Partition count and per-partition size of a new SBUF/PSUM tile."""
    tgt = active_target()
    if not shape or shape[0] > tgt.partitions:
        raise fault(
            PartitionError,
            "ndarray",
            f"{region.value} tile {shape}: partition dim must be 1..{tgt.partitions}",
        )
    per_partition = math.prod(shape[1:]) * dtype.itemsize
    limit = tgt.sbuf_usable_bytes if region is MemoryRegion.sbuf else tgt.psum_bytes_per_partition
    if per_partition > limit:
        raise fault(
            CapacityError,
            "ndarray",
            f"{region.value} tile {shape} needs {per_partition} bytes per partition; {tgt.name} has {limit}",
        )
    if region is MemoryRegion.psum and address is not None and address[1] % tgt.psum_bank_bytes:
        raise fault(
            InvalidArgumentError,
            "ndarray",
            f"PSUM address {address} must start on a {tgt.psum_bank_bytes}-byte bank boundary",
        )


def ndarray(
    shape: Sequence[int], dtype: Any, buffer: Any = sbuf, name: str = "", address: Any = None
) -> NkiTensor:
    """Allocate uninitialized storage (NaN / int sentinel filled)."""
    ctx = current()
    if isinstance(buffer, str):  # before the cache: a request that passed in warn mode is cached
        violation_here("buffer-objects", "ndarray", f"buffer={buffer!r}", ctx.rules_error)
    key: tuple[object, ...] | None = (shape, dtype, buffer, ctx.target) if address is None else None
    try:
        checked = None if key is None else _CHECKED.get(key)
    except TypeError:  # unhashable parts (a list shape): checked, and converted or rejected, below
        key = checked = None
    if checked is None:
        checked = _checked_request(shape, dtype, buffer, address)
        if key is not None:
            if len(_CHECKED) > 4096:  # kernels allocate a few dozen distinct tiles: never grows unbounded
                _CHECKED.clear()
            _CHECKED[key] = checked
    dims, dt, region = checked
    site = user_site()
    if region is MemoryRegion.shared_hbm:
        return NkiTensor.whole(ctx.launch.shared_alloc(ctx, dims, dt, name, site))
    alloc = Alloc(dims, dt, region, name, site, ctx.launch.pool)
    if alloc.span is not None:
        ctx.spans.append(alloc.span)
    return NkiTensor.whole(alloc)


#: ndarray requests (shape, dtype, buffer, target) whose checks passed, and what they resolve to: the
#: checks read nothing else, so an equal request passes again (no address: those are checked every time)
_CHECKED: dict[tuple[object, ...], tuple[tuple[int, ...], torch.dtype, MemoryRegion]] = {}


def _checked_request(
    shape: object, dtype: Any, buffer: Any, address: Any
) -> tuple[tuple[int, ...], torch.dtype, MemoryRegion]:
    """Validate an ndarray request (shape, dtype, memory; an on-chip tile's partitions, size and PSUM
    address on the active target); returns the shape as ints, the torch dtype and the memory."""
    if not isinstance(shape, (tuple, list)):
        raise fault(InvalidArgumentError, "ndarray", f"shape must be a tuple of ints, got {shape!r}")
    dims = tuple(int(n) for n in shape)
    dt = to_torch(dtype)
    region = _region(buffer)
    if region in (MemoryRegion.sbuf, MemoryRegion.psum):
        _check_on_chip(dims, dt, region, address)
    return dims, dt, region


def full(
    shape: Sequence[int], fill_value: float, dtype: Any, buffer: Any = sbuf, name: str = ""
) -> NkiTensor:
    """Allocate and fill with a constant (a memset instruction on chip)."""
    t = ndarray(shape, dtype, buffer, name)
    if t.alloc.on_chip:
        isa_move.memset(t, fill_value)
    else:
        ins = Instr("hbm_fill", "dma")
        ins.write(t, torch.full(t.shape, float(fill_value)))
        ins.finish(1, t.numel)
    return t


def zeros(shape: Sequence[int], dtype: Any, buffer: Any = sbuf, name: str = "") -> NkiTensor:
    """Allocate zero-filled storage."""
    return full(shape, 0, dtype, buffer, name)


def ones(shape: Sequence[int], dtype: Any, buffer: Any = sbuf, name: str = "") -> NkiTensor:
    """Allocate one-filled storage."""
    return full(shape, 1, dtype, buffer, name)


def zeros_like(x: NkiTensor, dtype: Any = None, buffer: Any = None, name: str = "") -> NkiTensor:
    """Zeros with x's shape (and dtype/buffer unless given)."""
    return zeros(x.shape, dtype or x.dtype, buffer or x.buffer, name)


def empty_like(x: NkiTensor, dtype: Any = None, buffer: Any = None, name: str = "") -> NkiTensor:
    """Uninitialized storage with x's shape (and dtype/buffer unless given)."""
    return ndarray(x.shape, dtype or x.dtype, buffer or x.buffer, name)


def program_id(axis: int = 0) -> int:
    """Index of the running program instance (the core under LNC)."""
    if axis != 0:
        raise fault(InvalidArgumentError, "program_id", "only a 1-D launch grid is modelled")
    return current().core


def num_programs(axes: int = 0) -> int:
    """Number of program instances in the launch."""
    return current().launch.grid


def program_ndim() -> int:
    """Launch grid rank (always 1 here)."""
    return 1


def affine_range(start: int, stop: int | None = None, step: int = 1) -> Iterable[int]:
    """Deprecated alias of range (loops are unrolled at trace time)."""
    return range(start, stop, step) if stop is not None else range(start)


sequential_range = affine_range
static_range = affine_range


def ds(start: int, size: int) -> slice:
    """Dynamic-slice helper: start:start+size."""
    return slice(start, start + size)


#: the other functions of AWS's `nki.language` stub (nki/api/nki/language/__init__.py): the tile wrappers and
#: device loops the interpreter does not model; calling one is an UnsupportedError at the kernel's line
_UNMODELLED = frozenset({
    "all", "broadcast_to", "device_print", "dropout", "dynamic_range", "expand_dims", "fori_loop",
    "gather_flattened", "is_hbm", "is_on_chip", "is_psum", "is_sbuf", "load", "load_transpose2d", "matmul",
    "max", "mean", "min", "no_reorder", "prod", "rand", "random_seed", "rms_norm", "shared_constant",
    "shared_identity_matrix", "softmax", "store", "sum", "transpose", "var", "where", "while_loop",
})  # fmt: skip
__getattr__ = unmodelled_names("nki.language", _UNMODELLED)
