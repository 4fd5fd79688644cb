"""Documented semantics, each test from a statement of AWS's docs (quoted in the docstring), run under
rules='error' so the kernels are also legal."""

from __future__ import annotations

import pytest
import torch

import fusegen.sim as sim

with sim.installed(rules="error"):
    import nki
    import nki.isa as nisa
    import nki.language as nl


def _load(x_hbm, dtype=None):
    t = nl.ndarray(x_hbm.shape, dtype=dtype or x_hbm.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x_hbm)
    return t


def _store(t):
    out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


@nki.jit
def unary_tensor_scalar(x_hbm):
    x = _load(x_hbm)
    a = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=a, data=x, op0=nl.abs, operand0=0)
    r = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=r, data=a, op0=nl.rsqrt, operand0=None, engine=nisa.engine.gpsimd)
    s = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=s, data=x, op0=nl.square, operand0=None, op1=nl.multiply, operand1=0.5)
    return _store(a), _store(r), _store(s)


def test_unary_alu_op_in_tensor_scalar_takes_operand_none_or_zero():
    """ISA tensor_scalar, operand0: 'Must be None or 0 when op0 is a unary operator (e.g., nl.abs)'."""
    x = torch.randn(128, 16)
    a, r, s = unary_tensor_scalar(x)
    assert torch.equal(a, x.abs())
    torch.testing.assert_close(r, x.abs().rsqrt())
    torch.testing.assert_close(s, x * x * 0.5)


@nki.jit
def bitvec_kernel(x_hbm, y_hbm):
    x, y = _load(x_hbm), _load(y_hbm)
    outs = []
    for op in (nl.bitwise_and, nl.bitwise_or, nl.bitwise_xor):
        d = nl.ndarray(x.shape, dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=d, data1=x, data2=y, op=op)
        outs.append(_store(d))
    m = nl.ndarray(x.shape, dtype=nl.int32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=m, data=x, op0=nl.bitwise_and, operand0=0xFF, op1=nl.left_shift, operand1=4)
    outs.append(_store(m))
    n = nl.ndarray(x.shape, dtype=nl.int32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=n, data=x, op0=nl.invert, operand0=None)
    outs.append(_store(n))
    return tuple(outs)


def test_bitvec_ops_treat_integer_tiles_as_bit_patterns():
    """SH: 'instructions using bitvec operators expect integer data types and treat input elements as bit
    patterns'; values above 2**24 would not survive a float32 round trip."""
    x = torch.randint(-(2**31), 2**31 - 1, (128, 8), dtype=torch.int32)
    y = torch.randint(-(2**31), 2**31 - 1, (128, 8), dtype=torch.int32)
    band, bor, bxor, masked, inverted = bitvec_kernel(x, y)
    assert torch.equal(band, x & y) and torch.equal(bor, x | y) and torch.equal(bxor, x ^ y)
    assert torch.equal(masked, (x & 0xFF) << 4)
    assert torch.equal(inverted, ~x)


@nki.jit
def int32_arith(x_hbm, y_hbm):
    x, y = _load(x_hbm), _load(y_hbm)
    outs = []
    for op in (nl.add, nl.subtract, nl.multiply):
        d = nl.ndarray(x.shape, dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=d, data1=x, data2=y, op=op)
        outs.append(_store(d))
    return tuple(outs)


def test_all_int32_tensor_tensor_is_exact_integer_arithmetic():
    """ISA tensor_tensor: 'When all input/output tiles are int32 or uint32, the operation defaults to
    GpSimd Engine, which uses native integer arithmetic. This ensures exact results for all 32-bit integer
    values.'"""
    x = torch.tensor([[123456789, 46341, 16777217, -987654321]], dtype=torch.int32)
    y = torch.tensor([[987654321, 46340, 1, -123456789]], dtype=torch.int32)
    added, subtracted, multiplied = int32_arith(x, y)
    assert added.tolist() == [[1111111110, 92681, 16777218, -1111111110]]
    assert subtracted.tolist() == [[-864197532, 1, 16777216, -864197532]]
    assert multiplied[0, 1].item() == 46341 * 46340
    assert all(r.engine == "gpsimd" for r in int32_arith.last_run.trace if r.op == "tensor_tensor")


@nki.jit
def dma_convert(x_hbm, dtype):
    t = nl.ndarray(x_hbm.shape, dtype=dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x_hbm)
    return _store(t)


