"""Kernels the rules audit found passing (or failing) wrongly: each breaks a documented rule the interpreter
let through, or is legal code it rejected. rules='error' throughout, as in the conformance tests."""

from __future__ import annotations

import math

import pytest
import torch

import fusegen.sim as sim

from .conftest import assert_located

with sim.installed():
    import nki.isa as nisa
    import nki.language as nl

F32, BF16, I32 = nl.float32, nl.bfloat16, nl.int32


def _tile(shape, dtype=F32, buffer=nl.sbuf):
    t = nl.ndarray(shape, dtype=dtype, buffer=buffer)
    nisa.memset(dst=t, value=1)
    return t


def _dst(shape, dtype=F32, buffer=nl.sbuf):
    return nl.ndarray(shape, dtype=dtype, buffer=buffer)


def power_tensor_scalar():
    nisa.tensor_scalar(dst=_dst((128, 8)), data=_tile((128, 8)), op0=nl.power, operand0=2.0)  # <-gap-power


def bitvec_float_column():
    col = _tile((128, 1))
    nisa.tensor_scalar(  # <-gap-bitvec-column
        dst=_dst((128, 8), I32), data=_tile((128, 8), I32), op0=nl.bitwise_and, operand0=col
    )


def bitvec_fraction():
    nisa.tensor_scalar(  # <-gap-bitvec-fraction
        dst=_dst((128, 8), I32), data=_tile((128, 8), I32), op0=nl.left_shift, operand0=1.5
    )


def operand1_without_op1():
    nisa.tensor_scalar(  # <-gap-operand1
        dst=_dst((128, 8)), data=_tile((128, 8)), op0=nl.add, operand0=1.0, operand1=3.0
    )


def iota_from_partition_one():
    nisa.iota(dst=_dst((128, 8), I32)[1:2, :], pattern=[[1, 8]])  # <-gap-iota


def transpose_across_banks():
    out = _dst((128, 1024), buffer=nl.psum)
    nisa.nc_transpose(dst=out[:, 448:576], data=_tile((128, 128)))  # <-gap-transpose-bank


def iota_offset_past_int32():
    nisa.iota(dst=_dst((128, 8), I32), pattern=[[1, 8]], offset=2**31)  # <-gap-int32-offset


def reshape_merging_partitions():
    nisa.tensor_copy(dst=_dst((64, 16)), src=_tile((128, 8)).reshape((64, 16)))  # <-gap-reshape


@pytest.mark.parametrize(
    ("kernel", "error", "rule", "marker"),
    [
        (power_tensor_scalar, sim.InvalidArgumentError, "[alu-engine] no engine", "<-gap-power"),
        (bitvec_float_column, sim.DtypeError, "[bitvec-integer]", "<-gap-bitvec-column"),
        (bitvec_fraction, sim.DtypeError, "[bitvec-integer]", "<-gap-bitvec-fraction"),
        (operand1_without_op1, sim.InvalidArgumentError, "operand1=3.0 without op1", "<-gap-operand1"),
        (iota_from_partition_one, sim.PartitionError, "[start-partition]", "<-gap-iota"),
        (transpose_across_banks, sim.MatmulShapeError, "PSUM bank boundary", "<-gap-transpose-bank"),
        (iota_offset_past_int32, sim.InvalidArgumentError, "is not an int32", "<-gap-int32-offset"),
        (reshape_merging_partitions, sim.OutOfBoundsError, "partition stride 16", "<-gap-reshape"),
    ],
)
def test_broken_rule_is_rejected_at_its_line(kernel, error, rule, marker):
    with pytest.raises(error) as info:
        sim.run(kernel, target="trn2", rules="error")
    assert rule in str(info.value)
    assert_located(info.value, __file__, marker)


