"""A Tensor-engine transpose of NaN/Inf: an identity matmul on NeuronCore-v2 (trn1), so a non-finite element
spreads through its column as 0 * inf = nan; exact from NeuronCore-v3 (trn2) on (ISA nc_transpose)."""

from __future__ import annotations

import math

import torch

import fusegen.sim as sim

with sim.installed():
    import nki
    import nki.isa as nisa
    import nki.language as nl


@nki.jit
def transposed(x):
    """x [128, 64] bf16 through the Tensor engine's transpose, back to HBM as [64, 128]."""
    tile = nl.ndarray((128, 64), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=x)
    t_ps = nl.ndarray((64, 128), dtype=nl.bfloat16, buffer=nl.psum)
    nisa.nc_transpose(dst=t_ps, data=tile, engine=nisa.engine.tensor)
    t_sb = nl.ndarray((64, 128), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.tensor_copy(dst=t_sb, src=t_ps)
    out = nl.ndarray((64, 128), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t_sb)
    return out


def _x() -> torch.Tensor:
    x = torch.randn(128, 64).bfloat16()
    x[5, 3], x[9, 7], x[9, 8], x[70, 8] = math.inf, math.nan, -math.inf, 2.0
    return x


def test_trn2_transposes_non_finite_values_exactly() -> None:
    x = _x()
    got = sim.run(transposed, x, target="trn2").outputs
    assert torch.equal(got.float().nan_to_num(7.0), x.t().float().nan_to_num(7.0))


def test_trn1_spreads_them_through_their_column() -> None:
    x = _x()
    got = sim.run(transposed, x, target="trn1").outputs.float()
    want = x.t().float().clone()
    want[3, torch.arange(128) != 5] = math.nan  # x[5, 3] = inf: 0 * inf in every other row's sum
    want[7, torch.arange(128) != 9] = math.nan
    want[8, torch.arange(128) != 9] = math.nan  # x[9, 8] = -inf stays itself: no other bad row there
    assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0))
    finite = [c for c in range(64) if c not in (3, 7, 8)]
    assert torch.equal(got[finite], x.t().float()[finite])