def test_dma_conversion_to_integers_goes_through_float32_and_saturates():
    """ISA dma_copy: 'first casting from src.dtype to float32, then from float32 to dst.dtype'; RN 2.32:
    fp32 to integer casts 'round to nearest, ties to even; saturate to the destination range'."""
    x = torch.tensor([[300.0, -300.0, 2.5, 3.5, -2.5, 127.4]])
    assert dma_convert(x, nl.int8).tolist() == [[127, -128, 2, 4, -2, 127]]
    wide = torch.tensor([[1000, -1000, 16777217, 7]], dtype=torch.int32)
    assert dma_convert(wide, nl.int8).tolist() == [[127, -128, 127, 7]]  # saturates, never wraps
    assert dma_convert(wide, nl.int32).tolist() == wide.tolist()  # equal dtypes: raw copy
    assert dma_convert(wide, nl.uint16).tolist() == [[1000, 0, 65535, 7]]
    via_fp32 = dma_convert(torch.tensor([[16777217]], dtype=torch.int32), nl.float32)
    assert via_fp32.item() == 16777216.0


def test_torch_failures_inside_instructions_are_simerrors(monkeypatch):
    """Anything the interpreter cannot compute raises a SimError naming the line, never a raw torch error."""

    def torch_lacks_it(*args):
        raise NotImplementedError("\"bitwise_and_cpu\" not implemented for 'Float'")

    monkeypatch.setattr(nl.add, "fn", torch_lacks_it)

    def kernel(x):
        a = _load(x)
        nisa.tensor_tensor(dst=a, data1=a, data2=a, op=nl.add)  # <-torch-failure

    with pytest.raises(sim.UnsupportedError) as info:
        sim.run(kernel, torch.ones(2, 2), rules="error")
    assert "bitwise_and_cpu" in str(info.value) and "test_semantics.py" in str(info.value)
    assert "<-torch-failure" in open(__file__).read().splitlines()[int(str(info.value).split(":")[1]) - 1]


def test_legal_but_unmodelled_reduction_is_unsupported():
    """SH marks subtract as a legal reduction op; the interpreter does not model it and says so."""

    def kernel(x):
        a = _load(x)
        r = nl.ndarray((2, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=r, op=nl.subtract, data=a, axis=(1,))

    with pytest.raises(sim.UnsupportedError, match="subtract"):
        sim.run(kernel, torch.ones(2, 4), rules="error")


def test_wrong_instruction_arguments_are_invalid_argument_errors():
    def kernel(x):
        nisa.tensor_copy(dst=_load(x), source=x)

    with pytest.raises(sim.InvalidArgumentError, match="source"):
        sim.run(kernel, torch.ones(2, 4), rules="error")


@nki.jit
def derivative_kernel(x_hbm, op):
    x = _load(x_hbm)
    d = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=d, op=op, data=x)
    return _store(d)


@pytest.mark.parametrize(
    ("name", "fn"),
    [
        ("gelu_dx", torch.nn.functional.gelu),
        ("gelu_apprx_sigmoid_dx", lambda x: x * torch.sigmoid(1.702 * x)),
    ],
)
def test_derivative_activations_of_the_table_match_autograd(name, fn):
    """SH tbl-act-func lists gelu_dx and gelu_apprx_sigmoid_dx: derivatives of gelu and its sigmoid form."""
    x = torch.linspace(-4, 4, 128 * 8).reshape(128, 8).requires_grad_(True)
    (grad,) = torch.autograd.grad(fn(x).sum(), x)
    torch.testing.assert_close(derivative_kernel(x.detach(), getattr(nl, name)), grad)


@pytest.mark.parametrize("name", ["tensor_tensor_scan", "affine_select", "range_select", "register_alloc"])
def test_unmodelled_instructions_of_the_stub_are_unsupported_at_the_kernel_line(name):
    """docs/sim.md: instructions of AWS's stub it does not model raise UnsupportedError (an AttributeError,
    before, named no kernel line); a name the stub lacks stays an AttributeError."""

    def kernel(x):
        getattr(nisa, name)(dst=_load(x), data=_load(x))  # <-unmodelled

    with pytest.raises(sim.UnsupportedError, match=f"{name}: not modelled") as info:
        sim.run(kernel, torch.ones(2, 4), rules="error")
    assert "<-unmodelled" in open(__file__).read().splitlines()[int(str(info.value).split(":")[1]) - 1]
    with pytest.raises(AttributeError):
        nisa.tensor_tensor_scam  # noqa: B018


@pytest.mark.parametrize("name", ["load", "dynamic_range", "softmax"])
def test_unmodelled_language_functions_are_unsupported_at_the_kernel_line(name):
    """`nl.load`, `nl.dynamic_range` (docs/sim.md names them unmodelled) were AttributeErrors."""

    def kernel(x):
        getattr(nl, name)(x)  # <-unmodelled-nl

    with pytest.raises(sim.UnsupportedError, match=f"{name}: not modelled") as info:
        sim.run(kernel, torch.ones(2, 4), rules="error")
    assert "<-unmodelled-nl" in open(__file__).read().splitlines()[int(str(info.value).split(":")[1]) - 1]
