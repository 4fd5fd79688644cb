"""A DMA of an unwritten caller input into SBUF copies its data only when the tile is next viewed
(Alloc.defer_copy): every reader and writer of the tile still sees exactly what the DMAs put there."""

from __future__ import annotations

import pytest
import torch

import fusegen.sim as sim
from fusegen.sim import memory

with sim.installed():
    import nki
    import nki.isa as nisa
    import nki.language as nl


def _load(x_hbm, cols: int = 64):
    """SBUF copy of x's first 128 rows, columns [0, cols)."""
    t = nl.ndarray((128, cols), dtype=x_hbm.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x_hbm[0:128, 0:cols])
    return t


def _out(sb, dtype=nl.float32):
    """A shared_hbm copy of an SBUF tile."""
    out = nl.ndarray(sb.shape, dtype=dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=sb)
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("reader", ["dma", "tensor_copy", "activation", "tensor_scalar"])
def test_every_reader_sees_the_dma_data(dtype: torch.dtype, reader: str) -> None:
    """Plain reads (dma out, tensor_copy) view the storage; engines reading bf16 as fp32 use its fp32
    shadow: both get the copy made first."""
    x = torch.randn(128, 64).to(dtype)

    @nki.jit
    def kernel(x_hbm):
        t = _load(x_hbm)
        if reader == "dma":
            return _out(t, x_hbm.dtype)
        y = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        if reader == "tensor_copy":
            nisa.tensor_copy(dst=y, src=t)
        elif reader == "activation":
            nisa.activation(dst=y, op=nl.copy, data=t)
        else:
            nisa.tensor_scalar(dst=y, data=t, op0=nl.multiply, operand0=2.0)
        return _out(y)

    want = x.float() * (2.0 if reader == "tensor_scalar" else 1.0)
    assert torch.equal(kernel(x).float(), want)


def test_a_write_over_part_of_the_tile_lands_on_the_dma_data() -> None:
    """The deferred copy is made before a later write to the tile, not after it (which would undo it)."""
    x = torch.randn(128, 64).bfloat16()

    @nki.jit
    def kernel(x_hbm):
        t = _load(x_hbm)
        nisa.memset(dst=t[0:128, 16:32], value=0.5)
        return _out(t, x_hbm.dtype)

    want = x.clone()
    want[:, 16:32] = 0.5
    assert torch.equal(kernel(x), want)


def test_overlapping_dmas_into_one_tile_apply_in_order() -> None:
    """More DMAs into one tile than it defers (the oldest are then made): the last one wins each element."""
    x = torch.randn(128, 256).bfloat16()
    shifts = range(memory._LAZY_COPIES + 4)

    @nki.jit
    def kernel(x_hbm):
        t = nl.ndarray((128, 96), dtype=x_hbm.dtype, buffer=nl.sbuf)
        for s in shifts:  # columns [s, s + 64) of the tile from columns [4s, 4s + 64) of x
            nisa.dma_copy(dst=t[0:128, s : s + 64], src=x_hbm[0:128, 4 * s : 4 * s + 64])
        return _out(t[0:128, 0 : shifts[-1] + 64], x_hbm.dtype)

    want = torch.empty(128, shifts[-1] + 64, dtype=torch.bfloat16)
    for s in shifts:
        want[:, s : s + 64] = x[:, 4 * s : 4 * s + 64]
    assert torch.equal(kernel(x), want)


def test_an_input_written_after_its_dma_keeps_the_tiles_values() -> None:
    """The kernel overwrites the input after loading it, before the tile is read: the tile keeps what the
    DMA read (the deferred copy reads the caller's storage, which a launch writes only at its end)."""
    x = torch.randn(128, 64).bfloat16()

    @nki.jit
    def kernel(x_hbm):
        t = _load(x_hbm)
        zero = nl.ndarray((128, 64), dtype=x_hbm.dtype, buffer=nl.sbuf)
        nisa.memset(dst=zero, value=0.0)
        nisa.dma_copy(dst=x_hbm[0:128, 0:64], src=zero)
        return _out(t, x_hbm.dtype), _out(_load(x_hbm), x_hbm.dtype)

    x_in = x.clone()
    old, new = kernel(x_in)
    assert torch.equal(old, x)
    assert torch.equal(new, torch.zeros_like(x))
    assert torch.equal(x_in, torch.zeros_like(x))  # written back


def test_reading_past_the_dma_is_still_an_uninitialised_read() -> None:
    """Only the elements a DMA wrote count as written, copy made or not."""
    x = torch.randn(128, 64).bfloat16()

    @nki.jit
    def kernel(x_hbm):
        t = nl.ndarray((128, 96), dtype=x_hbm.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t[0:128, 0:64], src=x_hbm[0:128, 0:64])
        return _out(t, x_hbm.dtype)

    with pytest.raises(sim.UninitializedReadError, match="4096 of 12288"):
        kernel(x)
    with pytest.warns(sim.UninitializedReadWarning):
        got = sim.run(kernel, x, strict=False).outputs
    assert torch.equal(got[:, 0:64], x)
    assert bool(got[:, 64:].float().isnan().all())


def test_both_cores_load_one_input_and_read_it() -> None:
    """LNC=2: each instance defers its own copy of the same rows and reads its half of them."""
    x = torch.randn(128, 128).bfloat16()

    @nki.jit
    def kernel(x_hbm):
        pid = nl.program_id(0)
        t = nl.ndarray((128, 64), dtype=x_hbm.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x_hbm[0:128, pid * 64 : pid * 64 + 64])
        y = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=y, src=t)
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out[0:128, pid * 64 : pid * 64 + 64], src=y)
        return out

    assert torch.equal(kernel[2](x), x.float())
