"""Deferred GEMMs that read SBUF copies of caller inputs straight from the input's fp32 copy (DMA
provenance) give what the SBUF tiles hold: after the input or the tile is written, and across cores."""

from __future__ import annotations

import pytest
import torch

import fusegen.sim as sim
from fusegen.sim import provenance

with sim.installed():
    import nki
    import nki.isa as nisa
    import nki.language as nl


@pytest.fixture
def direct_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """Shapes of the operand blocks GEMMs read from inputs' fp32 copies."""
    seen: list[tuple[int, ...]] = []
    original = provenance.InputF32.view

    def view(self: provenance.InputF32, key: tuple) -> torch.Tensor:
        seen.append(key[0])
        return original(self, key)

    monkeypatch.setattr(provenance.InputF32, "view", view)
    return seen


def _tiles(w_hbm, rows):
    """SBUF copies of w's row blocks [r, r + 128) for r in rows."""
    out = []
    for r in rows:
        t = nl.ndarray((128, w_hbm.shape[1]), dtype=w_hbm.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=w_hbm[r : r + 128, 0 : w_hbm.shape[1]])
        out.append(t)
    return out


def _product(w_tiles, x_tiles, m, n):
    """SBUF [m, n] = sum over tiles of w_tile[:, :m].T @ x_tile[:, :n], accumulated in one PSUM tile."""
    ps = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.psum)
    for k, (w, x) in enumerate(zip(w_tiles, x_tiles, strict=True)):
        nisa.nc_matmul(dst=ps, stationary=w[0:128, 0:m], moving=x[0:128, 0:n], accumulate=k > 0)
    sb = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=sb, src=ps)
    return sb


def _out(sb):
    """A shared_hbm copy of an SBUF tile."""
    out = nl.ndarray(sb.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=sb)
    return out


def _inputs(rows: int = 384) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randn(rows, 128).bfloat16(), torch.randn(rows, 64).bfloat16()


def test_consecutive_input_rows_are_read_from_the_inputs_fp32_copy(direct_reads):
    w, x = _inputs()

    @nki.jit
    def kernel(w_hbm, x_hbm):
        return _out(_product(_tiles(w_hbm, (0, 128, 256)), _tiles(x_hbm, (0, 128, 256)), 128, 64))

    torch.testing.assert_close(kernel(w, x), w.float().t() @ x.float(), rtol=1e-5, atol=1e-4)
    assert direct_reads == [(384, 128), (384, 64)]  # both sides: one strided view each, no stacking


def test_a_broken_run_is_stacked(direct_reads):
    """Rows out of order: the GEMM stacks what the tiles hold."""
    w, x = _inputs()

    @nki.jit
    def kernel(w_hbm, x_hbm):
        return _out(_product(_tiles(w_hbm, (256, 0, 128)), _tiles(x_hbm, (256, 0, 128)), 128, 64))

    torch.testing.assert_close(kernel(w, x), w.float().t() @ x.float(), rtol=1e-5, atol=1e-4)
    assert direct_reads == []


def test_a_tile_written_after_its_dma_is_stacked(direct_reads):
    """Consecutive rows, but the middle tile is scaled after its DMA: the GEMM reads what it holds."""
    w, x = _inputs()

    @nki.jit
    def kernel(w_hbm, x_hbm):
        ws = _tiles(w_hbm, (0, 128, 256))
        nisa.tensor_scalar(dst=ws[1], data=ws[1], op0=nl.multiply, operand0=2.0)
        return _out(_product(ws, _tiles(x_hbm, (0, 128, 256)), 128, 64))

    wf, xf = w.float(), x.float()
    torch.testing.assert_close(
        kernel(w, x), wf.t() @ xf + wf[128:256].t() @ xf[128:256], rtol=1e-5, atol=1e-4
    )
    assert direct_reads == [(384, 64)]  # x only


def test_an_input_written_after_its_dma_keeps_the_tiles_values(direct_reads):
    """The kernel overwrites the input in HBM after loading it: the loaded tiles keep the old values
    (the input's fp32 copy is of the caller's storage, which a launch never writes); tiles loaded after
    the write hold the new values and are stacked."""
    w, x = _inputs()

    @nki.jit
    def kernel(w_hbm, x_hbm):
        before = _tiles(w_hbm, (0, 128, 256))
        zero = nl.ndarray((128, 128), dtype=w_hbm.dtype, buffer=nl.sbuf)
        nisa.memset(dst=zero, value=0.0)
        nisa.dma_copy(dst=w_hbm[128:256, 0:128], src=zero)
        after = _tiles(w_hbm, (0, 128, 256))
        xs = _tiles(x_hbm, (0, 128, 256))
        return _out(_product(before, xs, 128, 64)), _out(_product(after, xs, 128, 64))

    w_in = w.clone()
    old, new = kernel(w_in, x)
    wf, xf = w.float(), x.float()
    torch.testing.assert_close(old, wf.t() @ xf, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(new, wf.t() @ xf - wf[128:256].t() @ xf[128:256], rtol=1e-5, atol=1e-4)
    assert torch.equal(w_in[128:256], torch.zeros(128, 128, dtype=torch.bfloat16))  # written back
    assert direct_reads.count((384, 128)) == 1  # only the tiles loaded before the write


def test_both_cores_read_one_input(direct_reads):
    """LNC=2: both instances load the same weight rows; each computes its own half of x's columns."""
    w, _ = _inputs()
    x = torch.randn(384, 128).bfloat16()

    @nki.jit
    def kernel(w_hbm, x_hbm):
        pid = nl.program_id(0)
        xs = []
        for r in (0, 128, 256):
            t = nl.ndarray((128, 64), dtype=x_hbm.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=x_hbm[r : r + 128, pid * 64 : pid * 64 + 64])
            xs.append(t)
        part = _product(_tiles(w_hbm, (0, 128, 256)), xs, 128, 64)
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out[0:128, pid * 64 : pid * 64 + 64], src=part)
        return out

    torch.testing.assert_close(kernel[2](w, x), w.float().t() @ x.float(), rtol=1e-5, atol=1e-4)
    assert direct_reads.count((384, 128)) == 2


def test_a_three_d_operand_filled_by_dmas_multiplies_as_its_elements() -> None:
    """A [128, 2, 64] tile filled by two DMAs of an input, used whole as the moving operand: provenance
    knows only 2-D views, so the GEMM reads the tile itself (a 3-D view once crashed the lookup)."""

    @nki.jit
    def kernel(w_hbm, x_hbm):
        w = nl.ndarray((128, 128), dtype=w_hbm.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=w, src=w_hbm[0:128, 0:128])
        x = nl.ndarray((128, 2, 64), dtype=x_hbm.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x[0:128, 0, 0:64], src=x_hbm[0:128, 0:64])
        nisa.dma_copy(dst=x[0:128, 1, 0:64], src=x_hbm[0:128, 64:128])
        ps = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=w, moving=x, accumulate=False)
        sb = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=sb, src=ps)
        return _out(sb)

    torch.manual_seed(1)
    w, x = torch.randn(128, 128).bfloat16(), torch.randn(128, 128).bfloat16()
    got = kernel(w, x).reshape(128, 128)
    torch.testing.assert_close(got, w.float().t() @ x.float())  # fp32 tolerances: summation order
