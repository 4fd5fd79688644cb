"""Vector/Scalar-engine arithmetic: activation, tensor_tensor, tensor_scalar, reductions, bn stats."""

from __future__ import annotations

import torch

from .errors import (
    EngineMemoryError,
    InvalidArgumentError,
    PartitionError,
    ShapeMismatchError,
    UnsupportedError,
)
from .instr import Instr
from .operands import PSUM, apply, as_rows, require_op, scalar_or_column, start
from .ops import Op, reduce_cmd
from .ops import engine as Engine
from .tensor import NkiTensor

# trn2 Scalar engine tensor_scalar supports only these (op0, op1) pairs (nki.md §3)
_SCALAR_ENGINE_PAIRS = {("multiply", "add"), ("multiply", None), ("add", None)}


def _elementwise(ins: Instr, dst: object, data: object, role: str = "data") -> tuple[NkiTensor, NkiTensor]:
    """dst and one input: on-chip, same partitions and elements per partition."""
    d, s = ins.tensor(dst, "dst"), ins.tensor(data, role)
    ins.on_chip((d, "dst"), (s, role))
    if ins.engine == "gpsimd":
        ins.forbid(d, PSUM, "dst", "GpSimd cannot access PSUM")
        ins.forbid(s, PSUM, role, "GpSimd cannot access PSUM")
    ins.same_layout(d, s, f"dst/{role}")
    return d, s


def _reduce_registers(
    ins: Instr, values: torch.Tensor, reduce_op: object, cmd: object, reduce_res: object
) -> None:
    """Apply `cmd` to the engine's 128 fp32 accumulation registers; read them out into reduce_res."""
    regs = ins.ctx.reduce_regs(ins.engine)
    parts = values.shape[0]
    if cmd is reduce_cmd.load_reduce:
        raise ins.fail(UnsupportedError, "reduce_cmd.load_reduce is not modelled")
    if cmd in (reduce_cmd.reset, reduce_cmd.reset_reduce):
        regs.zero_()
    if cmd in (reduce_cmd.reduce, reduce_cmd.reset_reduce):
        op = require_op(ins, reduce_op, "reduce_op", 2)
        if op.reduce is None:
            raise ins.fail(InvalidArgumentError, f"reduce_op={op!r} cannot reduce")
        regs[:parts] = op.fn(regs[:parts], op.reduce(values, dim=1))
    if reduce_res is not None:
        res = ins.tensor(reduce_res, "reduce_res")
        ins.on_chip((res, "reduce_res"))
        if res.partitions != parts or res.free_size != 1:
            raise ins.fail(ShapeMismatchError, f"reduce_res must be [{parts}, 1], got {res.shape}")
        ins.write(res, regs[:parts].clone())


def activation(
    dst: NkiTensor,
    op: Op,
    data: NkiTensor,
    bias: object = None,
    scale: object = 1.0,
    reduce_op: object = None,
    reduce_res: object = None,
    reduce_cmd: object = reduce_cmd.idle,
    name: object = None,
) -> None:
    """dst = op(data*scale + bias) on the Scalar engine, with optional register reduction."""
    ins = Instr("activation", "scalar")
    fn = require_op(ins, op, "op", 1)
    d, s = _elementwise(ins, dst, data)
    x = as_rows(ins, s, "data")
    scale_v = scalar_or_column(ins, scale, s.partitions, "scale")
    if not isinstance(scale_v, float) or scale_v != 1.0:
        x = x * scale_v
    if bias is not None:
        if ins.ctx.target.nc_version < 3 and not isinstance(bias, NkiTensor):
            raise ins.fail(InvalidArgumentError, "trn1 activation bias must be a [P,1] tensor, not a scalar")
        x = x + scalar_or_column(ins, bias, s.partitions, "bias")
    y = fn.fn(x)
    ins.write(d, y)
    _reduce_registers(ins, y, reduce_op, reduce_cmd, reduce_res)
    ins.finish(d.partitions, d.free_size)


def activation_reduce(
    dst: NkiTensor,
    op: Op,
    data: NkiTensor,
    reduce_op: Op,
    reduce_res: NkiTensor,
    bias: object = None,
    scale: object = 1.0,
    name: object = None,
) -> None:
    """activation with reduce_cmd=reset_reduce: reduce_res[p] = reduce over all free dims."""
    activation(
        dst,
        op,
        data,
        bias=bias,
        scale=scale,
        reduce_op=reduce_op,
        reduce_res=reduce_res,
        reduce_cmd=reduce_cmd.reset_reduce,
    )


