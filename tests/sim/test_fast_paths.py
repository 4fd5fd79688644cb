"""The interpreter's per-instruction shortcuts keep every check: remembered ndarray requests and matmul
layouts (a request that differs in one checked part is checked again and fails), and the written masks
and PSUM matmul flags that are set only when a check reads them (docs/sim.md, Performance)."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

import fusegen.sim as sim
from fusegen.sim.targets import TARGETS
from fusegen.sim.trace import Record

from .conftest import assert_located

with sim.installed():
    import nki.isa as nisa
    import nki.language as nl

F32, BF16 = nl.float32, nl.bfloat16


def expect(error, marker, kernel, *args, **kwargs):
    """Run; the error class, located at this file's line carrying `marker`; returns the message."""
    with pytest.raises(error) as info:
        sim.run(kernel, *args, **kwargs)
    assert_located(info.value, __file__, marker)
    return str(info.value)


def big_tile(dtype):
    """[128, 50000]: 200,000 B per partition in fp32 (fits trn2's 212,984, not trn1's 180,224)."""
    nl.ndarray((128, 50_000), dtype=dtype, buffer=nl.sbuf)  # <-big


def test_remembered_ndarray_request_is_checked_again_on_another_target():
    sim.run(big_tile, F32, target="trn2")
    sim.run(big_tile, F32, target="trn2")  # remembered: passes again
    assert "trn1" in expect(sim.CapacityError, "<-big", lambda: big_tile(F32), target="trn1")


def test_remembered_ndarray_request_is_checked_again_on_a_same_named_target_with_other_limits(monkeypatch):
    sim.run(big_tile, F32, target="trn2")  # remembered for trn2's limits
    small = dataclasses.replace(TARGETS["trn2"], sbuf_usable_bytes=180_224)  # a "trn2" with trn1's budget
    monkeypatch.setitem(TARGETS, "trn2", small)
    assert "180224" in expect(sim.CapacityError, "<-big", lambda: big_tile(F32), target="trn2")


def test_remembered_matmul_layout_is_checked_again_on_a_same_named_target_with_other_limits(monkeypatch):
    def kernel():
        ps = nl.ndarray((64, 64), dtype=F32, buffer=nl.psum)
        st = nl.ndarray((32, 64), dtype=F32, buffer=nl.sbuf)
        nisa.memset(dst=st, value=1.0)
        mv = nl.ndarray((32, 64), dtype=F32, buffer=nl.sbuf)
        nisa.memset(dst=mv, value=1.0)
        nisa.nc_matmul(dst=ps, stationary=st, moving=mv)  # <-limits

    sim.run(kernel, target="trn2")  # remembered for trn2's limits
    monkeypatch.setitem(TARGETS, "trn2", dataclasses.replace(TARGETS["trn2"], matmul_n_max=32))
    assert "moving free size 64 > 32" in expect(sim.MatmulShapeError, "<-limits", kernel, target="trn2")


def test_remembered_ndarray_request_is_checked_again_for_another_dtype():
    def tile(dtype):
        nl.ndarray((128, 60_000), dtype=dtype, buffer=nl.sbuf)  # <-dtype

    sim.run(tile, BF16)  # 120,000 B per partition
    sim.run(tile, "bfloat16")
    assert "240000 bytes" in expect(sim.CapacityError, "<-dtype", tile, F32)


def test_psum_address_is_checked_every_time():
    def tile(address):
        nl.ndarray((128, 512), dtype=F32, buffer=nl.psum, address=address)  # <-address

    sim.run(tile, None)
    sim.run(tile, (0, 0))
    expect(sim.InvalidArgumentError, "<-address", tile, (0, 100))


def test_list_shapes_are_accepted_and_bad_ones_rejected():
    def tile(shape):
        t = nl.ndarray(shape, dtype=F32, buffer=nl.sbuf)  # <-shape
        return t.shape

    assert sim.run(lambda: tile([128, 4])).outputs == (128, 4)
    expect(sim.PartitionError, "<-shape", lambda: tile([256, 4]))  # a list kernel argument breaks a rule
    expect(sim.InvalidArgumentError, "<-shape", tile, 128)


def test_remembered_matmul_layout_is_checked_again_in_another_memory():
    def kernel(memory):
        ps = nl.ndarray((64, 64), dtype=F32, buffer=nl.psum)
        st = nl.ndarray((32, 64), dtype=F32, buffer=memory)
        nisa.memset(dst=st, value=1.0)
        mv = nl.ndarray((32, 64), dtype=F32, buffer=nl.sbuf)
        nisa.memset(dst=mv, value=1.0)
        nisa.nc_matmul(dst=ps, stationary=st, moving=mv)  # <-memory

    sim.run(kernel, nl.sbuf)
    sim.run(kernel, nl.sbuf)
    assert "stationary in psum" in expect(sim.EngineMemoryError, "<-memory", kernel, nl.psum)


