"""HBM <-> SBUF copies the per-instruction tests (test_ops.py, test_ops_memory.py) stage operands with."""

from __future__ import annotations

import fusegen.sim as sim

with sim.installed():
    import nki.isa as nisa
    import nki.language as nl


def load(t):
    """SBUF copy of an HBM tensor."""
    sb = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=sb, src=t)
    return sb


def store(sb, dtype=None):
    """shared_hbm copy of an SBUF tile (the kernel output)."""
    out = nl.ndarray(sb.shape, dtype=dtype or sb.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=sb)
    return out
