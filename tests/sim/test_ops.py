"""Per-instruction conformance against torch formulas."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fusegen.sim as sim

with sim.installed():
    import nki
    import nki.isa as nisa
    import nki.language as nl


def _load(t):
    """SBUF copy of an HBM tensor."""
    sb = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=sb, src=t)
    return sb


def _store(sb, dtype=None):
    """shared_hbm copy of an SBUF tile (the kernel output)."""
    out = nl.ndarray(sb.shape, dtype=dtype or sb.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=sb)
    return out


@nki.jit
def unary_kernel(x, op, out_dtype):
    src = _load(x)
    dst = nl.ndarray(x.shape, dtype=out_dtype, buffer=nl.sbuf)
    nisa.activation(dst=dst, op=op, data=src)
    return _store(dst)


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
    src = _load(x)
    b = _load(bias) if bias != None else None  # noqa: E711 -- NKI has no `is` (rules.py lang-no-is)
    s = _load(scale) if not isinstance(scale, float) else scale
    dst = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=dst, op=nl.exp, data=src, bias=b, scale=s)
    return _store(dst)


def test_activation_scale_and_bias_broadcast_per_partition():
    x, scale, bias = torch.randn(64, 32), torch.rand(64, 1), torch.randn(64, 1)
    torch.testing.assert_close(affine_kernel(x, scale, bias), torch.exp(x * scale + bias))
    torch.testing.assert_close(affine_kernel(x, 0.5, None), torch.exp(x * 0.5))


@nki.jit
def reduce_regs_kernel(x, y):
    a, b = _load(x), _load(y)
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
    return _store(first), _store(total)


def test_activation_reduce_registers_persist_across_instructions():
    x, y = torch.randn(128, 40), torch.randn(128, 40)
    first, total = reduce_regs_kernel(x, y)
    torch.testing.assert_close(first[:, 0], (x * x).sum(1))
    torch.testing.assert_close(total[:, 0], (x * x).sum(1) + y.sum(1))


@nki.jit
def tensor_tensor_kernel(x, y, op):
    a, b = _load(x), _load(y)
    dst = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=dst, data1=a, data2=b, op=op)
    return _store(dst)


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
        a, b = _load(a_hbm), _load(b_hbm)
        dst = nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=dst, data1=a, data2=b, op=nl.bitwise_xor)
        return _store(dst)

    assert torch.equal(kernel(x, y), x ^ y)


@nki.jit
def tensor_scalar_kernel(x, col, op0, rev0, op1, rev1):
    a, c = _load(x), _load(col)
    dst = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(
        dst=dst, data=a, op0=op0, operand0=c, reverse0=rev0, op1=op1, operand1=3.0, reverse1=rev1
    )
    return _store(dst)


def test_tensor_scalar_column_operand_and_reverse_flags():
    x, col = torch.randn(64, 20), torch.randn(64, 1)
    out = tensor_scalar_kernel(x, col, nl.subtract, False, nl.multiply, False)
    torch.testing.assert_close(out, (x - col) * 3.0)
    out = tensor_scalar_kernel(x, col, nl.subtract, True, nl.subtract, True)
    torch.testing.assert_close(out, 3.0 - (col - x))


@nki.jit
def stt_kernel(x, col, y):
    a, c, b = _load(x), _load(col), _load(y)
    dst = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=dst, data=a, op0=nl.add, operand0=c, op1=nl.multiply, operand1=b)
    return _store(dst)


def test_scalar_tensor_tensor_rounds_once_to_bf16():
    x, col, y = torch.randn(128, 48), torch.randn(128, 1), torch.randn(128, 48)
    assert torch.equal(stt_kernel(x, col, y), ((x + col) * y).to(torch.bfloat16))


@nki.jit
def reduce_kernel(x, op, axis, negate, keepdims):
    a = _load(x)
    shape = (x.shape[0], 1, 1) if keepdims else (x.shape[0], 1)
    dst = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=dst, op=op, data=a, axis=axis, negate=negate, keepdims=keepdims)
    return _store(dst)


def test_tensor_reduce_over_trailing_axes():
    x = torch.randn(16, 6, 7)
    torch.testing.assert_close(reduce_kernel(x, nl.add, (1, 2), False, False)[:, 0], x.sum((1, 2)))
    torch.testing.assert_close(reduce_kernel(x, nl.maximum, (1, 2), True, True)[:, 0, 0], -x.amax((1, 2)))


def test_bn_stats_and_aggr_give_mean_and_population_variance():
    x = torch.randn(128, 1000) * 3 + 1

    @nki.jit
    def kernel(x_hbm):
        a = _load(x_hbm)
        stats = nl.ndarray((128, 12), dtype=nl.float32, buffer=nl.sbuf)
        nisa.bn_stats(dst=stats[:, 0:6], data=a[:, 0:500])
        nisa.bn_stats(dst=stats[:, 6:12], data=a[:, 500:1000])
        mv = nl.ndarray((128, 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.bn_aggr(dst=mv, data=stats)
        return _store(stats), _store(mv)

    stats, mv = kernel(x)
    torch.testing.assert_close(stats[:, 0], torch.full((128,), 250.0))
    torch.testing.assert_close(stats[:, 1], x[:, 0:500:2].mean(1))
    torch.testing.assert_close(mv[:, 0], x.mean(1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mv[:, 1], x.var(1, unbiased=False), rtol=1e-5, atol=1e-5)


def test_memset_iota_reciprocal_and_transposes():
    x = torch.randn(32, 16).abs() + 0.5
    xb = x.bfloat16()

    @nki.jit
    def kernel(x_hbm, xb_hbm):
        a = _load(x_hbm)
        ones = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=ones, value=1.0)
        idx = nl.ndarray((32, 4, 4), dtype=nl.int32, buffer=nl.sbuf)
        nisa.iota(dst=idx, pattern=[[4, 4], [1, 4]], offset=7, channel_multiplier=100)
        rec = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=rec, data=a)
        pt = nl.ndarray((16, 32), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=pt, data=a)
        vt = nl.ndarray((16, 32), dtype=nl.float32, buffer=nl.sbuf)
        nisa.nc_transpose(dst=vt, data=a, engine=nisa.engine.vector)
        dt = nl.ndarray((16, 32), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_transpose(dst=dt, src=xb_hbm)  # DMA transposes take 2-byte dtypes (rules.py)
        pt_sb = nl.ndarray((16, 32), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=pt_sb, src=pt)
        return _store(ones), _store(idx), _store(rec), _store(pt_sb), _store(vt), _store(dt)

    ones, idx, rec, pt, vt, dt = kernel(x, xb)
    assert torch.equal(ones, torch.ones(32, 16))
    assert torch.equal(idx, 7 + 100 * torch.arange(32).reshape(32, 1, 1) + torch.arange(16).reshape(1, 4, 4))
    torch.testing.assert_close(rec, 1 / x)
    for t in (pt, vt):
        assert torch.equal(t, x.t())
    assert torch.equal(dt, xb.t())


def test_views_ap_patterns_and_broadcast_rows():
    row = torch.randn(1, 24)
    m = torch.randn(8, 24)

    @nki.jit
    def kernel(row_hbm, m_hbm):
        bc = nl.ndarray((128, 24), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=bc, src=row_hbm.ap(pattern=[[0, 128], [1, 24]], offset=0))
        sb = _load(m_hbm)
        # every other column of rows 0..7 via the storage pattern, then a stride-0 free broadcast
        odd = nl.ndarray((8, 12), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=odd, src=sb.ap(pattern=[[24, 8], [2, 12]], offset=1))
        rep = nl.ndarray((8, 3, 4), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=rep, src=sb[:, 0:4].ap(pattern=[[24, 8], [0, 3], [1, 4]]))
        flat = nl.ndarray((8, 24), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=flat.reshape((8, 4, 6)), src=sb[:, 0:24].reshape((8, 2, 12)))
        last = nl.ndarray((1, 24), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=last, src=sb[7])  # DMA: no start-partition rule (compute engines only)
        return _store(bc), _store(odd), _store(rep), _store(flat), _store(last)

    bc, odd, rep, flat, last = kernel(row, m)
    assert torch.equal(bc, row.expand(128, 24))
    assert torch.equal(odd, m[:, 1::2])
    assert torch.equal(rep, m[:, None, 0:4].expand(8, 3, 4))
    assert torch.equal(flat, m)
    assert torch.equal(last, m[7:8])


@nki.jit
def matmul_modes_kernel(a_t, b, mode):
    sa, sb = _load(a_t), _load(b)
    ps = nl.ndarray((a_t.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.psum)
    for k in range(2):
        acc = {"none": None, "explicit": k > 0, "overwrite": False}[mode]
        nisa.nc_matmul(dst=ps, stationary=sa, moving=sb, accumulate=acc)
    out = nl.ndarray(ps.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=out, src=ps)
    # a non-matmul write clears the flags: the next accumulate=None matmul overwrites again
    nisa.memset(dst=ps, value=5.0)
    nisa.nc_matmul(dst=ps, stationary=sa, moving=sb)
    again = nl.ndarray(ps.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=again, src=ps)
    return _store(out), _store(again)


@pytest.mark.parametrize(("mode", "times"), [("none", 2), ("explicit", 2), ("overwrite", 1)])
def test_matmul_accumulate_modes(mode, times):
    a_t = torch.randn(96, 64).bfloat16()
    b = torch.randn(96, 200).bfloat16()
    ref = a_t.float().t() @ b.float()
    out, again = matmul_modes_kernel(a_t, b, mode)
    torch.testing.assert_close(out, times * ref, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(again, ref, rtol=1e-6, atol=1e-5)


def test_matmul_accumulate_none_on_partially_flagged_tile():
    a_t, b = torch.randn(32, 16), torch.randn(32, 64)

    @nki.jit
    def kernel(a_hbm, b_hbm):
        sa, sb = _load(a_hbm), _load(b_hbm)
        ps = nl.ndarray((16, 64), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps[:, 0:32], stationary=sa, moving=sb[:, 0:32])
        nisa.nc_matmul(dst=ps, stationary=sa, moving=sb)
        out = nl.ndarray((16, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=out, src=ps)
        return _store(out)

    ref = a_t.t() @ b
    expected = ref.clone()
    expected[:, :32] *= 2
    torch.testing.assert_close(kernel(a_t, b), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int32])
def test_dma_copy_casts_via_fp32_and_reshapes(dtype):
    x = (torch.randn(4, 64) * 100).to(dtype)

    @nki.jit
    def kernel(x_hbm):
        sb = nl.ndarray((128, 2), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(dst=sb, src=x_hbm)
        return _store(sb, nl.float32)

    assert torch.equal(kernel(x), x.float().to(torch.bfloat16).float().reshape(128, 2))


def test_mutated_input_is_written_back_and_untouched_inputs_are_not():
    x, y = torch.zeros(4, 8), torch.ones(4, 8)

    @nki.jit
    def kernel(x_hbm, y_hbm):
        sb = _load(y_hbm)
        nisa.dma_copy(dst=x_hbm, src=sb)
        return None

    assert kernel(x, y) is None
    assert torch.equal(x, torch.ones(4, 8)) and torch.equal(y, torch.ones(4, 8))


def test_overlapping_in_place_copies_read_before_writing():
    x = torch.arange(8 * 6, dtype=torch.float32).reshape(8, 6)

    @nki.jit
    def kernel(x_hbm):
        t = _load(x_hbm)
        nisa.tensor_copy(dst=t[:, 1:6], src=t[:, 0:5])
        nisa.activation(dst=t[:, 0:3], op=nl.copy, data=t[:, 2:5])
        return _store(t)

    expected = x.clone()
    expected[:, 1:6] = x[:, 0:5].clone()
    expected[:, 0:3] = expected[:, 2:5].clone()
    assert torch.equal(kernel(x), expected)


def test_allocation_helpers_and_tile_size_per_target():
    x = torch.randn(16, 8, 4).bfloat16()

    @nki.jit
    def kernel(x_hbm):
        ones = nl.ones((16, 4), dtype=nl.bfloat16)
        zl = nl.zeros_like(ones, dtype=nl.float32)
        el = nl.empty_like(zl)
        nisa.tensor_tensor(dst=el, data1=ones, data2=zl, op=nl.add)
        tr = nl.ndarray((4, 8, 16), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_transpose(dst=tr, src=x_hbm, axes=(2, 1, 0))
        sizes = (
            nl.tile_size.pmax,
            nl.tile_size.psum_num_banks,
            nl.tile_size.sbuf_fmax_bytes,
            nl.tile_size.gemm_moving_fmax,
            nl.tile_size.bn_stats_fmax,
        )
        return _store(el), _store(tr), sizes

    el, tr, sizes = kernel(x)
    assert torch.equal(el, torch.ones(16, 4)) and torch.equal(tr, x.permute(2, 1, 0))
    assert sizes == (128, 8, 212_984, 512, 512)
    assert sim.run(kernel, x, target="trn1", rules="error").outputs[2][2] == 180_224
