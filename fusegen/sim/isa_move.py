"""Data-movement instructions: DMA copy/transpose, tensor_copy, memset, iota, nc_transpose."""

from __future__ import annotations

import math

import torch

from . import provenance
from .conformance import violation
from .errors import DtypeError, InvalidArgumentError, PartitionError, ShapeMismatchError, UnsupportedError
from .instr import Instr
from .isa_compute import gpsimd_off_psum
from .isa_matmul import check_bank
from .memory import MemoryRegion
from .operands import PSUM, enum_member, start
from .ops import dge_mode as DgeMode
from .ops import engine as Engine
from .ops import oob_mode as OobMode
from .rule_tables import HWDGE_TRANSPOSE_ROWS, MAX_IOTA_PATTERN
from .tensor import NkiTensor

_VECTOR_LIKE = ("vector", "gpsimd", "scalar")
_TRANSPOSE_AXES = ((1, 0), (2, 1, 0), (3, 1, 2, 0))


def _dma_operands(ins: Instr, dst: object, src: object) -> tuple[NkiTensor, NkiTensor]:
    """DMA moves HBM/SBUF data only; PSUM is unreachable."""
    d, s = ins.tensor(dst, "dst"), ins.tensor(src, "src")
    ins.forbid(d, PSUM, "dst", "dma-no-psum")
    ins.forbid(s, PSUM, "src", "dma-no-psum")
    return d, s


def _dma_mode(ins: Instr, dge: object, engine: object, d: NkiTensor, s: NkiTensor) -> None:
    """hwdge rules: NeuronCore-v3+, equal dtypes; `engine` only with hwdge (sync or scalar)."""
    if dge is DgeMode.hwdge:
        if not ins.ctx.target.supports_hwdge:
            violation(ins, "hwdge-target", f"dge_mode=hwdge on {ins.ctx.target.name}")
        if d.dtype != s.dtype:
            violation(ins, "hwdge-dtype", f"dst {d.dtype} != src {s.dtype}")
        if engine not in (Engine.unknown, Engine.sync, Engine.scalar):
            violation(ins, "dma-engine", f"engine={engine} with hwdge")
    elif engine is not Engine.unknown:
        violation(ins, "dma-engine", f"engine={engine} without dge_mode=hwdge")


def _enums(ins: Instr, dge: object, oob: object) -> None:
    """A DMA's dge_mode and oob_mode are enum members (rules.py enum-members)."""
    enum_member(ins, dge, DgeMode, "dge_mode")
    enum_member(ins, oob, OobMode, "oob_mode")


def _elems(t: NkiTensor) -> tuple[int, int]:
    """(partitions, elements per partition) as reported in the trace."""
    return (t.partitions, t.free_size) if t.alloc.on_chip else (1, t.numel)


def dma_copy(
    dst: NkiTensor,
    src: NkiTensor,
    priority: object = None,
    oob_mode: object = OobMode.error,
    dge_mode: object = DgeMode.unknown,
    engine: object = Engine.unknown,
    name: object = None,
) -> None:
    """dst = src between HBM and SBUF (reshaping copy; dtype cast via fp32 unless hwdge)."""
    ins = Instr("dma_copy", "dma")
    d, s = _dma_operands(ins, dst, src)
    _enums(ins, dge_mode, oob_mode)
    _dma_mode(ins, dge_mode, engine, d, s)
    if d.numel != s.numel:
        raise ins.fail(
            ShapeMismatchError, f"dst {d.shape} has {d.numel} elements, src {s.shape} has {s.numel}"
        )
    value = ins.read(s, "src")
    if provenance.from_input(d, s):  # copied when the tile is next viewed: GEMMs mostly read the input
        ins.write_later(d, value)
        provenance.record(d, s)
    else:  # ISA dma_copy: differing dtypes convert through float32 (to integers: RNE, then saturation)
        ins.write(d, value if s.dtype == d.dtype else value.float())
    ins.finish(*_elems(d if d.alloc.on_chip else s))


