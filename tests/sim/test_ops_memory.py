"""Per-instruction conformance against torch formulas: memory and layout (memsets, iota, transposes, access
patterns), PSUM matmul accumulation, DMA casts, write-back of inputs, allocation helpers."""

from __future__ import annotations

import pytest
import torch

import fusegen.sim as sim

from .conftest import assert_located
from .tiles import load, store

with sim.installed():
    import nki
    import nki.isa as nisa
    import nki.language as nl


def test_memset_iota_reciprocal_and_transposes():
    x = torch.randn(32, 16).abs() + 0.5
    xb = x.bfloat16()

    @nki.jit
    def kernel(x_hbm, xb_hbm):
        a = load(x_hbm)
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
        return store(ones), store(idx), store(rec), store(pt_sb), store(vt), store(dt)

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
        sb = load(m_hbm)
        # every other column of rows 0..7 via the storage pattern, then a stride-0 free broadcast
        odd = nl.ndarray((8, 12), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=odd, src=sb.ap(pattern=[[24, 8], [2, 12]], offset=1))
        rep = nl.ndarray((8, 3, 4), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=rep, src=sb[:, 0:4].ap(pattern=[[24, 8], [0, 3], [1, 4]]))
        flat = nl.ndarray((8, 24), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=flat.reshape((8, 4, 6)), src=sb[:, 0:24].reshape((8, 2, 12)))
        last = nl.ndarray((1, 24), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=last, src=sb[7])  # DMA: no start-partition rule (compute engines only)
        return store(bc), store(odd), store(rep), store(flat), store(last)

    bc, odd, rep, flat, last = kernel(row, m)
    assert torch.equal(bc, row.expand(128, 24))
    assert torch.equal(odd, m[:, 1::2])
    assert torch.equal(rep, m[:, None, 0:4].expand(8, 3, 4))
    assert torch.equal(flat, m)
    assert torch.equal(last, m[7:8])


@nki.jit
def matmul_modes_kernel(a_t, b, mode):
    sa, sb = load(a_t), load(b)
    ps = nl.ndarray((a_t.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.psum)
    for k in range(2):
        acc = {"none": None, "explicit": k > 0, "overwrite": False}[mode]
        nisa.nc_matmul(dst=ps, stationary=sa, moving=sb, accumulate=acc)
    out = nl.ndarray(ps.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=out, src=ps)
    # a non-matmul write clears the flags: an accumulate=False matmul starts a new group
    nisa.memset(dst=ps, value=5.0)
    nisa.nc_matmul(dst=ps, stationary=sa, moving=sb, accumulate=False)
    again = nl.ndarray(ps.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=again, src=ps)
    return store(out), store(again)


@pytest.mark.parametrize(("mode", "times"), [("none", 2), ("explicit", 2), ("overwrite", 1)])
def test_matmul_accumulate_modes(mode, times):
    a_t = torch.randn(96, 64).bfloat16()
    b = torch.randn(96, 200).bfloat16()
    ref = a_t.float().t() @ b.float()
    out, again = matmul_modes_kernel(a_t, b, mode)
    torch.testing.assert_close(out, times * ref, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(again, ref, rtol=1e-6, atol=1e-5)


def _matmul_onto_memset(a_hbm, b_hbm, cols):
    sa, sb = load(a_hbm), load(b_hbm)
    ps = nl.ndarray((a_hbm.shape[1], b_hbm.shape[1]), dtype=nl.float32, buffer=nl.psum)
    nisa.memset(dst=ps[:, 0:cols], value=5.0)
    nisa.nc_matmul(dst=ps, stationary=sa, moving=sb)  # <-accumulate-none-onto-memset
    out = nl.ndarray(ps.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=out, src=ps)
    return store(out)


@pytest.mark.parametrize("cols", [200, 120])
def test_matmul_accumulate_none_onto_a_memset_accumulates(cols):
    """accumulate=None: "the first write to a PSUM location overwrites, and subsequent writes accumulate"
    (MIG 0.3.0; ISA nc_matmul: "whether this PSUM location was previously written"), so after a memset it
    accumulates: undefined on NeuronCore-v2/v3 (ISA nc_matmul note), memset value + product on v4."""
    a_t, b = torch.randn(96, 64).bfloat16(), torch.randn(96, 200).bfloat16()
    for target in ("trn1", "trn2"):
        with pytest.raises(sim.AccumulateError, match=f"accumulate=None onto {64 * cols} PSUM") as info:
            sim.run(_matmul_onto_memset, a_t, b, cols, target=target)
        assert_located(info.value, __file__, "<-accumulate-none-onto-memset")
    out = sim.run(_matmul_onto_memset, a_t, b, cols, target="trn3").outputs
    ref = a_t.float().t() @ b.float()
    ref[:, 0:cols] += 5.0  # columns never written before the matmul are overwritten
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-5)


def test_matmul_accumulate_none_on_partially_flagged_tile():
    a_t, b = torch.randn(32, 16), torch.randn(32, 64)

    @nki.jit
    def kernel(a_hbm, b_hbm):
        sa, sb = load(a_hbm), load(b_hbm)
        ps = nl.ndarray((16, 64), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps[:, 0:32], stationary=sa, moving=sb[:, 0:32])
        nisa.nc_matmul(dst=ps, stationary=sa, moving=sb)
        out = nl.ndarray((16, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=out, src=ps)
        return store(out)

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
        return store(sb, nl.float32)

    assert torch.equal(kernel(x), x.float().to(torch.bfloat16).float().reshape(128, 2))


def test_mutated_input_is_written_back_and_untouched_inputs_are_not():
    x, y = torch.zeros(4, 8), torch.ones(4, 8)

    @nki.jit
    def kernel(x_hbm, y_hbm):
        sb = load(y_hbm)
        nisa.dma_copy(dst=x_hbm, src=sb)
        return None

    assert kernel(x, y) is None
    assert torch.equal(x, torch.ones(4, 8)) and torch.equal(y, torch.ones(4, 8))


def test_overlapping_in_place_copies_read_before_writing():
    x = torch.arange(8 * 6, dtype=torch.float32).reshape(8, 6)

    @nki.jit
    def kernel(x_hbm):
        t = load(x_hbm)
        nisa.tensor_copy(dst=t[:, 1:6], src=t[:, 0:5])
        nisa.activation(dst=t[:, 0:3], op=nl.copy, data=t[:, 2:5])
        return store(t)

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
        return store(el), store(tr), sizes

    el, tr, sizes = kernel(x)
    assert torch.equal(el, torch.ones(16, 4)) and torch.equal(tr, x.permute(2, 1, 0))
    assert sizes == (128, 8, 212_984, 512, 512)
    assert sim.run(kernel, x, target="trn1", rules="error").outputs[2][2] == 180_224