def test_legal_neighbours_still_pass():
    """The same instructions inside the rules: integer bitvec operands, a unary op, iota at partition 0 or
    32, a transpose inside one bank."""

    def kernel():
        ints = _tile((128, 8), I32)
        col = _tile((128, 1), I32)
        nisa.tensor_scalar(dst=_dst((128, 8), I32), data=ints, op0=nl.bitwise_and, operand0=col)
        nisa.tensor_scalar(dst=_dst((128, 8), I32), data=ints, op0=nl.left_shift, operand0=2.0)
        nisa.tensor_scalar(dst=_dst((128, 8)), data=_tile((128, 8)), op0=nl.rsqrt, operand0=None)
        nisa.iota(dst=_dst((128, 8), I32)[32:64, :], pattern=[[1, 8]])
        out = _dst((128, 1024), buffer=nl.psum)
        nisa.nc_transpose(dst=out[:, 384:512], data=_tile((128, 128)))

    sim.run(kernel, target="trn2", rules="error")


def test_bf16_psum_matmul_accumulates_on_trn3():
    """NeuronCore-v4 takes a bf16 PSUM dst: two accumulated matmuls of ones give 2*K (it raised a torch
    dtype error from the deferred GEMM)."""

    def kernel():
        st, mv = _tile((128, 128), BF16), _tile((128, 512), BF16)
        acc = _dst((128, 512), BF16, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=st, moving=mv)
        nisa.nc_matmul(dst=acc, stationary=st, moving=mv)
        sb = _dst((128, 512))
        nisa.tensor_copy(dst=sb, src=acc)
        out = nl.ndarray((128, 512), dtype=F32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=sb)
        return out

    out = sim.run(kernel, target="trn3", rules="error").outputs
    assert torch.equal(out, torch.full((128, 512), 2.0 * 128))


def reduce_without_reset():
    data = _tile((128, 8))
    nisa.activation(  # <-gap-registers
        dst=_dst((128, 8)), op=nl.copy, data=data, reduce_op=nl.add, reduce_res=_dst((128, 1)),
        reduce_cmd=nisa.reduce_cmd.reduce,
    )


def test_reduce_registers_read_before_any_reset_are_never_written():
    """The registers keep what an earlier kernel left (the interpreter started them at zero, so a kernel
    that forgot reduce_cmd.reset computed the right sum here and garbage on hardware)."""
    with pytest.raises(sim.UninitializedReadError, match="before any reset") as info:
        sim.run(reduce_without_reset, rules="error")
    assert_located(info.value, __file__, "<-gap-registers")
    with pytest.warns(sim.UninitializedReadWarning):
        sim.run(reduce_without_reset, rules="error", strict=False)


def test_right_shift_is_logical():
    """SH tbl-aluop: nl.right_shift is the logical shift ("Arithmetic Shift Right: Not supported"); negative
    int32/int8 values shifted in the sign bit (arithmetic shift)."""
    x32 = torch.tensor([[-8, 8, -(2**31), 2**31 - 1]], dtype=torch.int32)
    x8 = torch.tensor([[-8, 8, -128, 127]], dtype=torch.int8)

    def kernel(a_hbm, b_hbm):
        outs = []
        for src, by_tile in ((a_hbm, False), (b_hbm, False), (a_hbm, True)):
            t = _dst(tuple(src.shape), src.dtype)
            nisa.dma_copy(dst=t, src=src)
            r = _dst(tuple(src.shape), src.dtype)
            if by_tile:  # tensor_tensor by a tile of ones
                ones = _dst(tuple(src.shape), src.dtype)
                nisa.memset(dst=ones, value=1)
                nisa.tensor_tensor(dst=r, data1=t, data2=ones, op=nl.right_shift)
            else:
                nisa.tensor_scalar(dst=r, data=t, op0=nl.right_shift, operand0=1)
            out = nl.ndarray(tuple(src.shape), dtype=src.dtype, buffer=nl.shared_hbm)
            nisa.dma_copy(dst=out, src=r)
            outs.append(out)
        return tuple(outs)

    s32, s8, tt32 = sim.run(kernel, x32, x8, rules="error").outputs
    want32 = torch.from_numpy((x32.numpy().view("uint32") >> 1).view("int32"))
    want8 = torch.from_numpy((x8.numpy().view("uint8") >> 1).view("int8"))
    assert torch.equal(s32, want32) and torch.equal(tt32, want32)
    assert torch.equal(s8, want8)