def dma_transpose(
    dst: NkiTensor,
    src: NkiTensor,
    axes: object = None,
    priority: object = None,
    dge_mode: object = DgeMode.unknown,
    oob_mode: object = OobMode.error,
    name: object = None,
) -> None:
    """dst = src permuted by `axes` (default: reversed), into SBUF."""
    ins = Instr("dma_transpose", "dma")
    d, s = _dma_operands(ins, dst, src)
    _enums(ins, dge_mode, oob_mode)
    if d.alloc.region is not MemoryRegion.sbuf:
        raise ins.fail(InvalidArgumentError, f"dst must be in SBUF, got {d.alloc.region.value}")
    perm = tuple(range(s.ndim))[::-1] if axes is None else tuple(axes)  # type: ignore[arg-type]
    if perm not in _TRANSPOSE_AXES or len(perm) != s.ndim:
        raise ins.fail(UnsupportedError, f"axes={perm} for a {s.ndim}-D src (supported: {_TRANSPOSE_AXES})")
    if d.dtype != s.dtype:
        raise ins.fail(DtypeError, f"dst {d.dtype} != src {s.dtype}")
    _transpose_rules(ins, s, dge_mode)
    want = tuple(s.shape[p] for p in perm)
    if d.shape != want:
        raise ins.fail(ShapeMismatchError, f"dst shape {d.shape} must equal permuted src shape {want}")
    ins.write(d, ins.read(s, "src").permute(perm))
    ins.finish(*_elems(d))


def _transpose_rules(ins: Instr, s: NkiTensor, dge: object) -> None:
    """rules.py dma-transpose-*: DGE mode, 2-byte dtype, hwdge shapes."""
    if dge not in (DgeMode.unknown, DgeMode.hwdge, None):
        violation(ins, "dma-transpose-dge-mode", f"dge_mode={dge}")
    if s.dtype.itemsize != 2:
        violation(ins, "dma-transpose-2byte", f"src dtype {s.dtype} ({s.dtype.itemsize} bytes)")
    if dge is DgeMode.hwdge:
        _dma_mode(ins, dge, Engine.unknown, s, s)  # hwdge itself needs NeuronCore-v3+
        rows, last = s.shape[0], s.shape[-1]
        ok = rows == 16 if s.ndim == 2 else rows in HWDGE_TRANSPOSE_ROWS and rows * s.shape[-2] % 16 == 0
        if not ok or last > 128:
            violation(ins, "dma-transpose-hwdge-shape", f"src shape {s.shape}")


def tensor_copy(dst: NkiTensor, src: NkiTensor, engine: object = Engine.unknown, name: object = None) -> None:
    """dst = src on-chip (bit-exact for equal dtypes, else via fp32)."""
    ins = start("tensor_copy", engine, "vector", _VECTOR_LIKE)
    d, s = ins.tensor(dst, "dst"), ins.tensor(src, "src")
    ins.on_chip((d, "dst"), (s, "src"))
    if ins.engine == "gpsimd":
        gpsimd_off_psum(ins, (d, "dst"), (s, "src"))
    if ins.engine == "scalar" and ins.ctx.target.nc_version < 3:
        violation(ins, "tensor-copy-scalar-v2", f"engine=scalar on {ins.ctx.target.name}")
    ins.same_layout(d, s, "dst/src")
    value = ins.read(s, "src")
    ins.write(d, value if value.dtype == d.dtype else value.float())
    ins.finish(d.partitions, d.free_size)


def memset(dst: NkiTensor, value: object, engine: object = Engine.unknown, name: object = None) -> None:
    """Fill dst with a constant (an int for integer tensors)."""
    ins = start("memset", engine, "vector", ("vector", "gpsimd"))
    d = ins.tensor(dst, "dst")
    ins.on_chip((d, "dst"))
    if ins.engine == "gpsimd":
        gpsimd_off_psum(ins, (d, "dst"))
    if not d.dtype.is_floating_point and not float(value).is_integer():  # type: ignore[arg-type]
        raise ins.fail(DtypeError, f"value {value!r} does not fit integer dtype {d.dtype}")
    if not d.dtype.is_floating_point and isinstance(value, float):
        violation(ins, "memset-value-dtype", f"value={value!r} into a {d.dtype} tile")
    ins.write(d, torch.full(d.shape, float(value), dtype=torch.float32))  # type: ignore[arg-type]
    ins.finish(d.partitions, d.free_size)