def _compute_inputs(ins: Instr, op: Op, *views: tuple[NkiTensor, str]) -> list[torch.Tensor]:
    """Read inputs as fp32 rows, or as int64 rows for bitwise ops on integer data."""
    if op.bitwise:
        if any(t.dtype.is_floating_point for t, _ in views):
            raise ins.fail(InvalidArgumentError, f"{op!r} needs integer operands")
        return [ins.read(t, role).to(torch.int64).reshape(t.partitions, t.free_size) for t, role in views]
    return [as_rows(ins, t, role) for t, role in views]


def tensor_tensor(
    dst: NkiTensor,
    data1: NkiTensor,
    data2: NkiTensor,
    op: Op,
    engine: object = Engine.unknown,
    name: object = None,
) -> None:
    """dst = data1 op data2 elementwise (no broadcast)."""
    ins = start("tensor_tensor", engine, "vector", ("vector", "gpsimd"))
    fn = require_op(ins, op, "op", 2)
    d, a = _elementwise(ins, dst, data1, "data1")
    _, b = _elementwise(ins, dst, data2, "data2")
    if a.alloc.region in PSUM and b.alloc.region in PSUM:
        raise ins.fail(EngineMemoryError, "data1 and data2 are both in PSUM; at most one input may be")
    x, y = _compute_inputs(ins, fn, (a, "data1"), (b, "data2"))
    ins.write(d, fn.fn(x, y))
    ins.finish(d.partitions, d.free_size)


def tensor_scalar(
    dst: NkiTensor,
    data: NkiTensor,
    op0: Op,
    operand0: object,
    reverse0: bool = False,
    op1: Op | None = None,
    operand1: object = None,
    reverse1: bool = False,
    engine: object = Engine.unknown,
    name: object = None,
) -> None:
    """dst = (data op0 operand0) op1 operand1; operands are numbers or [P,1] columns."""
    ins = start("tensor_scalar", engine, "vector", ("vector", "scalar", "gpsimd"))
    first = require_op(ins, op0, "op0", 2)
    second = None if op1 is None else require_op(ins, op1, "op1", 2)
    if ins.engine == "scalar":
        pair = (first.name, None if second is None else second.name)
        if ins.ctx.target.nc_version < 3 or pair not in _SCALAR_ENGINE_PAIRS:
            raise ins.fail(
                InvalidArgumentError,
                f"Scalar engine tensor_scalar supports {_SCALAR_ENGINE_PAIRS} on trn2+, got {pair}",
            )
    d, s = _elementwise(ins, dst, data)
    x = as_rows(ins, s, "data")
    y = apply(first, x, scalar_or_column(ins, operand0, s.partitions, "operand0"), reverse0)
    if second is not None:
        y = apply(second, y, scalar_or_column(ins, operand1, s.partitions, "operand1"), reverse1)
    ins.write(d, y)
    ins.finish(d.partitions, d.free_size)


def scalar_tensor_tensor(
    dst: NkiTensor,
    data: NkiTensor,
    op0: Op,
    operand0: object,
    op1: Op,
    operand1: NkiTensor,
    reverse0: bool = False,
    reverse1: bool = False,
    name: object = None,
) -> None:
    """dst = (data op0 operand0) op1 operand1, operand0 a number/[P,1], operand1 a full tile."""
    ins = Instr("scalar_tensor_tensor", "vector")
    first, second = require_op(ins, op0, "op0", 2), require_op(ins, op1, "op1", 2)
    d, s = _elementwise(ins, dst, data)
    _, t = _elementwise(ins, dst, operand1, "operand1")
    if s.alloc.region in PSUM and t.alloc.region in PSUM:
        raise ins.fail(EngineMemoryError, "data and operand1 are both in PSUM; at most one may be")
    x = as_rows(ins, s, "data")
    y = apply(first, x, scalar_or_column(ins, operand0, s.partitions, "operand0"), reverse0)
    ins.write(d, apply(second, y, as_rows(ins, t, "operand1"), reverse1))
    ins.finish(d.partitions, d.free_size)


def reciprocal(dst: NkiTensor, data: NkiTensor, name: object = None) -> None:
    """dst = 1 / data (Vector engine)."""
    ins = Instr("reciprocal", "vector")
    d, s = _elementwise(ins, dst, data)
    ins.write(d, torch.reciprocal(as_rows(ins, s, "data")))
    ins.finish(d.partitions, d.free_size)


