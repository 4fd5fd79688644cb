"""SBUF of a generated FFN kernel: its model of the spec, a plan's tiles and core split, the buffers a
plan allocates and their bytes per partition.

Standard library only: `fusegen build` copies this module's code into every generated FFN kernel with
budget.py, which prices and chooses plans over these buffers.
"""

from __future__ import annotations

from typing import NamedTuple

from fusegen.codegen.budget_base import (
    F_MOV,
    NO_STAGE,
    Buffer,
    P,
    Stage,
    cdiv,
    rows_per_core,
)
from fusegen.perf.dmarule import DMA_ROW_BYTES

#: SBUF bytes per partition every plan leaves unallocated (issue 15: ">= 8 KiB of SBUF headroom kept in
#: every plan"): the usable budget is NKIPY's figure for what a kernel may allocate, and a plan that fills
#: it to the byte leaves the compiler no room for its own spills and alignment padding, nor the budget
#: model any margin (docs/performance.md, "FFN at published model widths")
SBUF_HEADROOM = 8192
#: PSUM banks one K-column block of the column-blocked down-projection accumulates in: half of the 8, so
#: the next block's matmuls start while the last block is evicted
ACC_BANKS = 4


class FfnModel(NamedTuple):
    """What a generated FFN kernel holds in SBUF and computes, counted by its lowering."""

    n_up: int  # up projections: 1 plain MLP, 2 gated
    x_bytes: int  # bytes per element of x and of the combine's output h (the down-projection's stationary)
    mid_tiles: int  # f32 [P, fw] temporaries of the combine, per intermediate tile (`slice_width`)
    col_vectors: int  # [I] inputs held as [P, n_h] f32 columns
    out_bytes: int  # bytes per row element written, over all outputs
    mid_act: int  # Scalar-engine passes of the combine, per intermediate tile
    mid_dve: int  # Vector-engine passes of the combine
    acc_init: int  # 1: an [R, K] residual is DMA'd into the accumulator before the first chunk
    fold_bias: int  # 1: a [K] bias is added while evicting the first chunk, one [P, F_MOV] piece a time
    epi: Stage  # the epilogue, per owned row tile
    pro: Stage  # the prologue, per computed row tile (NO_STAGE without one)
    epi_cols: Stage = NO_STAGE  # the epilogue of the column-blocked kernel: accumulator blocks read from HBM
    evict: Stage = NO_STAGE  # its eviction of each down-projection piece (the spine computed), per row tile
    up_bytes: int = 2  # bytes per element of the up-projection weights (1: fp8)
    down_bytes: int = 2  # bytes per element of the down-projection weight (1: fp8)
    halves: int = 0  # 1: the epilogue runs a block at a time (no row statistics), so K can split (k_halves)
    folded: int = 0  # [P, 1] statistics per row tile the column blocks' evictions accumulate (a first pass)
    evict_rows: int = 0  # [R, K] inputs the eviction loads (its [K] rows: `evict.bcast`)


class Plan(NamedTuple):
    """Tiles and core split: S rows per super-block, CI intermediate columns per chunk, split over I, and
    KC output columns per block of the column-blocked down-projection (0: an SBUF accumulator instead).

    KC > 0: the combine's result h^T goes to an HBM scratch, then the down-projection runs one KC-wide
    column block at a time, accumulating all of I in PSUM (ACC_BANKS banks); each piece leaves PSUM once
    through the epilogue's elementwise part, to an fp32 HBM scratch the epilogue's statistics passes read
    (without statistics, to the outputs); nothing of width K stays in SBUF but x^T.

    G: K-tiles per up-projection weight DMA (0: all of K). The host lays each up weight out once as
    [I-tiles, P, K-tiles * P] (the kernel file's `_up_layout`), so one DMA of G K-tiles of one I-tile moves
    G * P contiguous elements per partition row; a streamed plan (`up_weights`) holds one such group.

    HT (KC > 0): 1 keeps every combine tile of the super-block in SBUF (`held_h`) and the column blocks read
    h^T there: no h^T scratch, its writes and KC-block reads gone, for all of I's tiles held at once; with
    that room taken, its down weights also move a group of I-tiles per DMA (`down_group`) and x's rows in
    blocks that reach the packet knee (`x_block`).
    """

    s: int
    ci: int
    split: int  # 1: each core computes every row over its share of I; 0: each core its own rows; 2: as 1,
    # with the partial sums exchanged core to core (nisa.sendrecv, LNC 2) instead of through shared HBM;
    # 3: as 2 with an odd number of I-tiles, each core an even share, the last I-tile for its own rows only
    kc: int = 0
    g: int = 0
    ht: int = 0


