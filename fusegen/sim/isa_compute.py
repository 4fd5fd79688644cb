"""Vector/Scalar-engine arithmetic: activation, tensor_tensor, tensor_scalar, reductions, bn stats."""

from __future__ import annotations

import math
import warnings

import torch

from .conformance import violation
from .errors import (
    InvalidArgumentError,
    PartitionError,
    ShapeMismatchError,
    UninitializedReadError,
    UninitializedReadWarning,
    UnsupportedError,
)
from .instr import Instr
from .operands import (
    PSUM,
    alu_engine,
    alu_op,
    apply,
    as_rows,
    enum_member,
    int_rows,
    require_op,
    scalar_or_column,
)
from .ops import Op, reduce_cmd
from .ops import engine as Engine
from .rule_tables import ACTIVATION_FUNCTIONS, ACTIVATION_RANGES, BITVEC_OPS, REDUCE_LEGAL
from .tensor import NkiTensor

_INT32 = (torch.int32, torch.uint32)


def _elementwise(ins: Instr, dst: object, data: object, role: str = "data") -> tuple[NkiTensor, NkiTensor]:
    """dst and one input: on-chip, same partitions and elements per partition."""
    d, s = ins.tensor(dst, "dst"), ins.tensor(data, role)
    ins.on_chip((d, "dst"), (s, role))
    if ins.engine == "gpsimd":
        gpsimd_off_psum(ins, (d, "dst"), (s, role))
    ins.same_layout(d, s, f"dst/{role}")
    return d, s


def gpsimd_off_psum(ins: Instr, *pairs: tuple[NkiTensor, str]) -> None:
    """rules.py gpsimd-no-psum."""
    for t, role in pairs:
        if t.alloc.region in PSUM:
            violation(ins, "gpsimd-no-psum", f"{role} is in PSUM ({t.alloc.label()}) on the GpSimd engine")


def _reduce_registers(
    ins: Instr, values: torch.Tensor, reduce_op: object, cmd: object, reduce_res: object
) -> None:
    """Apply `cmd` to the engine's 128 fp32 accumulation registers; read them out into reduce_res."""
    if cmd is reduce_cmd.idle and reduce_res is None:  # the common case: no register work
        return
    enum_member(ins, cmd, reduce_cmd, "reduce_cmd")
    parts = values.shape[0]
    if cmd is reduce_cmd.load_reduce:
        raise ins.fail(UnsupportedError, "reduce_cmd.load_reduce is not modelled")
    if cmd in (reduce_cmd.reset, reduce_cmd.reset_reduce):
        regs = ins.ctx.reset_regs(ins.engine)
    else:
        kept = ins.ctx.reduce_regs(ins.engine)
        regs = _never_reset(ins, cmd) if kept is None else kept
    if cmd in (reduce_cmd.reduce, reduce_cmd.reset_reduce):
        op = require_op(ins, reduce_op, "reduce_op", 2)
        if op.name != "add":
            violation(ins, "activation-reduce-add", f"reduce_op={op!r}")
        if op.reduce is None:
            raise ins.fail(InvalidArgumentError, f"reduce_op={op!r} cannot reduce")
        regs[:parts] = op.fn(regs[:parts], op.reduce(values, dim=1))
    if reduce_res is not None:
        res = ins.tensor(reduce_res, "reduce_res")
        ins.on_chip((res, "reduce_res"))
        if res.partitions != parts or res.free_size != 1:
            raise ins.fail(ShapeMismatchError, f"reduce_res must be [{parts}, 1], got {res.shape}")
        ins.write(res, regs[:parts].clone())


