"""A caller's tensor is HBM as torch lays it out: its storage from its offset, with its strides."""

from __future__ import annotations

import pytest
import torch

import fusegen.sim as sim

with sim.installed():
    import nki.isa as nisa
    import nki.language as nl


def _copy(x):
    """Copy a 2-D HBM tensor through SBUF into a fresh output, element by element as the kernel sees it."""
    rows, cols = x.shape
    sb = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=sb, src=x[0:rows, 0:cols])
    out = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=sb)
    return out


def _negate_in_place(x):
    """Write -x into x itself (the caller sees it through write-back)."""
    rows, cols = x.shape
    sb = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=sb, src=x[0:rows, 0:cols])
    nisa.tensor_scalar(dst=sb, data=sb, op0=nl.multiply, operand0=-1.0)
    nisa.dma_copy(dst=x[0:rows, 0:cols], src=sb)
    return x


def _base() -> torch.Tensor:
    return torch.arange(6 * 8, dtype=torch.float32).reshape(6, 8)


LAYOUTS = {
    "storage offset": lambda b: b[2:],
    "column slice": lambda b: b[1:5, 2:7],
    "every other column": lambda b: b[:, ::2],
    "transposed": lambda b: b.t(),
    "expanded row": lambda b: b[3].expand(5, 8),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_kernel_reads_the_view_not_the_storage_start(layout: str) -> None:
    view = LAYOUTS[layout](_base())
    got = sim.run(_copy, view).outputs
    assert torch.equal(got, view.contiguous())


@pytest.mark.parametrize("layout", ["storage offset", "column slice", "every other column", "transposed"])
def test_writes_to_an_input_view_reach_only_its_elements(layout: str) -> None:
    base = _base()
    view = LAYOUTS[layout](base)
    expected = base.clone()
    LAYOUTS[layout](expected).neg_()
    sim.run(_negate_in_place, view)
    assert torch.equal(base, expected)


def test_an_input_is_copied_on_write_not_changed_during_the_run() -> None:
    base = _base()
    seen = []

    def kernel(x):
        _negate_in_place(x)
        seen.append(base.clone())  # the caller's storage mid-run
        return _copy(x)

    out = sim.run(kernel, base[2:]).outputs
    assert torch.equal(seen[0], _base())
    assert torch.equal(out, -_base()[2:])
    assert torch.equal(base[2:], -_base()[2:]) and torch.equal(base[:2], _base()[:2])


def test_a_strided_input_cannot_be_reshaped_like_dense_memory() -> None:
    def kernel(x):
        return _copy(x.reshape((8, 6)))

    with pytest.raises(sim.SimError, match="not contiguous"):
        sim.run(kernel, _base().t())


def test_a_tensor_off_the_cpu_is_refused_by_name() -> None:
    with pytest.raises(sim.SimError, match=r"no backend for device meta \(argument arg0\)"):
        sim.run(_copy, torch.empty(2, 2, device="meta"))
