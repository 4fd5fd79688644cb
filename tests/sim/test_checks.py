"""One negative test per check: the exception class, and a message naming this file and line."""

from __future__ import annotations

import warnings

import pytest
import torch

import fusegen.sim as sim

from .conftest import assert_located

with sim.installed():
    import nki.isa as nisa
    import nki.language as nl

F32 = nl.float32


def _sb(shape, dtype=F32):
    t = nl.ndarray(shape, dtype=dtype, buffer=nl.sbuf)
    nisa.memset(dst=t, value=0)
    return t


def expect(error, marker, kernel, *args, grid=1, **kwargs):
    """Run and check the error class and its source location."""
    with pytest.raises(error) as info:
        sim.run(kernel, *args, grid=grid, **kwargs)
    assert_located(info.value, __file__, marker)
    return str(info.value)


def test_partition_dim_over_128():
    def kernel():
        nl.ndarray((256, 4), dtype=F32, buffer=nl.sbuf)  # <-partition

    msg = expect(sim.PartitionError, "<-partition", kernel)
    assert "128" in msg


@pytest.mark.parametrize(("m", "n", "marker"), [(129, 64, "<-mm-m"), (64, 513, "<-mm-n")])
def test_matmul_free_size_limits(m, n, marker):
    def kernel():
        st, mv = _sb((64, m)), _sb((64, n))
        ps = nl.ndarray((128, 1024), dtype=F32, buffer=nl.psum)
        if marker == "<-mm-m":
            nisa.nc_matmul(dst=ps[0:128, 0:64], stationary=st, moving=mv)  # <-mm-m
        else:
            nisa.nc_matmul(dst=ps[0:64, 0:513], stationary=st, moving=mv)  # <-mm-n

    assert str(m if m > 128 else n) in expect(sim.MatmulShapeError, marker, kernel)


def test_views_cannot_grow_the_partition_dim():
    def kernel():
        big = nl.ndarray((128, 2, 64), dtype=F32, buffer=nl.sbuf)
        big.reshape((256, 64))  # <-reshape

    expect(sim.PartitionError, "<-reshape", kernel)


def test_a_view_cannot_step_over_partitions():
    """ARCH 'Data streaming': no partition-dim striding, an operand occupies consecutive partitions (a step
    over them as a slice ran, where `.ap` with the same pattern was refused)."""

    def kernel():
        t = _sb((128, 8))
        nisa.tensor_copy(dst=_sb((64, 8)), src=t[0:128:2, :])  # <-p-step

    def steps_in_free_dims():
        t = _sb((128, 8))
        nisa.tensor_copy(dst=_sb((128, 4)), src=t[:, 0:8:2])

    assert "partition stride 16" in expect(sim.OutOfBoundsError, "<-p-step", kernel)
    sim.run(steps_in_free_dims)


def test_matmul_contraction_mismatch():
    def kernel():
        ps = nl.ndarray((64, 64), dtype=F32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=_sb((128, 64)), moving=_sb((96, 64)))  # <-mm-kk

    assert "128" in expect(sim.MatmulShapeError, "<-mm-kk", kernel)


def test_matmul_dst_straddles_psum_bank():
    def kernel():
        ps = nl.ndarray((128, 1024), dtype=F32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps[:, 256:768], stationary=_sb((64, 128)), moving=_sb((64, 512)))  # <-bank

    assert "bank" in expect(sim.MatmulShapeError, "<-bank", kernel)


@pytest.mark.parametrize("case", ["dma_psum", "matmul_in_psum", "gpsimd_psum", "tt_both_psum", "act_hbm"])
def test_engine_memory_rules(case):
    def kernel(x):
        ps = nl.ndarray((128, 64), dtype=F32, buffer=nl.psum)
        ps2 = nl.ndarray((128, 64), dtype=F32, buffer=nl.psum)
        sb = _sb((128, 64))
        if case == "dma_psum":
            nisa.dma_copy(dst=ps, src=x)  # <-mem-dma_psum
        elif case == "matmul_in_psum":
            nisa.memset(dst=ps, value=0.0)
            nisa.nc_matmul(dst=ps2, stationary=sb, moving=ps)  # <-mem-matmul_in_psum
        elif case == "gpsimd_psum":
            nisa.memset(dst=ps, value=0.0, engine=nisa.engine.gpsimd)  # <-mem-gpsimd_psum
        elif case == "tt_both_psum":
            nisa.memset(dst=ps, value=0.0)
            nisa.memset(dst=ps2, value=0.0)
            nisa.tensor_tensor(dst=sb, data1=ps, data2=ps2, op=nl.add)  # <-mem-tt_both_psum
        else:
            nisa.activation(dst=sb, op=nl.exp, data=x)  # <-mem-act_hbm

    expect(sim.EngineMemoryError, f"<-mem-{case}", kernel, torch.zeros(128, 64))