def _never_reset(ins: Instr, cmd: object) -> torch.Tensor:
    """reduce_cmd reduce / a reduce_res read-out before any reset of this instance: the registers hold what
    an earlier kernel left. Like a read of never-written memory: an error, or (strict=False) a warning and
    NaN registers."""
    detail = f"reduce_cmd={cmd} reads the {ins.engine} engine's reduce registers before any reset"
    if ins.ctx.strict:
        raise ins.fail(UninitializedReadError, detail)
    warnings.warn(f"{ins.site[0]}:{ins.site[1]}: {ins.op}: {detail}", UninitializedReadWarning, stacklevel=4)
    return ins.ctx.reset_regs(ins.engine, math.nan)


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
    if fn.name not in ACTIVATION_FUNCTIONS:
        violation(ins, "activation-table", f"op={fn!r} is not an activation function of the Scalar engine")
    d, s = _elementwise(ins, dst, data)
    x = as_rows(ins, s, "data")
    if isinstance(scale, NkiTensor) and scale.dtype != torch.float32:
        violation(ins, "activation-scale-fp32", f"scale is {scale.dtype}")
    scale_v = scalar_or_column(ins, scale, s.partitions, "scale")
    if not isinstance(scale_v, float) or scale_v != 1.0:
        x = x * scale_v
    if bias is not None:
        if ins.ctx.target.nc_version < 3 and not isinstance(bias, NkiTensor):
            violation(ins, "activation-bias-v2", f"bias={bias!r} on {ins.ctx.target.name}")
        if ins.ctx.target.nc_version < 3 and fn.name == "reciprocal":
            violation(ins, "activation-reciprocal-bias-v2", f"a bias with op={fn!r} on {ins.ctx.target.name}")
        x = x + scalar_or_column(ins, bias, s.partitions, "bias")
    if fn.name in ACTIVATION_RANGES:
        _check_range(ins, fn.name, x)
    y = fn.fn(x)
    ins.write(d, y)
    _reduce_registers(ins, y, reduce_op, reduce_cmd, reduce_res)
    ins.finish(d.partitions, d.free_size)


def _check_range(ins: Instr, name: str, x: torch.Tensor) -> None:
    """rules.py activation-input-range: the argument lies in the function's Valid Input Range (NaN compares
    false both ways, so it passes: the table places it nowhere)."""
    low, high, magnitude = ACTIVATION_RANGES[name]
    v = x.abs() if magnitude else x
    outside = (v < low) | (v > high)
    if bool(outside.any()):
        count, first = int(outside.sum()), float(x[outside].reshape(-1)[0])
        detail = f"{count} argument(s) of {name} outside its range, e.g. {first}"
        violation(ins, "activation-input-range", detail)


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


def _any_psum(*tensors: NkiTensor) -> bool:
    """True if any operand lives in PSUM."""
    return any(t.alloc.region in PSUM for t in tensors)


def _require_integers(ins: Instr, op: Op, *views: tuple[NkiTensor, str]) -> None:
    """rules.py bitvec-integer."""
    for t, role in views:
        if t.dtype.is_floating_point:
            violation(ins, "bitvec-integer", f"{op!r} with {role} of dtype {t.dtype}")


def tensor_tensor(
    dst: NkiTensor,
    data1: NkiTensor,
    data2: NkiTensor,
    op: Op,
    engine: object = Engine.unknown,
    name: object = None,
) -> None:
    """dst = data1 op data2 elementwise (no broadcast); all-int32 arithmetic is exact on GpSimd."""
    ins = Instr("tensor_tensor", "vector")
    fn = alu_op(ins, op, "op")
    d, a, b = ins.tensor(dst, "dst"), ins.tensor(data1, "data1"), ins.tensor(data2, "data2")
    integers = d.dtype in _INT32 and a.dtype in _INT32 and b.dtype in _INT32
    if (engine is None or engine is Engine.unknown) and (
        fn.name == "power" or (integers and not _any_psum(d, a, b))
    ):
        ins.engine = "gpsimd"  # ISA tensor_tensor: nl.power, and all-int32/uint32 operands, run on GpSimd
    else:
        alu_engine(ins, engine, ("vector", "gpsimd"), (fn.name,))
    _elementwise(ins, d, a, "data1")
    _elementwise(ins, d, b, "data2")
    if a.alloc.region in PSUM and b.alloc.region in PSUM:
        violation(ins, "psum-one-input", "data1 and data2 are both in PSUM")
    if fn.bitwise:
        _require_integers(ins, fn, (d, "dst"), (a, "data1"), (b, "data2"))
    floats = d.dtype.is_floating_point or a.dtype.is_floating_point or b.dtype.is_floating_point
    if (fn.bitwise or (integers and ins.engine == "gpsimd")) and not floats:
        bits = fn.bitwise  # raw bit patterns, else exact (signed) integer arithmetic
        x, y = int_rows(ins, a, "data1", bits), int_rows(ins, b, "data2", bits)
    else:
        x, y = as_rows(ins, a, "data1"), as_rows(ins, b, "data2")
    ins.write(d, fn.fn(x, y))
    ins.finish(d.partitions, d.free_size)