def iota(
    dst: NkiTensor,
    pattern: list[list[int]],
    offset: int = 0,
    channel_multiplier: int = 0,
    name: object = None,
) -> None:
    """dst[p, ...] = offset + p*channel_multiplier + sum(index_i * step_i) (int32 arithmetic)."""
    ins = Instr("iota", "gpsimd")
    d = ins.tensor(dst, "dst")
    if d.alloc.region is not MemoryRegion.sbuf:
        raise ins.fail(InvalidArgumentError, f"dst must be in SBUF, got {d.alloc.region.value}")
    ins.on_chip((d, "dst"))  # start-partition: iota is a GpSimd instruction like any other
    if len(pattern) > MAX_IOTA_PATTERN:
        violation(ins, "view-dims", f"pattern has {len(pattern)} [step, num] pairs")
    steps = {f"step {step}": step for step, _ in pattern}
    fields = {"offset": offset, "channel_multiplier": channel_multiplier, **steps}
    for role, value in fields.items():  # ISA iota: an int32 offset and multiplier, int32 arithmetic
        if not -(2**31) <= int(value) < 2**31:
            raise ins.fail(InvalidArgumentError, f"{role}={value} is not an int32")
    counts = [int(c) for _, c in pattern]
    if math.prod(counts) != d.free_size:
        raise ins.fail(
            ShapeMismatchError,
            f"pattern covers {math.prod(counts)} elements, dst has {d.free_size} per partition",
        )
    values = torch.full((d.partitions, *counts), int(offset), dtype=torch.int64)
    values += (torch.arange(d.partitions) * int(channel_multiplier)).reshape(-1, *[1] * len(counts))
    for axis, (step, count) in enumerate(pattern):
        shape = [1] * (len(counts) + 1)
        shape[axis + 1] = int(count)
        values += (torch.arange(int(count)) * int(step)).reshape(shape)
    ins.write(d, values if not d.dtype.is_floating_point else values.float())
    ins.finish(d.partitions, d.free_size)


def nc_transpose(
    dst: NkiTensor, data: NkiTensor, engine: object = Engine.unknown, name: object = None
) -> None:
    """Swap partition and (flattened) free dims: Tensor engine <=128x128 into PSUM, Vector <=32x32."""
    d, s = dst, data
    default = "tensor" if isinstance(d, NkiTensor) and d.alloc.region is MemoryRegion.psum else "vector"
    ins = start("nc_transpose", engine, default, ("tensor", "vector"))
    d, s = ins.tensor(dst, "dst"), ins.tensor(data, "data")
    ins.on_chip((d, "dst"), (s, "data"))
    limit = 128 if ins.engine == "tensor" else 32
    if ins.engine == "tensor":
        ins.forbid(s, PSUM, "data", "tensor-engine-memories")
        ins.forbid(d, (MemoryRegion.sbuf,), "dst", "tensor-engine-memories")
        if d.alloc.region is MemoryRegion.psum:  # ISA: the Tensor engine's transpose is an nc_matmul
            check_bank(ins, d)
    if s.partitions > limit or s.free_size > limit:
        raise ins.fail(
            PartitionError,
            f"{ins.engine} transpose is limited to [{limit}, {limit}], got [{s.partitions}, {s.free_size}]",
        )
    if d.dtype != s.dtype:
        raise ins.fail(DtypeError, f"dst {d.dtype} != data {s.dtype}")
    if (d.partitions, d.free_size) != (s.free_size, s.partitions):
        raise ins.fail(ShapeMismatchError, f"dst {d.shape} must be [{s.free_size}, {s.partitions}]")
    value = ins.read(s, "data").reshape(s.partitions, s.free_size)
    if ins.engine == "tensor" and not ins.ctx.target.exact_transpose:
        value = identity_matmul_rows(value)
    ins.write(d, value.t())
    ins.finish(d.partitions, d.free_size)


def identity_matmul_rows(x: torch.Tensor) -> torch.Tensor:
    """x as a matmul with the identity gives it back, rows on partitions: NeuronCore-v2's Tensor-engine
    transpose is that matmul and "not bit-accurate if the input data contains NaN/Inf" (ISA nc_transpose;
    bit-accurate from v3), so an inf or nan reaches every other row of its column as 0 * inf = nan."""
    if not x.is_floating_point():
        return x
    bad = ~x.float().isfinite()
    if not bool(bad.any()):
        return x
    elsewhere = bad.sum(dim=0, keepdim=True) - bad.int() > 0  # another row of this column is non-finite
    return torch.where(elsewhere, torch.tensor(math.nan, dtype=x.dtype), x)