def work_per_core(rows: int, i: int, lnc: int, split: int) -> tuple[int, int]:
    """(rows computed, intermediate columns) of the busiest core."""
    if split == 3:  # the odd I-tile besides (`solo_tile`)
        return rows, cdiv(i, P) // lnc * P
    if split:
        return rows, min(i, cdiv(cdiv(i, P), lnc) * P)
    return rows_per_core(rows, lnc), i


def buffers(
    m: FfnModel, s: int, ci: int, k: int, i: int, kc: int = 0, g: int = 0, split: int = 0, ht: int = 0
) -> list[Buffer]:
    """The kernel's SBUF buffers for super-block `s` rows, chunk `ci` columns, column block `kc`, `g`
    K-tiles per up-weight DMA, work split `split` and h^T held (`ht`)."""
    n_k, n_h, n_hc, x = cdiv(k, P), cdiv(i, P), chunk_tiles(ci, i, split), m.x_bytes
    epi = m.epi_cols if kc else m.epi
    combine = Buffer("combine output (down-proj stationary)", n_hc * slice_width(s) * x, 1)
    common = [
        Buffer("x^T, K on partitions", n_k * s * m.x_bytes, 1),
        Buffer("x row block, staged for the PE transpose", x_staged(m, k, ht) * m.x_bytes, 2),
        up_weights(m, s, ci, k, g),
        held_h(m, s, i) if kc and ht else combine,
        Buffer("combine temporaries", m.mid_tiles * slice_width(s) * 4, 2),
        Buffer("prologue block (one K-block's loads and temporaries)", m.pro.block_bytes * min(F_MOV, k), 2),
        Buffer("epilogue block (one K-block's loads and temporaries)", epi.block_bytes * min(F_MOV, k), 2),
        Buffer("row statistics columns", (epi.cols + m.pro.cols) * 4, 2),
        Buffer("[I] columns", m.col_vectors * n_h * 4, 1),
    ]
    if kc:
        down_tiles = down_group(kc, i, m.down_bytes, ht) * kc * m.down_bytes
        n_in = m.evict_rows + m.evict.bcast  # [P, F_MOV] f32 tiles an eviction piece loads
        evict_in = cdiv(kc, F_MOV) * (cdiv(s, P) * m.evict_rows + m.evict.bcast)  # [K] rows: once per piece
        return [
            *common,
            Buffer("down-projection weight tiles (a group of I-tiles, one column block)", down_tiles, 2),
            Buffer("h^T read back (a group of I-tiles)", 0 if ht else h_group(s, i, x) * s * x, 2),
            Buffer("PSUM eviction temporaries", (m.evict.block_bytes - 4 * n_in) * min(F_MOV, k), 2),
            # a block's eviction loads go out with its own, and are read after the next block's: two blocks'
            Buffer("PSUM eviction loads (a block's, with its loads)", evict_in * min(F_MOV, k) * 4, 2),
            Buffer("row statistics the evictions accumulate, per row tile", cdiv(s, P) * m.folded * 4, 1),
        ]
    exchange = [
        Buffer("partial sums received from the other core", cdiv(s, P) * cdiv(k, F_MOV) * F_MOV * 4, 1),
        Buffer("partial-sum block sent (zeros in rounds without)", F_MOV * 4, 3),
    ]
    return [
        *common,
        *(exchange if split >= 2 else []),
        Buffer("fp32 accumulator", cdiv(s, P) * k * 4, 1),
        Buffer("down-projection weight chunk", n_hc * k * m.down_bytes, 2),
        Buffer("[K]-bias piece / partial-sum block", F_MOV * 4, 2),
    ]


#: pairs of I-tiles whose down weights load a K half at a time (`paired_tiles`)
DOWN_PAIRS = 3


def k_halves(m: FfnModel, rows: int, k: int, lnc: int, split: int) -> bool:
    """SPLIT 2 over one row tile (every row on core 0): each core finishes half of K's columns instead, so
    both send real sums and the epilogue and stores split between them. Needs a block-wise epilogue, an
    even K (the exchange's shapes match) and each half's blocks in PSUM at once (ACC_BANKS)."""
    return bool(m.halves) and split == 2 and lnc == 2 and rows <= P and k % 2 == 0 and k <= ACC_BANKS * F_MOV