def _activation(op, value, scale=1.0):
    """activation(op) of a tile holding `value` (times scale)."""

    def kernel():
        data = _dst((128, 8))
        nisa.memset(dst=data, value=value)
        out = nl.ndarray((128, 8), dtype=F32, buffer=nl.shared_hbm)
        y = _dst((128, 8))
        nisa.activation(dst=y, op=op, data=data, scale=scale)  # <-gap-act-range
        nisa.dma_copy(dst=out, src=y)
        return out

    return kernel


@pytest.mark.parametrize(
    ("op", "value", "scale"),
    [(nl.sin, 9.0, 1.0), (nl.sin, 1.0, 4.0), (nl.arctan, 2.0, 1.0), (nl.log, 0.0, 1.0),
     (nl.log, 2.0**65, 1.0), (nl.sqrt, 0.0, 1.0), (nl.rsqrt, 0.0, 1.0), (nl.rsqrt, float("inf"), 1.0),
     (nl.reciprocal, 0.0, 1.0), (nl.reciprocal, -(2.0**43), 1.0)],
)  # fmt: skip
def test_activation_outside_its_valid_input_range_is_rejected(op, value, scale):
    """SH tbl-act-func: outside its Valid Input Range the Scalar engine's result is invalid (sin(9.0) is
    ~27.65 on hardware); the interpreter computed the exact function."""
    with pytest.raises(sim.InputRangeError, match=r"\[activation-input-range\]") as info:
        sim.run(_activation(op, value, scale), rules="error")
    assert_located(info.value, __file__, "<-gap-act-range")


@pytest.mark.parametrize(
    ("op", "value", "scale", "want"),
    [(nl.sin, 3.0, 1.0, math.sin(3.0)), (nl.sin, 4.0, 0.5, math.sin(2.0)),
     (nl.log, 2.0**64, 1.0, 64 * math.log(2)), (nl.rsqrt, 2.0**-86, 1.0, 2.0**43),
     (nl.reciprocal, -2.0, 1.0, -0.5), (nl.arctan, -1.5, 1.0, math.atan(-1.5)),
     (nl.exp, -float("inf"), 1.0, 0.0), (nl.sqrt, float("nan"), 1.0, float("nan"))],
)  # fmt: skip
def test_activation_inside_its_valid_input_range_passes(op, value, scale, want):
    """The bounds themselves, a scale bringing the argument in range, full-range functions and NaN (which
    the table does not place outside any range) pass."""
    out = sim.run(_activation(op, value, scale), rules="error").outputs
    torch.testing.assert_close(out, torch.full((128, 8), want), equal_nan=True)


def test_warn_mode_computes_the_exact_function_out_of_range():
    with pytest.warns(sim.ConformanceWarning, match=r"\[activation-input-range\]"):
        out = sim.run(_activation(nl.sin, 9.0), rules="warn").outputs
    torch.testing.assert_close(out, torch.full((128, 8), math.sin(9.0)))


def _reciprocal(with_bias):
    """A kernel: activation(op=nl.reciprocal) of x, plus a [128, 1] bias b when `with_bias`."""

    def kernel(x, b):
        xs, bs = _dst((128, 8)), _dst((128, 1))
        nisa.dma_copy(dst=xs, src=x)
        nisa.dma_copy(dst=bs, src=b)
        ys = _dst((128, 8))
        nisa.activation(dst=ys, op=nl.reciprocal, data=xs, bias=bs if with_bias else None)
        out = nl.ndarray((128, 8), dtype=F32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=ys)
        return out

    return kernel


@pytest.mark.parametrize(("target", "with_bias"), [("trn2", True), ("trn3", True), ("trn1", False)])
def test_reciprocal_activation_takes_a_bias_from_neuroncore_v3(target, with_bias):
    """SH 'NKI Engine Selection': activation(op=nl.reciprocal) "doesn't support setting bias on
    NeuronCore-v2" (rule activation-reciprocal-bias-v2, refused in tests/sim/test_rules.py); it runs
    without one there, and with one from v3: 1 / (x + b)."""
    gen = torch.Generator().manual_seed(3)
    x, b = 1 + torch.rand(128, 8, generator=gen), 0.5 + torch.rand(128, 1, generator=gen) / 2
    out = sim.run(_reciprocal(with_bias), x, b, target=target, rules="error").outputs
    assert torch.equal(out, torch.reciprocal(x + b if with_bias else x))