def tensor_reduce(
    dst: NkiTensor,
    op: Op,
    data: NkiTensor,
    axis: object,
    negate: bool = False,
    keepdims: bool = False,
    name: object = None,
) -> None:
    """Reduce trailing free axes of data (fp32), optionally negated."""
    ins = Instr("tensor_reduce", "vector")
    fn = require_op(ins, op, "op", 2)
    d, s = ins.tensor(dst, "dst"), ins.tensor(data, "data")
    ins.on_chip((d, "dst"), (s, "data"))
    axes = tuple(sorted((axis,) if isinstance(axis, int) else tuple(axis)))  # type: ignore[arg-type]
    trailing = tuple(range(s.ndim - len(axes), s.ndim))
    if not axes or axes != trailing or 0 in axes:
        raise ins.fail(
            InvalidArgumentError,
            f"axis={axis} must be trailing free axes of a {s.ndim}-D tensor (e.g. {(s.ndim - 1,)})",
        )
    if fn.reduce is None:
        raise ins.fail(InvalidArgumentError, f"op={fn!r} cannot reduce")
    y = fn.reduce(ins.read_f32(s, "data"), dim=axes)
    if negate:
        y = -y
    if d.partitions != s.partitions or d.free_size != y.numel() // max(s.partitions, 1):
        raise ins.fail(
            ShapeMismatchError, f"dst {d.shape} must hold {y.numel()} results over {s.partitions} partitions"
        )
    ins.write(d, y)
    ins.finish(s.partitions, s.free_size)


def bn_stats(dst: NkiTensor, data: NkiTensor, name: object = None) -> None:
    """Per partition: (count, mean, var*count) of the even- then odd-indexed elements (6 values)."""
    ins = Instr("bn_stats", "vector")
    d, s = ins.tensor(dst, "dst"), ins.tensor(data, "data")
    ins.on_chip((d, "dst"), (s, "data"))
    fmax = ins.ctx.target.bn_stats_fmax
    if s.free_size > fmax:
        raise ins.fail(
            PartitionError, f"data has {s.free_size} elements per partition; bn_stats takes <= {fmax}"
        )
    if d.partitions != s.partitions or d.free_size != 6:
        raise ins.fail(ShapeMismatchError, f"dst must be [{s.partitions}, 6], got {d.shape}")
    x = as_rows(ins, s, "data")
    stats = [_moments(x[:, parity::2]) for parity in (0, 1)]
    ins.write(d, torch.cat([c for group in stats for c in group], dim=1))
    ins.finish(s.partitions, s.free_size)


def _moments(x: torch.Tensor) -> list[torch.Tensor]:
    """[count, mean, sum of squared deviations] columns (zeros for an empty group)."""
    count = torch.full((x.shape[0], 1), float(x.shape[1]))
    if x.shape[1] == 0:
        return [count, torch.zeros_like(count), torch.zeros_like(count)]
    mean = x.mean(dim=1, keepdim=True)
    return [count, mean, ((x - mean) ** 2).sum(dim=1, keepdim=True)]


def bn_aggr(dst: NkiTensor, data: NkiTensor, name: object = None) -> None:
    """Combine (count, mean, var*count) triples into per-partition mean and (population) variance."""
    ins = Instr("bn_aggr", "vector")
    d, s = ins.tensor(dst, "dst"), ins.tensor(data, "data")
    ins.on_chip((d, "dst"), (s, "data"))
    if s.free_size % 3 or d.partitions != s.partitions or d.free_size != 2:
        raise ins.fail(
            ShapeMismatchError,
            f"data needs a multiple of 3 elements per partition and dst "
            f"[{s.partitions}, 2]; got {s.shape} -> {d.shape}",
        )
    triples = as_rows(ins, s, "data").reshape(s.partitions, -1, 3)
    count, mean, m2 = triples.unbind(dim=2)
    total = count.sum(dim=1, keepdim=True)
    mu = (count * mean).sum(dim=1, keepdim=True) / total
    var = (m2.sum(dim=1, keepdim=True) + (count * (mean - mu) ** 2).sum(dim=1, keepdim=True)) / total
    ins.write(d, torch.cat([mu, var], dim=1))
    ins.finish(s.partitions, s.free_size)