def k_spans(k: int, first: int, width: int) -> list[tuple[int, int, int, int]]:
    """K's blocks of at most F_MOV columns, (k0, nk, s0, sw) each, in the order a core computes them: with
    K halves (`width` < k) the other core's half first, then its own [first, first + width); each half a
    span [s0, s0 + sw) that leaves in one exchange and takes its [K] bias in one load. Without, each block
    is its own span."""
    if width == k:
        return [(k0, min(F_MOV, k - k0), k0, min(F_MOV, k - k0)) for k0 in range(0, k, F_MOV)]
    halves = (width if first == 0 else 0, first)
    return [
        (k0, min(F_MOV, s0 + width - k0), s0, width) for s0 in halves for k0 in range(s0, s0 + width, F_MOV)
    ]


def paired_tiles(its: list[int], i: int, pairs: int = DOWN_PAIRS) -> list[int]:
    """Positions in a chunk's I-tiles `its` whose down weights load a K half at a time (K halves, the last
    chunk): the last `pairs` pairs of whole I-tiles (a ragged one loads whole, before them). Two I-tiles per
    DMA keep each partition row of a half at 2 * K/2 elements, as one whole I-tile's (the DMA packet rule)."""
    whole = [hl for hl, it in enumerate(its) if (it + 1) * P <= i]
    return whole[len(whole) - min(pairs, len(whole) // 2) * 2 :]


def down_order(
    n: int, blocks: list[tuple[int, int, int, int]], paired: list[int]
) -> list[tuple[int, int, bool]]:
    """(I-tile, K-block, accumulate) of each down-projection matmul in order: I-tile outer; the `paired`
    I-tiles (loaded a K half at a time, `k_spans`' first span first) last, pair by pair, in `evict_order`: the
    first span's sums do not wait for the second's weights, and the last pair's narrow block is evicted
    while the PE computes its wide one. `accumulate` is False for a block's first matmul, which need not be
    I-tile 0's (a ragged I-tile goes before the pairs)."""
    paired = [hl for hl in paired if hl < n]
    head = [(hl, ko) for hl in range(n) if hl not in paired for ko in range(len(blocks))]
    order = evict_order(blocks, True)
    spans = [[ko for ko in order if (blocks[ko][2] == blocks[0][2]) == first] for first in (True, False)]
    pairs = [paired[j : j + 2] for j in range(0, len(paired), 2)]
    tail = [(hl, ko) for span in spans for pair in pairs for ko in span for hl in pair]
    started: set[int] = set()
    steps = []
    for hl, ko in head + tail:
        steps.append((hl, ko, ko in started))
        started.add(ko)
    return steps


def evict_order(blocks: list[tuple[int, int, int, int]], paired: bool) -> list[int]:
    """K-blocks in the order their sums leave PSUM: `blocks`' order; with `paired` down weights (`down_order`)
    the second span's narrowest block first."""
    rest = [ko for ko, b in enumerate(blocks) if b[2] != blocks[0][2]]
    first = [ko for ko in range(len(blocks)) if ko not in rest]
    return first + (sorted(rest, key=lambda ko: blocks[ko][1]) if paired else rest)


def chunk_tiles(ci: int, i: int, split: int) -> int:
    """I-tiles of the widest chunk: CI's, or (split 3, LNC 2) the last chunk's with the odd I-tile."""
    if split != 3:
        return cdiv(ci, P)
    share = cdiv(i, P) // 2 * P
    return max(cdiv(ci, P), cdiv(share - (cdiv(share, ci) - 1) * ci, P) + 1)


def solo_tile(i: int) -> int:
    """Columns of split 3's odd I-tile (the last: the ragged one, if any)."""
    return i - (cdiv(i, P) - 1) * P


def x_block(k: int, x_bytes: int, ht: int = 0) -> int:
    """Columns of x per DMA staged for the PE transpose: a whole row when it fits in the fewest F_MOV blocks
    that reach DMA_ROW_BYTES per partition row (K <= 1536 in bf16: there x's loads are a large share of a
    super-block's start and SBUF has room), else one F_MOV block (wide K: SBUF is tight and x's loads are
    a small share of the weights'). HT plans (column blocks with h^T held: nothing of width K in SBUF but
    x^T) stage those fewest blocks at any K: 1 KiB rows cost 2.4x their bytes in every super-block's fill,
    which no matmul overlaps (9% of the DeepSeek-V3 expert width's kernel), for 4 KiB more SBUF."""
    knee = cdiv(DMA_ROW_BYTES, F_MOV * x_bytes) * F_MOV
    return min(k, knee) if ht or k <= knee else min(F_MOV, k)


def x_staged(m: FfnModel, k: int, ht: int = 0) -> int:
    """Columns of the staged x block: `x_block`, or a prologue's F_MOV-wide blocks."""
    return min(F_MOV, k) if m.pro.sweeps else x_block(k, m.x_bytes, ht)


def column_block(s: int, k: int) -> int:
    """KC of the column-blocked down-projection at super-block `s`: as many F_MOV-wide pieces per row tile
    as ACC_BANKS allows (at most K's); 0 when a super-block has more row tiles than ACC_BANKS."""
    return min(cdiv(k, F_MOV), ACC_BANKS // cdiv(s, P)) * F_MOV


def streams_up(s: int, ci: int) -> bool:
    """Up weights streamed in groups of K-tiles: one row slice (S <= F_MOV) and one intermediate tile
    (CI <= P), so each K-tile has a single matmul and its group is loaded just before the first of them."""
    return s <= F_MOV and ci <= P


def group(k: int, g: int) -> int:
    """K-tiles per up-weight DMA: `g`, or all of K's when 0 (or more)."""
    n_k = cdiv(k, P)
    return min(g, n_k) if g else n_k


def h_group(s: int, i: int, x_bytes: int) -> int:
    """I-tiles of h^T per read of the column-blocked down-projection at super-block `s`: the fewest whose
    rows reach DMA_ROW_BYTES per partition (the scratch holds each partition's I-tiles contiguous)."""
    return min(cdiv(i, P), cdiv(DMA_ROW_BYTES, s * x_bytes))


def down_group(kc: int, i: int, down_bytes: int, ht: int = 0) -> int:
    """I-tiles of the down weight per DMA of a column block, from the host's block layout (the kernel file's
    `_down_blocks`: a block's I-tiles contiguous per partition): one, or with HT (h^T held: SBUF has room)
    the fewest whose rows reach DMA_ROW_BYTES."""
    return min(cdiv(i, P), cdiv(DMA_ROW_BYTES, kc * down_bytes)) if ht else 1


def up_weights(m: FfnModel, s: int, ci: int, k: int, g: int = 0) -> Buffer:
    """The up-projection weights in SBUF: a whole chunk loaded up front (each I-tile in groups of G
    K-tiles, padded to whole tiles by `up_layout`), or, streamed, one group of G K-tiles per projection."""
    if streams_up(s, ci):
        streamed = m.n_up * group(k, g) * P * m.up_bytes
        return Buffer("up-projection weight K-tile group (streamed)", streamed, 2)
    n_g = cdiv(cdiv(k, P), group(k, g))
    return Buffer("up-projection weight chunk", m.n_up * cdiv(ci, P) * n_g * group(k, g) * P * m.up_bytes, 2)


def slice_width(s: int) -> int:
    """Columns of a combine tile (and its temporaries): one row slice of super-block `s`, F_MOV at most
    (the kernel's `fw`)."""
    return min(s, F_MOV)


def held_h(m: FfnModel, s: int, i: int) -> Buffer:
    """A column-blocked super-block's combine tiles held for its column blocks (HT): one [P, fw] tile
    per I-tile and row slice of `s` rows, all of `i`."""
    held = cdiv(i, P) * cdiv(s, F_MOV) * slice_width(s) * m.x_bytes
    return Buffer("combine output h^T, held for the column blocks", held, 1)


def sbuf_bytes(
    m: FfnModel, s: int, ci: int, k: int, i: int, kc: int = 0, g: int = 0, split: int = 0, ht: int = 0
) -> int:
    """SBUF bytes per partition the kernel needs, copies included."""
    return sum(b.bytes * b.copies for b in buffers(m, s, ci, k, i, kc, g, split, ht))


def plan_bytes(m: FfnModel, p: Plan, k: int, i: int) -> int:
    """SBUF bytes per partition of plan `p`."""
    return sbuf_bytes(m, p.s, p.ci, k, i, p.kc, p.g, p.split, p.ht)


def smallest_need(m: FfnModel, k: int, i: int) -> int:
    """SBUF bytes of the smallest plan (S=128, CI=128, the smallest K-tile group), the better of the two
    down-projections."""
    g = min_group(m)
    return min(sbuf_bytes(m, P, P, k, i, 0, g), sbuf_bytes(m, P, P, k, i, column_block(P, k), g))


def min_group(m: FfnModel) -> int:
    """The fewest K-tiles per up-weight DMA that move DMA_ROW_BYTES per partition row (the packet rule's
    knee: fewer K-tiles pay per packet, more only take SBUF)."""
    return cdiv(DMA_ROW_BYTES, P * m.up_bytes)


def psum_banks(m: FfnModel, kc: int = 0) -> int:
    """PSUM banks in flight: each projection tile and the down-projection tile, double-buffered; with
    column blocks, the down-projection's ACC_BANKS double-buffered (the up-projections' are free by then)."""
    return 2 * ACC_BANKS if kc else 2 * (m.n_up + 1)
