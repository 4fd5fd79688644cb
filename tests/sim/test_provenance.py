"""Deferred GEMMs that read SBUF copies of caller inputs straight from the input's fp32 copy (DMA
provenance) give what the SBUF tiles hold: after the input or the tile is written, and across cores."""

from __future__ import annotations

import threading

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
    original, made = provenance.InputF32.view, provenance.InputF32.made

    def view(self: provenance.InputF32, key: tuple) -> torch.Tensor:
        seen.append(key[0])
        return original(self, key)

    def made_view(self: provenance.InputF32, key: tuple) -> torch.Tensor | None:
        found = made(self, key)  # viewed on the turn once the copy exists; else view() is called later
        if found is not None:
            seen.append(key[0])
        return found

    monkeypatch.setattr(provenance.InputF32, "view", view)
    monkeypatch.setattr(provenance.InputF32, "made", made_view)
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


@pytest.fixture
def band_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[provenance.Tiling, int]]:
    """(tiling, band) of every re-laid band an input converts (each at most once per launch)."""
    made: list[tuple[provenance.Tiling, int]] = []
    seen: set[int] = set()  # the converted copies (instances ask for a band at the same time)
    lock = threading.Lock()
    original = provenance.InputCopies.band

    def band(self: provenance.InputCopies, tiling: provenance.Tiling, index: int) -> torch.Tensor:
        laid = original(self, tiling, index)
        with lock:
            if laid.data_ptr() not in seen:
                seen.add(laid.data_ptr())
                made.append((tiling, index))
        return laid

    monkeypatch.setattr(provenance.InputCopies, "band", band)
    return made