def partial_writes():
    """Two column blocks of a tile written, then a read spanning them and the gap between."""
    a = nl.ndarray((128, 8), dtype=F32, buffer=nl.sbuf)
    nisa.memset(dst=a[:, 0:2], value=1.0)
    nisa.memset(dst=a[:, 4:6], value=2.0)
    b = nl.ndarray((128, 6), dtype=F32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=b, src=a[:, 0:6])  # <-gap
    out = nl.ndarray((128, 6), dtype=F32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=b)
    return out


def test_blocks_written_separately_count_exactly_in_the_uninitialized_check():
    assert "reads 256 of 768 never-written" in expect(sim.UninitializedReadError, "<-gap", partial_writes)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        out = sim.run(partial_writes, strict=False).outputs
    assert (out[:, 0:2] == 1).all() and (out[:, 4:6] == 2).all() and torch.isnan(out[:, 2:4]).all()


def test_blocks_written_separately_cover_a_read_of_both():
    def kernel():
        a = nl.ndarray((128, 8), dtype=F32, buffer=nl.sbuf)
        nisa.memset(dst=a[:, 0:4], value=3.0)
        nisa.memset(dst=a[:, 4:8], value=4.0)
        out = nl.ndarray((128, 8), dtype=F32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=a)
        return out

    out = sim.run(kernel).outputs
    assert (out[:, :4] == 3).all() and (out[:, 4:] == 4).all()


def accumulate_onto(first_cols, overwrite_cols):
    """Matmul into PSUM columns [0, first_cols), optionally overwrite some with a copy, then accumulate
    into columns [0, 64)."""
    x = nl.ndarray((32, 64), dtype=F32, buffer=nl.sbuf)
    nisa.memset(dst=x, value=1.0)
    ps = nl.ndarray((64, 64), dtype=F32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps[:, 0:first_cols], stationary=x, moving=x[:, 0:first_cols])
    if first_cols < 64:
        nisa.nc_matmul(dst=ps[:, first_cols:64], stationary=x, moving=x[:, first_cols:64])
    if overwrite_cols:
        nisa.memset(dst=ps[:, 0:overwrite_cols], value=0.0)
    nisa.nc_matmul(dst=ps, stationary=x, moving=x, accumulate=True)  # <-flags
    out = nl.ndarray((64, 64), dtype=F32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=out, src=ps)
    hbm = nl.ndarray((64, 64), dtype=F32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=hbm, src=out)
    return hbm


@pytest.mark.parametrize("first_cols", [64, 16])
def test_matmul_flags_of_separate_views_allow_accumulating_over_both(first_cols):
    out = sim.run(accumulate_onto, first_cols, 0).outputs
    assert torch.equal(out, torch.full((64, 64), 64.0))  # two products of 32 ones each


def test_non_matmul_write_clears_flags_it_covers_only():
    msg = expect(sim.AccumulateError, "<-flags", accumulate_onto, 16, 8)
    assert "onto 512 PSUM elements" in msg  # the memset's [64, 8] columns, not the rest


def test_trace_rows_become_the_records_with_absolute_psum_banks():
    """Instructions append plain rows; the launch's Trace builds Records from them when first read, with
    each matmul's PSUM bank counted from the start of PSUM (its tile's banks are assigned at the end)."""

    def kernel():
        first = nl.ndarray((128, 1024), dtype=F32, buffer=nl.psum)  # two banks
        second = nl.ndarray((128, 512), dtype=F32, buffer=nl.psum)
        st = nl.ndarray((128, 128), dtype=F32, buffer=nl.sbuf)
        nisa.memset(dst=st, value=1.0)
        mv = nl.ndarray((128, 512), dtype=F32, buffer=nl.sbuf)
        nisa.memset(dst=mv, value=1.0)
        nisa.nc_matmul(dst=first[0:128, 512:1024], stationary=st, moving=mv)
        nisa.nc_matmul(dst=second, stationary=st, moving=mv)
        sb = nl.ndarray((128, 512), dtype=F32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=sb, src=first[0:128, 512:1024])  # first stays live: second gets other banks

    trace = sim.run(kernel).trace
    assert len(trace) == 5 and not trace._built  # counted from the rows: no Records built yet
    records = trace.records
    assert all(isinstance(r, Record) for r in records) and trace.records is records  # built once
    banks = [r.psum_bank for r in records if r.op == "nc_matmul"]
    assert banks == [1, 2]  # bank 1 of the first tile's two; the second tile's first bank after them
    assert [r.op for r in records] == ["memset", "memset", "nc_matmul", "nc_matmul", "tensor_copy"]
