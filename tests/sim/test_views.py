"""Property tests: views and `.ap` address storage exactly like torch.as_strided."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fusegen.sim as sim
from fusegen.sim.memory import Alloc, MemoryRegion
from fusegen.sim.pool import StoragePool
from fusegen.sim.tensor import NkiTensor

with sim.installed():
    import nki.isa as nisa
    import nki.language as nl


def _copy_out(view_fn, shape, data):
    """Run a kernel that copies a view of an SBUF tile holding `data` into shared HBM."""

    def kernel(x):
        sb = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=sb, src=x)
        view = view_fn(sb)
        out = nl.ndarray(view.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=view)
        return out

    return sim.run(kernel, data).outputs


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 16), st.integers(1, 12), st.data())
def test_slices_match_torch(p, f, data):
    x = torch.arange(p * f, dtype=torch.float32).reshape(p, f)
    p0 = data.draw(st.integers(0, p - 1))
    p1 = data.draw(st.integers(p0 + 1, p))
    f0 = data.draw(st.integers(0, f - 1))
    f1 = data.draw(st.integers(f0 + 1, f))
    step = data.draw(st.integers(1, 3))
    out = _copy_out(lambda t: t[p0:p1, f0:f1:step], (p, f), x)
    assert torch.equal(out, x[p0:p1, f0:f1:step])


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 8), st.integers(1, 6), st.integers(1, 6), st.data())
def test_ap_patterns_match_as_strided(p, a, b, data):
    f = a * b + 4
    x = torch.randn(p, f)
    sa = data.draw(st.integers(0, 2))
    sb = data.draw(st.integers(0, 1))
    span = (a - 1) * sa + (b - 1) * sb
    if span >= f:
        return
    off = data.draw(st.integers(0, f - 1 - span))
    pattern = [[f, p], [sa, a], [sb, b]]
    out = _copy_out(lambda t: t.ap(pattern=pattern, offset=off), (p, f), x)
    assert torch.equal(out, torch.as_strided(x, (p, a, b), (f, sa, sb), off))


def test_ap_past_the_partition_row_is_out_of_bounds():
    x = torch.randn(4, 8)
    with pytest.raises(sim.OutOfBoundsError, match="partition row"):
        _copy_out(lambda t: t.ap(pattern=[[8, 3], [1, 8]], offset=1), (4, 8), x)
    with pytest.raises(sim.OutOfBoundsError, match="outside"):
        _copy_out(lambda t: t.ap(pattern=[[8, 4], [1, 8]], offset=1), (4, 8), x)


def test_numpy_ints_index_and_float_bounds_are_rejected():
    x = torch.arange(32, dtype=torch.float32).reshape(4, 8)
    out = _copy_out(lambda t: t[np.int64(2), np.int32(1) : np.int64(4)], (4, 8), x)
    assert torch.equal(out, x[2:3, 1:4])
    with pytest.raises(sim.UnsupportedError, match="integer bounds"):
        _copy_out(lambda t: t[0:2, 0:2.5], (4, 8), x)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 8), st.data())
def test_within_agrees_with_the_element_sets(p, f, data):
    """NkiTensor.within (the written-check shortcut) never claims containment that is not there."""

    def block(t):
        r0 = data.draw(st.integers(0, p - 1))
        c0 = data.draw(st.integers(0, f - 1))
        return t[r0 : data.draw(st.integers(r0 + 1, p)), c0 : data.draw(st.integers(c0 + 1, f))]

    def elements(v):
        return set(torch.as_strided(torch.arange(p * f), v.shape, v.strides, v.offset).reshape(-1).tolist())

    whole = NkiTensor.whole(Alloc((p, f), torch.float32, MemoryRegion.sbuf, "", ("", 0), StoragePool()))
    big, small = block(whole), block(whole)
    assert small.within(big.key) == (elements(small) <= elements(big))