def _laid_out(w: torch.Tensor) -> torch.Tensor:
    """w [K, H * 128] -> [H, 128, ceil(K/128) * 128]: out[h, p, kt * 128 + c] = w[kt * 128 + p, h * 128 + c],
    zero-padded (the generated FFN's up-weight host layout), written out with loops."""
    k, width = w.shape
    n_k = -(-k // 128)
    out = torch.zeros(width // 128, 128, n_k * 128, dtype=w.dtype)
    for h in range(width // 128):
        for kt in range(n_k):
            rows = w[kt * 128 : kt * 128 + 128, h * 128 : h * 128 + 128]
            out[h, : rows.shape[0], kt * 128 : kt * 128 + 128] = rows
    return out


def _band_product(wl_hbm, x_hbm, h, order, m):
    """SBUF [m, n] = w[:, h * 128 : h * 128 + m].T @ x from one DMA of I-tile h's K-tiles side by side
    (kt in `order`; the last K-tile's rows cut at x's row count) and x's rows, in one PSUM group (m <
    a quarter of the row: wider column ranges are stacked as whole rows, one group per column offset)."""
    k, n = x_hbm.shape
    t = nl.ndarray((128, wl_hbm.shape[2]), dtype=wl_hbm.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=wl_hbm[h, 0:128, 0 : wl_hbm.shape[2]])
    ps = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.psum)
    for i, kt in enumerate(order):
        pk = min(128, k - kt * 128)
        x = nl.ndarray((128, n), dtype=x_hbm.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x[0:pk, 0:n], src=x_hbm[kt * 128 : kt * 128 + pk, 0:n])
        w = t[0:pk, kt * 128 : kt * 128 + m]
        nisa.nc_matmul(dst=ps, stationary=w, moving=x[0:pk, 0:n], accumulate=i > 0)
    sb = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=sb, src=ps)
    return sb


def _band_inputs(k: int = 320) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(2)
    return torch.randn(k, 256).bfloat16(), torch.randn(k, 64).bfloat16()


@pytest.mark.parametrize("k", [384, 320])  # 320: the last K-tile has 64 rows
def test_k_tiles_side_by_side_are_read_from_one_re_laid_band(band_reads, k):
    """The [I/128, 128, K] layout: a K-stacked block of I-tile 1 is read from that band of the input
    re-laid as stacked K-tiles, converted once; the product is w's columns times x."""
    w, x = _band_inputs(k)

    @nki.jit
    def kernel(wl_hbm, x_hbm):
        return _out(_band_product(wl_hbm, x_hbm, 1, range(-(-k // 128)), 64))

    got = kernel(_laid_out(w), x)
    torch.testing.assert_close(got, w[:, 128:192].float().t() @ x.float(), rtol=1e-5, atol=1e-4)
    assert band_reads == [((3 * 128, 128, 128), 1)]  # row stride K padded, 128-row bands, 128-wide tiles


def test_k_tiles_out_of_order_are_stacked(band_reads):
    """The K-tiles read in another order than they lie: no constant step, so the GEMM stacks them."""
    w, x = _band_inputs()

    @nki.jit
    def kernel(wl_hbm, x_hbm):
        return _out(_band_product(wl_hbm, x_hbm, 0, (2, 0, 1), 64))

    wf, xf = w.float(), x.float()
    order = (slice(256, 320), slice(0, 128), slice(128, 256))
    expected = sum(wf[rows, 0:64].t() @ xf[rows] for rows in order)
    torch.testing.assert_close(kernel(_laid_out(w), x), expected, rtol=1e-5, atol=1e-4)
    assert band_reads == []


def test_an_input_written_before_its_dma_is_not_read_from_a_band(band_reads):
    """The kernel zeroes K-tile 1 of I-tile 0 in HBM, then loads the I-tile: the tile holds the written
    values, so its blocks are stacked, not read from the caller's (unwritten) storage."""
    w, x = _band_inputs()

    @nki.jit
    def kernel(wl_hbm, x_hbm):
        zero = nl.ndarray((128, 128), dtype=wl_hbm.dtype, buffer=nl.sbuf)
        nisa.memset(dst=zero, value=0.0)
        nisa.dma_copy(dst=wl_hbm[0, 0:128, 128:256], src=zero)
        return _out(_band_product(wl_hbm, x_hbm, 0, range(3), 64))

    wf, xf = w.float(), x.float()
    expected = wf[0:128, 0:64].t() @ xf[0:128] + wf[256:320, 0:64].t() @ xf[256:320]
    torch.testing.assert_close(kernel(_laid_out(w), x), expected, rtol=1e-5, atol=1e-4)
    assert band_reads == []


def test_both_cores_read_one_band(band_reads):
    """LNC=2: both instances load I-tile 1; the band is converted once and read by both."""
    w, x = _band_inputs()

    @nki.jit
    def kernel(wl_hbm, x_hbm):
        pid = nl.program_id(0)
        part = _band_product(wl_hbm, x_hbm, 1, range(3), 64)
        out = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out[0:64, pid * 64 : pid * 64 + 64], src=part)
        return out

    got = kernel[2](_laid_out(w), x)
    expected = w[:, 128:192].float().t() @ x.float()
    torch.testing.assert_close(got, torch.cat([expected, expected], 1), rtol=1e-5, atol=1e-4)
    assert len(band_reads) == 1


def test_operands_inside_a_partly_loaded_tile_are_read_from_the_input(direct_reads):
    """A DMA fills columns [0, 192) of [128, 256] tiles (a narrower last chunk); the matmuls read
    columns [64, 192): the operands lie inside what the DMA brought, so no stacking."""
    w, x = _inputs()

    @nki.jit
    def kernel(w_hbm, x_hbm):
        ps = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.psum)
        xs = _tiles(x_hbm, (0, 128, 256))
        for k, r in enumerate((0, 128, 256)):
            t = nl.ndarray((128, 256), dtype=w_hbm.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t[0:128, 0:192], src=w_hbm[r : r + 128, 0:192])
            nisa.nc_matmul(dst=ps, stationary=t[0:128, 64:192], moving=xs[k][0:128, 0:64], accumulate=k > 0)
        sb = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=sb, src=ps)
        return _out(sb)

    w = torch.randn(384, 192).bfloat16()
    torch.testing.assert_close(kernel(w, x), w[:, 64:192].float().t() @ x.float(), rtol=1e-5, atol=1e-4)
    assert direct_reads == [(384, 128), (384, 64)]