def test_out_of_bounds_slice_and_ap_are_simerrors_not_indexerror():
    def slice_kernel():
        t = _sb((128, 64))
        return t[:, 60:70]  # <-oob-slice

    def ap_kernel(x):
        sb = nl.ndarray((128, 64), dtype=F32, buffer=nl.sbuf)
        nisa.dma_copy(dst=sb, src=x.ap(pattern=[[64, 128], [1, 64]], offset=64))  # <-oob-ap

    expect(sim.OutOfBoundsError, "<-oob-slice", slice_kernel)
    expect(sim.OutOfBoundsError, "<-oob-ap", ap_kernel, torch.zeros(128, 64))


def test_elementwise_and_dma_element_counts():
    def tt_kernel():
        a, b = _sb((128, 64)), _sb((128, 32))
        nisa.tensor_tensor(dst=a, data1=a, data2=b, op=nl.add)  # <-shape-tt

    def dma_kernel(x):
        sb = nl.ndarray((128, 32), dtype=F32, buffer=nl.sbuf)
        nisa.dma_copy(dst=sb, src=x)  # <-shape-dma

    expect(sim.ShapeMismatchError, "<-shape-tt", tt_kernel)
    expect(sim.ShapeMismatchError, "<-shape-dma", dma_kernel, torch.zeros(128, 64))


def test_sbuf_capacity_uses_interval_liveness():
    def too_much():
        a = nl.ndarray((128, 30000), dtype=F32, buffer=nl.sbuf)  # 120 KB per partition
        b = nl.ndarray((128, 30000), dtype=F32, buffer=nl.sbuf)
        nisa.memset(dst=a, value=0.0)
        nisa.memset(dst=b, value=0.0)  # <-cap-sbuf: from here both are live
        nisa.tensor_tensor(dst=a, data1=a, data2=b, op=nl.add)

    def rebinding_is_fine():
        for _ in range(3):
            t = _sb((128, 30000))
            nisa.tensor_tensor(dst=t, data1=t, data2=t, op=nl.add)

    msg = expect(sim.CapacityError, "<-cap-sbuf", too_much)
    assert "240000" in msg and "212984" in msg and "allocated at" in msg
    result = sim.run(rebinding_is_fine)
    assert result.stats["cores"][0]["sbuf_peak_bytes"] == 120000
    # trn1 budget is smaller: 180,224 B
    with pytest.raises(sim.CapacityError):
        sim.run(too_much, target="trn1")


def test_psum_capacity_eight_banks():
    def kernel():
        tiles = [nl.ndarray((128, 512), dtype=F32, buffer=nl.psum) for _ in range(9)]
        for t in tiles:
            nisa.memset(dst=t, value=0.0)  # <-cap-psum
        for t in tiles:
            nisa.memset(dst=t, value=1.0)

    assert "banks" in expect(sim.CapacityError, "<-cap-psum", kernel)


def test_uninitialized_read_errors_or_warns():
    def kernel():
        a = nl.ndarray((128, 8), dtype=F32, buffer=nl.sbuf)
        b = _sb((128, 8))
        nisa.memset(dst=a[:, 0:4], value=1.0)
        nisa.tensor_copy(dst=b, src=a)  # <-uninit
        out = nl.ndarray((128, 8), dtype=F32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=b)
        return out

    assert "512 of 1024" in expect(sim.UninitializedReadError, "<-uninit", kernel)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = sim.run(kernel, strict=False).outputs
    assert any(issubclass(w.category, sim.UninitializedReadWarning) for w in caught)
    assert torch.isnan(out[:, 4:]).all() and (out[:, :4] == 1).all()


