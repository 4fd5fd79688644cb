"""SBUF budget of a generated FFN kernel and its choice of row super-block S and I-chunk CI.

Standard library only: `fusegen build` copies this module's code into every generated FFN kernel, so
the host function plans for runtime shapes with exactly the model the compiler used.
"""

from __future__ import annotations

from typing import NamedTuple

P = 128  # partitions
F_MOV = 512  # matmul moving free size, one fp32 PSUM bank
PSUM_BANKS = 8


class FfnModel(NamedTuple):
    """What a generated FFN kernel holds in SBUF, counted by its lowering."""

    n_up: int  # up projections: 1 plain MLP, 2 gated
    x_bytes: int  # bytes per element of x and of the weights
    mid_tiles: int  # f32 [P, F_MOV] temporaries of the combine, per intermediate tile
    epi_tiles: int  # f32 [P, K] temporaries of the epilogue, per row tile
    epi_cols: int  # f32 [P, 1] columns of the epilogue, per row tile
    col_vectors: int  # [I] inputs held as [P, n_h] f32 columns
    row_vectors: int  # [K] inputs held broadcast as [P, K] f32
    row_inputs: int  # [R, K] inputs loaded per row tile


class Buffer(NamedTuple):
    """One SBUF buffer of the kernel: bytes per partition per copy, and copies in flight."""

    name: str
    bytes: int
    copies: int


def cdiv(n: int, d: int) -> int:
    """Ceiling division."""
    return -(-n // d)


def rows_per_core(rows: int, lnc: int) -> int:
    """Rows one core handles: whole 128-row tiles are dealt out, the ragged tile goes last."""
    return min(rows, cdiv(cdiv(rows, P), lnc) * P)


def buffers(m: FfnModel, s: int, ci: int, k: int, i: int) -> list[Buffer]:
    """The kernel's SBUF buffers for super-block `s` rows and chunk `ci` columns."""
    n_k, n_h, n_hc = cdiv(k, P), cdiv(i, P), cdiv(ci, P)
    return [
        Buffer("x^T, K on partitions", n_k * s * m.x_bytes, 1),
        Buffer("fp32 accumulator", cdiv(s, P) * k * 4, 1),
        Buffer("up-projection weight chunk", m.n_up * n_k * ci * m.x_bytes, 2),
        Buffer("down-projection weight chunk", n_hc * k * m.x_bytes, 2),
        Buffer("combine output (down-proj stationary)", n_hc * F_MOV * m.x_bytes, 1),
        Buffer("combine temporaries", m.mid_tiles * F_MOV * 4, 2),
        Buffer("epilogue tiles", (m.epi_tiles + m.row_inputs) * k * 4, 2),
        Buffer("epilogue columns", m.epi_cols * 4, 2),
        Buffer("[I] columns", m.col_vectors * n_h * 4, 1),
        Buffer("[K] broadcast rows", m.row_vectors * k * 4, 1),
    ]


def sbuf_bytes(m: FfnModel, s: int, ci: int, k: int, i: int) -> int:
    """SBUF bytes per partition the kernel needs, copies included."""
    return sum(b.bytes * b.copies for b in buffers(m, s, ci, k, i))


def psum_banks(m: FfnModel) -> int:
    """PSUM banks in flight: each projection tile and the down-projection tile, double-buffered."""
    return 2 * (m.n_up + 1)


def choose(m: FfnModel, rows: int, k: int, i: int, lnc: int, budget: int) -> tuple[int, int]:
    """(S, CI): fewest weight re-streams, then the smallest super-block, then the widest chunk."""
    per_core = max(1, rows_per_core(rows, lnc))
    ci_max = cdiv(i, P) * P
    for n_sb in range(1, cdiv(per_core, P) + 1):
        s = cdiv(cdiv(per_core, n_sb), P) * P
        for ci in range(ci_max, 0, -P):
            if sbuf_bytes(m, s, ci, k, i) <= budget:
                return s, ci
    need = sbuf_bytes(m, P, P, k, i)
    raise ValueError(f"no tile plan fits: the smallest (S=128, CI=128) needs {need} B/partition of SBUF "
                     f"for K={k}, I={i}; the budget is {budget} B")
