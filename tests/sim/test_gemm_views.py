"""Deferred GEMMs' operand views made on the instance's turn (fp32 input copies and bands converted by an
earlier GEMM; cached views of the stacks) give exactly what the views made off the turn give, and band
runs are only extended where a re-laid band can be read (docs/sim.md, Performance)."""

from __future__ import annotations

import pytest
import torch

import fusegen.sim as sim
from fusegen.sim import deferred, provenance

with sim.installed():
    import nki
    import nki.isa as nisa
    import nki.language as nl


def _load(src, rows, cols, dtype):
    """An SBUF [128, cols] tile with src's block [rows, cols] DMA'd into its first rows."""
    t = nl.ndarray((128, cols), dtype=dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[0 : rows.stop - rows.start, 0:cols], src=src[rows, 0:cols])
    return t


_GROUPS = 9


def _shape(g: int) -> tuple[int, int, int]:
    """Group g's I-tile of the band, stationary width m and moving column offset q."""
    m = (64 - 16 * (g % 3)) if g < 3 else 128 - 32 * (g % 3)  # a band run needs m < a quarter of its row
    return g % 2, m, (g % 2) * 64


@nki.jit
def _kernel(w_hbm, wl_hbm, x_hbm):
    """Groups of several shapes and column offsets, each read into an fp32 output (each core computes
    all): K-tiles of wl side by side (band runs), rows of w (a row run), and tiles computed from w's rows
    (stacked); x's tiles are stacked. Later groups find bands and rows converted by earlier ones."""
    k, n = x_hbm.shape
    xs = [_load(x_hbm, slice(kt * 128, kt * 128 + 128), n, x_hbm.dtype) for kt in range(k // 128)]
    rows = [_load(w_hbm, slice(kt * 128, kt * 128 + 128), 128, w_hbm.dtype) for kt in range(k // 128)]
    computed = []
    for kt in range(k // 128):  # no DMA provenance: stacked
        t = nl.ndarray((128, 128), dtype=w_hbm.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=t, src=rows[kt])
        computed.append(t)
    pid = nl.program_id(0)
    out = nl.ndarray((nl.num_programs(), _GROUPS, 128, n), dtype=nl.float32, buffer=nl.shared_hbm)
    for g in range(_GROUPS):
        h, m, q = _shape(g)
        band = nl.ndarray((128, wl_hbm.shape[2]), dtype=wl_hbm.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=band, src=wl_hbm[h, 0:128, 0 : wl_hbm.shape[2]])
        ps = nl.ndarray((128, n), dtype=nl.float32, buffer=nl.psum)
        tiles = rows if g < 6 else computed
        for kt in range(k // 128):
            st = band[0:128, kt * 128 : kt * 128 + m] if g < 3 else tiles[kt][0:128, 0:m]
            mv = xs[kt][0:128, q:n]
            nisa.nc_matmul(dst=ps[0:m, 0 : n - q], stationary=st, moving=mv, accumulate=kt > 0)
        sb = nl.ndarray((128, n), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=sb, value=0.0)
        nisa.tensor_copy(dst=sb[0:m, 0 : n - q], src=ps[0:m, 0 : n - q])
        nisa.dma_copy(dst=out[pid, g, 0:128, 0:n], src=sb)
    return out


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [K, 128], w laid out as two I-tiles' K-tiles side by side, x [K, 192] (K = 384), bf16."""
    torch.manual_seed(3)
    k = 384
    w, wide, x = torch.randn(k, 128), torch.randn(k, 256), torch.randn(k, 192)
    laid = wide.reshape(k // 128, 128, 2, 128).permute(2, 1, 0, 3).reshape(2, 128, k)
    return w.bfloat16(), laid.contiguous().bfloat16(), x.bfloat16()


def _run(lnc: int) -> torch.Tensor:
    return _kernel[lnc](*_inputs())


@pytest.mark.parametrize("lnc", [1, 2])
def test_views_made_on_the_turn_equal_views_made_off_it(monkeypatch, lnc):
    made_rows: list[bool] = []
    made_bands: list[bool] = []
    for cls, made in ((provenance.Rows, made_rows), (provenance.Band, made_bands)):
        original = cls.made

        def counted(self, key, original=original, made=made):
            view = original(self, key)
            if view is not None:
                made.append(True)
            return view

        monkeypatch.setattr(cls, "made", counted)
    fast = _run(lnc)
    assert made_bands and made_rows  # the fast path ran: bands and rows converted by an earlier group
    monkeypatch.setattr(provenance.Rows, "made", lambda self, key: None)
    monkeypatch.setattr(provenance.Band, "made", lambda self, key: None)
    assert torch.equal(fast, _run(lnc))  # bit for bit: the same views, made off the turn
    w, laid, x = (t.float() for t in _inputs())
    for g in range(_GROUPS):
        h, m, q = _shape(g)
        weights = laid[h].reshape(128, 3, 128).permute(1, 0, 2).reshape(384, 128) if g < 3 else w
        for core in range(lnc):
            got = fast[core, g, :m, : 192 - q]
            torch.testing.assert_close(got, weights[:, :m].t() @ x[:, q:], rtol=1e-5, atol=1e-4)


def test_cached_stack_views_equal_fresh_ones(monkeypatch):
    fast = _run(1)
    uncached = deferred._Stack.matrix

    def fresh(self, rows, layout, cols, transposed):
        self.matrices.clear()  # every GEMM makes its stack views anew
        return uncached(self, rows, layout, cols, transposed)

    monkeypatch.setattr(deferred._Stack, "matrix", fresh)
    assert torch.equal(fast, _run(1))


def test_band_runs_extend_only_where_a_band_can_be_read():
    """extend() checks the band geometry for a run's first step only: every run it builds of more than
    one tile (not consecutive rows) satisfies it for the run's first tile and step."""
    storage = torch.zeros(4 * 128 * 384)
    copies = provenance.InputCopies(storage)
    pieces = [
        (copies, ((rows, cols), (384, 1), offset))
        for rows in (128, 64)
        for cols in (128, 96)
        for offset in (0, 128, 256, 32, 128 * 384, 128 * 384 + 128, 3 * 128 * 384 + 256)
    ]
    checked = 0
    for first in pieces:
        for second in pieces:
            for third in pieces:
                run: list[provenance.Piece] = []
                for p in (first, second, third):
                    if not provenance.extend(run, p):
                        break
                rows_run = len(run) > 1 and run[1][1][2] == run[0][1][2] + run[0][1][0][0] * 384
                if len(run) > 1 and not rows_run:
                    checked += 1
                    assert provenance._tiles(copies, run[0][1], run[1][1][2] - run[0][1][2])
    assert checked