def test_accumulate_true_needs_matmul_data():
    def kernel():
        ps = nl.ndarray((64, 64), dtype=F32, buffer=nl.psum)
        nisa.memset(dst=ps, value=0.0)
        nisa.nc_matmul(dst=ps, stationary=_sb((32, 64)), moving=_sb((32, 64)), accumulate=True)  # <-acc

    expect(sim.AccumulateError, "<-acc", kernel)


def test_dtype_rules():
    def hwdge_kernel(x):
        sb = nl.ndarray((128, 8), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(dst=sb, src=x, dge_mode=nisa.dge_mode.hwdge)  # <-dtype-hwdge

    def mixed_matmul():
        ps = nl.ndarray((64, 64), dtype=F32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=_sb((32, 64)), moving=_sb((32, 64), nl.bfloat16))  # <-dtype-mm

    def integer_matmul():  # ISA nc_matmul's input formats are fp8, bf16, fp16, tf32 and fp32 only
        ps = nl.ndarray((64, 64), dtype=F32, buffer=nl.psum)
        ints = _sb((32, 64), nl.int32)
        nisa.nc_matmul(dst=ps, stationary=ints, moving=ints)  # <-dtype-int

    expect(sim.DtypeError, "<-dtype-hwdge", hwdge_kernel, torch.zeros(128, 8))
    expect(sim.DtypeError, "<-dtype-mm", mixed_matmul)
    assert "stationary dtype torch.int32" in expect(sim.DtypeError, "<-dtype-int", integer_matmul)


def test_dma_mode_arguments():
    def kernel(x):
        sb = nl.ndarray((128, 8), dtype=F32, buffer=nl.sbuf)
        nisa.dma_copy(dst=sb, src=x, dge_mode=nisa.dge_mode.hwdge, engine=nisa.engine.scalar)  # <-hwdge

    def engine_without_hwdge(x):
        sb = nl.ndarray((128, 8), dtype=F32, buffer=nl.sbuf)
        nisa.dma_copy(dst=sb, src=x, engine=nisa.engine.sync)  # <-engine

    x = torch.zeros(128, 8)
    sim.run(kernel, x, target="trn2")
    assert "trn1" in expect(sim.InvalidArgumentError, "<-hwdge", kernel, x, target="trn1")
    expect(sim.InvalidArgumentError, "<-engine", engine_without_hwdge, x)


def test_barrier_mismatch_fails_instead_of_hanging():
    def kernel(x):
        if nl.program_id(0) == 0:
            nisa.core_barrier(data=x, cores=(0, 1))  # <-barrier

    expect(sim.BarrierError, "<-barrier", kernel, torch.zeros(4, 4), grid=2)


def test_error_in_one_instance_does_not_hang_the_other():
    def kernel(x):
        if nl.program_id(0) == 1:
            nl.ndarray((300, 1), dtype=F32, buffer=nl.sbuf)  # <-core1
        nisa.core_barrier(data=x, cores=(0, 1))

    expect(sim.PartitionError, "<-core1", kernel, torch.zeros(4, 4), grid=2)


def test_plain_python_outside_a_launch_is_a_simerror():
    with pytest.raises(sim.SimError):
        nl.ndarray((4, 4), dtype=F32, buffer=nl.sbuf)


def test_trn1_activation_bias_must_be_a_vector():
    def kernel():
        t = _sb((128, 8))
        nisa.activation(dst=t, op=nl.exp, data=t, bias=1.0)  # <-bias

    sim.run(kernel, target="trn2")
    expect(sim.InvalidArgumentError, "<-bias", kernel, target="trn1")


def test_unmodelled_features_are_reported_not_ignored():
    def kernel(x):
        sb = nl.ndarray((4, 8), dtype=F32, buffer=nl.sbuf)
        idx = _sb((4, 1), nl.int32)
        nisa.dma_copy(dst=sb, src=x.ap(pattern=[[8, 4], [1, 8]], vector_offset=idx))  # <-indirect

    expect(sim.UnsupportedError, "<-indirect", kernel, torch.zeros(4, 8))
