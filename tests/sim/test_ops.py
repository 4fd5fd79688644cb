"""Per-instruction conformance against torch formulas: the compute engines' arithmetic (activations, their
reduce registers, tensor-tensor, tensor-scalar, reductions, bn_stats)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fusegen.sim as sim

from .tiles import load, store

with sim.installed():
    import nki
    import nki.isa as nisa
    import nki.language as nl


@nki.jit
def unary_kernel(x, op, out_dtype):
    src = load(x)
    dst = nl.ndarray(x.shape, dtype=out_dtype, buffer=nl.sbuf)
    nisa.activation(dst=dst, op=op, data=src)
    return store(dst)


UNARY = {
    "copy": lambda x: x,
    "square": torch.square,
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_apprx_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "exp": torch.exp,
    "relu": torch.relu,
    "abs": torch.abs,
    "sign": torch.sign,
    "softplus": F.softplus,
    "erf": torch.erf,
    "mish": F.mish,
    "gelu_apprx_sigmoid": lambda x: x * torch.sigmoid(1.702 * x),
}
POSITIVE = {"log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal}


@pytest.mark.parametrize("name", sorted(UNARY) + sorted(POSITIVE))
def test_activation_functions_match_torch_in_fp32(name):
    x = torch.randn(128, 64)
    if name in POSITIVE:
        x = x.abs() + 0.1
    fn = {**UNARY, **POSITIVE}[name]
    out = unary_kernel(x, getattr(nl, name), nl.float32)
    torch.testing.assert_close(out, fn(x), rtol=1e-6, atol=1e-6)


def test_bf16_destination_rounds_to_nearest_even():
    # 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7: RNE picks the even mantissa (1.0);
    # 1 + 3*2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: RNE picks 1 + 2^-6.
    x = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 1 + 2**-8 + 2**-20]).repeat(128, 1)
    out = unary_kernel(x, nl.copy, nl.bfloat16)
    assert out.dtype == torch.bfloat16
    expected = torch.tensor([1.0, 1 + 2**-6, -1.0, 1 + 2**-7]).repeat(128, 1)
    assert torch.equal(out.float(), expected)


def test_int32_destination_rounds_half_to_even_and_saturates():
    x = torch.tensor([0.5, 1.5, 2.5, -2.5, 3e10, -3e10]).repeat(4, 1)
    out = unary_kernel(x, nl.copy, nl.int32)
    assert out.dtype == torch.int32
    assert out[0].tolist() == [0, 2, 2, -2, 2**31 - 1, -(2**31)]


@nki.jit
def affine_kernel(x, scale, bias):
    src = load(x)
    b = load(bias) if bias != None else None  # noqa: E711 -- NKI has no `is` (rules.py lang-no-is)
    s = load(scale) if not isinstance(scale, float) else scale
    dst = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=dst, op=nl.exp, data=src, bias=b, scale=s)
    return store(dst)


def test_activation_scale_and_bias_broadcast_per_partition():
    x, scale, bias = torch.randn(64, 32), torch.rand(64, 1), torch.randn(64, 1)
    torch.testing.assert_close(affine_kernel(x, scale, bias), torch.exp(x * scale + bias))
    torch.testing.assert_close(affine_kernel(x, 0.5, None), torch.exp(x * 0.5))


@nki.jit
def reduce_regs_kernel(x, y):
    a, b = load(x), load(y)
    junk = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    first = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    total = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(
        dst=junk,
        op=nl.square,
        data=a,
        reduce_op=nl.add,
        reduce_res=first,
        reduce_cmd=nisa.reduce_cmd.reset_reduce,
    )
    nisa.activation(dst=junk, op=nl.copy, data=b, reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.reduce)
    nisa.activation(
        dst=junk, op=nl.copy, data=b, reduce_op=nl.add, reduce_res=total, reduce_cmd=nisa.reduce_cmd.idle
    )
    return store(first), store(total)


def test_activation_reduce_registers_persist_across_instructions():
    x, y = torch.randn(128, 40), torch.randn(128, 40)
    first, total = reduce_regs_kernel(x, y)
    torch.testing.assert_close(first[:, 0], (x * x).sum(1))
    torch.testing.assert_close(total[:, 0], (x * x).sum(1) + y.sum(1))


@nki.jit
def tensor_tensor_kernel(x, y, op):
    a, b = load(x), load(y)
    dst = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=dst, data1=a, data2=b, op=op)
    return store(dst)


BINARY = {
    "add": torch.add,
    "subtract": torch.sub,
    "multiply": torch.mul,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "power": lambda a, b: torch.pow(a.abs(), b),
    "equal": lambda a, b: (a == b).float(),
    "greater": lambda a, b: (a > b).float(),
    "less_equal": lambda a, b: (a <= b).float(),
    "not_equal": lambda a, b: (a != b).float(),
}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_tensor_tensor_ops(name):
    x, y = torch.randn(32, 16), torch.randn(32, 16)
    x[0, :4] = y[0, :4]
    if name == "power":
        x = x.abs()
    torch.testing.assert_close(tensor_tensor_kernel(x, y, getattr(nl, name)), BINARY[name](x, y))


def test_tensor_tensor_bitwise_on_int32_is_exact():
    x = torch.randint(0, 2**30, (16, 8), dtype=torch.int32)
    y = torch.randint(0, 2**30, (16, 8), dtype=torch.int32)

    @nki.jit
    def kernel(a_hbm, b_hbm):
        a, b = load(a_hbm), load(b_hbm)
        dst = nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=dst, data1=a, data2=b, op=nl.bitwise_xor)
        return store(dst)

    assert torch.equal(kernel(x, y), x ^ y)


@nki.jit
def tensor_scalar_kernel(x, col, op0, rev0, op1, rev1):
    a, c = load(x), load(col)
    dst = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(
        dst=dst, data=a, op0=op0, operand0=c, reverse0=rev0, op1=op1, operand1=3.0, reverse1=rev1
    )
    return store(dst)


def test_tensor_scalar_column_operand_and_reverse_flags():
    x, col = torch.randn(64, 20), torch.randn(64, 1)
    out = tensor_scalar_kernel(x, col, nl.subtract, False, nl.multiply, False)
    torch.testing.assert_close(out, (x - col) * 3.0)
    out = tensor_scalar_kernel(x, col, nl.subtract, True, nl.subtract, True)
    torch.testing.assert_close(out, 3.0 - (col - x))


@nki.jit
def stt_kernel(x, col, y):
    a, c, b = load(x), load(col), load(y)
    dst = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=dst, data=a, op0=nl.add, operand0=c, op1=nl.multiply, operand1=b)
    return store(dst)


def test_scalar_tensor_tensor_rounds_once_to_bf16():
    x, col, y = torch.randn(128, 48), torch.randn(128, 1), torch.randn(128, 48)
    assert torch.equal(stt_kernel(x, col, y), ((x + col) * y).to(torch.bfloat16))


@nki.jit
def reduce_kernel(x, op, axis, negate, keepdims):
    a = load(x)
    shape = (x.shape[0], 1, 1) if keepdims else (x.shape[0], 1)
    dst = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=dst, op=op, data=a, axis=axis, negate=negate, keepdims=keepdims)
    return store(dst)


def test_tensor_reduce_over_trailing_axes():
    x = torch.randn(16, 6, 7)
    torch.testing.assert_close(reduce_kernel(x, nl.add, (1, 2), False, False)[:, 0], x.sum((1, 2)))
    torch.testing.assert_close(reduce_kernel(x, nl.maximum, (1, 2), True, True)[:, 0, 0], -x.amax((1, 2)))


def test_bn_stats_and_aggr_give_mean_and_population_variance():
    x = torch.randn(128, 1000) * 3 + 1

    @nki.jit
    def kernel(x_hbm):
        a = load(x_hbm)
        stats = nl.ndarray((128, 12), dtype=nl.float32, buffer=nl.sbuf)
        nisa.bn_stats(dst=stats[:, 0:6], data=a[:, 0:500])
        nisa.bn_stats(dst=stats[:, 6:12], data=a[:, 500:1000])
        mv = nl.ndarray((128, 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.bn_aggr(dst=mv, data=stats)
        return store(stats), store(mv)

    stats, mv = kernel(x)
    torch.testing.assert_close(stats[:, 0], torch.full((128,), 250.0))
    torch.testing.assert_close(stats[:, 1], x[:, 0:500:2].mean(1))
    torch.testing.assert_close(mv[:, 0], x.mean(1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mv[:, 1], x.var(1, unbiased=False), rtol=1e-5, atol=1e-5)