def _ts_step(
    ins: Instr, op: Op, x: torch.Tensor, operand: object, reverse: bool, role: str, bitvec: bool
) -> torch.Tensor:
    """One tensor_scalar stage: a unary op (operand None/0) or `x op operand`."""
    if op.arity == 1:
        if operand is not None and not (isinstance(operand, int | float) and operand == 0):
            violation(ins, "tensor-scalar-unary-operand", f"{role}={operand!r} with unary {op!r}")
        return op.fn(x)
    if isinstance(operand, NkiTensor) and not bitvec and operand.dtype != torch.float32:
        violation(ins, "tensor-scalar-operand-fp32", f"{role} is {operand.dtype}")
    if bitvec and _not_integer(operand):  # bit patterns: a float operand would be truncated silently
        violation(ins, "bitvec-integer", f"{op!r} with {role}={operand!r}")
    return apply(op, x, scalar_or_column(ins, operand, x.shape[0], role, integer=bitvec), reverse)


def _not_integer(operand: object) -> bool:
    """A bitvec operand that is not an integer: a float tile, or a non-integral number."""
    if isinstance(operand, NkiTensor):
        return operand.dtype.is_floating_point
    return isinstance(operand, float) and not operand.is_integer()


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
    ins = Instr("tensor_scalar", "vector")
    first = alu_op(ins, op0, "op0", unary=True)
    second = None if op1 is None else alu_op(ins, op1, "op1", unary=True)
    if second is None and operand1 is not None:  # ISA: op1 and operand1 "must be None ... when unused"
        raise ins.fail(InvalidArgumentError, f"operand1={operand1!r} without op1")
    bitvec = first.name in BITVEC_OPS
    if second is not None and (second.name in BITVEC_OPS) != bitvec:
        violation(
            ins, "tensor-scalar-op-kinds", f"op0={first!r} and op1={second!r} mix bitvec and arithmetic"
        )
    alu_engine(ins, engine, ("vector", "gpsimd", "scalar"), (first.name, second.name if second else ""))
    d, s = _elementwise(ins, dst, data)
    if bitvec:
        _require_integers(ins, first, (d, "dst"), (s, "data"))
    integer = bitvec and not s.dtype.is_floating_point
    x = int_rows(ins, s, "data", bits=True) if integer else as_rows(ins, s, "data")
    y = _ts_step(ins, first, x, operand0, reverse0, "operand0", bitvec)
    if second is not None:
        y = _ts_step(ins, second, y, operand1, reverse1, "operand1", bitvec)
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
    first, second = alu_op(ins, op0, "op0"), alu_op(ins, op1, "op1")
    for fn, role in ((first, "op0"), (second, "op1")):
        if fn.name in BITVEC_OPS:
            violation(ins, "stt-arithmetic-only", f"{role}={fn!r} is a bitvec operator")
    alu_engine(ins, Engine.vector, ("vector",), (first.name, second.name))
    d, s = _elementwise(ins, dst, data)
    _, t = _elementwise(ins, dst, operand1, "operand1")
    if s.alloc.region in PSUM and t.alloc.region in PSUM:
        violation(ins, "psum-one-input", "data and operand1 are both in PSUM")
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
    fn = alu_op(ins, op, "op")
    if fn.name not in REDUCE_LEGAL:
        violation(ins, "reduce-op-legal", f"op={fn!r}")
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
        raise ins.fail(UnsupportedError, f"op={fn!r} as a reduction is not modelled")
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
