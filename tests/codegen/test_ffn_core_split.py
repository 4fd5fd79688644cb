"""Generated FFN kernels over two cores on the interpreter against the torch formula: I split with the
partial sums through shared HBM (SPLIT=1), exchanged core to core (SPLIT=2, and K halves over one row
tile), the odd I-tile per owner (SPLIT=3)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fusegen.sim import load_module, run
from tests.codegen.ffn_formula import GENERATED, close, inputs, swiglu


@pytest.mark.parametrize(
    ("r", "k", "i", "s", "ci"),
    [(7, 256, 300, 128, 128), (200, 384, 1000, 256, 256), (300, 256, 640, 128, 384)],
)
def test_i_split_across_cores_matches_formula(r: int, k: int, i: int, s: int, ci: int) -> None:
    """SPLIT=1: each core streams half the weights; partial sums meet in shared HBM behind a barrier."""
    module = load_module(GENERATED / "swiglu_ffn_ln" / "kernel.py", target="trn2")
    x, w1t, b1, wgt, bg, w2t, b2, a = inputs(r, k, i, seed=11 * r + i)
    cols, up = module._columns, (lambda w: module._up_layout(w, (0,), i))
    result = run(
        module.swiglu_ffn_ln_kernel,
        x,
        up(w1t),
        cols(b1, bg),
        up(wgt),
        w2t,
        b2,
        a,
        1e-6,
        w2t,
        s,
        ci,
        1,
        0,
        0,
        0,
        grid=2,
    )
    x_new, z = result.outputs
    want_x = swiglu(x, w1t, b1, wgt, bg, w2t, b2) + a
    close(x_new, want_x, rtol=1e-3)
    close(z, F.layer_norm(want_x, (k,), eps=1e-6).bfloat16(), rtol=2e-2)
    assert result.trace.op_counts()["core_barrier"] == 2 * -(-r // s)
    # each core streams only its share of I, once per super-block: the weights cross HBM once per super-block
    # (the up weights in whole 128 x 128 tiles of their host layout, zero-padded)
    padded = -(-k // 128) * 128 * -(-i // 128) * 128
    assert _weight_bytes_read(result, args=(1, 3, 4)) == (2 * padded + k * i) * 2 * -(-r // s)


@pytest.mark.parametrize(
    ("r", "k", "i", "s", "ci"),
    [
        (7, 256, 300, 128, 128),  # one row tile, core 0's: core 0 sends zeros; two chunks, sums added late
        (200, 384, 1000, 256, 256),  # 128 + 72 rows: rounds of 128 rows, core 1's tile padded; added early
        (300, 256, 640, 128, 384),  # three super-blocks, one chunk per core: the eviction copied out on ACT
        (256, 256, 640, 256, 640),  # one chunk, each core sends one tile
    ],
)
def test_core_to_core_exchange_matches_formula(r: int, k: int, i: int, s: int, ci: int) -> None:
    """SPLIT=2: partial sums go SBUF to SBUF (nisa.sendrecv) in rounds both cores make alike; no barrier,
    no shared-HBM scratch; the residual and the LayerNorm epilogue see the whole sum."""
    module = load_module(GENERATED / "swiglu_ffn_ln" / "kernel.py", target="trn2")
    x, w1t, b1, wgt, bg, w2t, b2, a = inputs(r, k, i, seed=13 * r + i)
    cols, up = module._columns, (lambda w: module._up_layout(w, (0,), i))
    result = run(
        module.swiglu_ffn_ln_kernel, x, up(w1t), cols(b1, bg), up(wgt), w2t, b2, a, 1e-6, w2t,
        s, ci, 2, 0, 0, 0, grid=2,
    )  # fmt: skip
    x_new, z = result.outputs
    want_x = swiglu(x, w1t, b1, wgt, bg, w2t, b2) + a
    close(x_new, want_x, rtol=1e-3)
    close(z, F.layer_norm(want_x, (k,), eps=1e-6).bfloat16(), rtol=2e-2)
    ops = result.trace.op_counts()
    assert "core_barrier" not in ops
    per_core = [sum(rec.op == "sendrecv" for rec in result.trace if rec.core == c) for c in (0, 1)]
    assert per_core[0] == per_core[1] > 0
    # the only shared-HBM writes are the outputs: nothing goes through an HBM scratch
    written = sum(rec.hbm_write for rec in result.trace)
    assert written == r * k * (4 + 2)


@pytest.mark.parametrize(
    ("r", "k", "i", "s", "ci"),
    [
        (7, 640, 300, 128, 128),  # core 0 owns the one tile: the other core's sums added late, by block
        (200, 640, 1000, 256, 256),  # each core owns a tile; two chunks: added early, the sent tile's acc
    ],
)
def test_core_to_core_exchange_one_pass_epilogue_matches_formula(
    r: int, k: int, i: int, s: int, ci: int
) -> None:
    """SPLIT=2 with a one-pass epilogue (the [K] bias folded in, then the cast): each K-block (two here)
    finishes as its sums and the other core's are in, whether those came before or after its matmuls."""
    module = load_module(GENERATED / "swiglu_ffn" / "kernel.py", target="trn2")
    x, w1t, b1, wgt, bg, w2t, b2, _ = inputs(r, k, i, seed=7 * r + i)
    cols, up = module._columns, (lambda w: module._up_layout(w, (0,), i))
    args = (x, up(w1t), cols(b1, bg), up(wgt), w2t, b2, w2t)
    result = run(module.swiglu_ffn_kernel, *args, s, ci, 2, 0, 0, 0, grid=2)
    out = result.outputs
    close(out, swiglu(x, w1t, b1, wgt, bg, w2t, b2).bfloat16(), rtol=2e-2)
    adds = [sum(rec.engine == "gpsimd" for rec in result.trace if rec.core == c) for c in (0, 1)]
    # one per received K-block of an owned tile; over one row tile, one per core: its half of K
    assert adds == ([1, 1] if r <= 128 else [2, 2])


def _sends(result, core: int) -> list[tuple[int, ...]]:  # type: ignore[no-untyped-def]
    """Shapes of the tiles `core` sends by sendrecv."""
    return [
        op[3]
        for rec in result.trace
        if rec.core == core and rec.op == "sendrecv"
        for op in rec.operands
        if op[0] == "r"
    ]


@pytest.mark.parametrize(
    ("r", "k", "i", "ci"),
    [
        (1, 384, 300, 128),
        (7, 640, 300, 384),
        (100, 1280, 640, 128),
        (128, 1024, 1000, 256),
        (128, 256, 130, 128),  # one chunk per core (the second core's I share: two columns)
        (128, 1280, 1536, 768),  # one chunk per core, three pairs of down weights loaded by K half
        (64, 640, 2000, 512),  # two chunks; core 0's last: one pair, its ragged I-tile loaded whole first
    ],
)
def test_one_row_tile_splits_k_between_the_cores(r: int, k: int, i: int, ci: int) -> None:
    """SPLIT=2 over one row tile (R <= 128, all rows core 0's): each core finishes half of K instead, so
    each sends the other its half's sums once, folds its half's epilogue, and stores only that half; core 0
    (the smaller share of I) folds the [K] bias into both halves, core 1 loads none."""
    module = load_module(GENERATED / "swiglu_ffn" / "kernel.py", target="trn2")
    x, w1t, b1, wgt, bg, w2t, b2, _ = inputs(r, k, i, seed=3 * r + k + i)
    cols, up = module._columns, (lambda w: module._up_layout(w, (0,), i))
    result = run(
        module.swiglu_ffn_kernel, x, up(w1t), cols(b1, bg), up(wgt), w2t, b2, w2t, 128, ci, 2, 0, 0, 0, grid=2
    )
    close(result.outputs, swiglu(x, w1t, b1, wgt, bg, w2t, b2).bfloat16(), rtol=2e-2)
    for core in (0, 1):
        assert [shape[-1] for shape in _sends(result, core)] == [k // 2]
        assert sum(rec.hbm_write for rec in result.trace if rec.core == core) == r * k // 2 * 2
    bias = [
        rec for rec in result.trace for op in rec.operands if op[0] == "r" and op[1] == _arg_id(result, 5)
    ]
    assert {rec.core for rec in bias} == {0}


@pytest.mark.parametrize(("k", "i", "ci", "pairs"), [(640, 2000, 512, (1, 2)), (1280, 1536, 768, (3, 3))])
def test_last_down_weights_load_by_k_half(k: int, i: int, ci: int, pairs: tuple[int, int]) -> None:
    """K halves, last chunk: the last pairs of whole I-tiles' down weights load a K half at a time, two
    I-tiles per DMA ([128, 2, K/2]), the half this core sends first; the other down weights load whole."""
    module = load_module(GENERATED / "swiglu_ffn" / "kernel.py", target="trn2")
    x, w1t, b1, wgt, bg, w2t, b2, _ = inputs(128, k, i, seed=k + i)
    cols, up = module._columns, (lambda w: module._up_layout(w, (0,), i))
    result = run(
        module.swiglu_ffn_kernel, x, up(w1t), cols(b1, bg), up(wgt), w2t, b2, w2t, 128, ci, 2, 0, 0, 0, grid=2
    )
    close(result.outputs, swiglu(x, w1t, b1, wgt, bg, w2t, b2).bfloat16(), rtol=2e-2)
    down = _arg_id(result, 4)
    for core in (0, 1):
        loads = [
            op[3] for rec in result.trace if rec.core == core for op in rec.operands if op[:2] == ("r", down)
        ]
        n = -(-i // 128)
        share = -(-n // 2) if core else n - -(-n // 2)  # core 1 takes the first (larger) share of I
        whole = [shape for shape in loads if shape != (128, 2, k // 2)]
        assert len(loads) - len(whole) == 2 * pairs[core]
        assert all(len(shape) == 2 and shape[1] == k for shape in whole)
        assert len(whole) + 2 * pairs[core] == share  # each pair load holds a K half of two I-tiles


@pytest.mark.parametrize(("r", "i"), [(1, 300), (100, 640), (128, 384)])
def test_one_row_tile_splits_k_without_a_bias(r: int, i: int) -> None:
    """The same split for an FFN without biases (llama_swiglu): nothing folded at the first chunk."""
    module = load_module(GENERATED / "llama_swiglu" / "kernel.py", target="trn2")
    gen = torch.Generator().manual_seed(r + i)
    x, wg, wu = (torch.randn(*s, generator=gen).bfloat16() for s in ((r, 512), (512, i), (512, i)))
    wd = (torch.randn(i, 512, generator=gen) * i**-0.5).bfloat16()
    up = lambda w: module._up_layout(w, (0,), i)  # noqa: E731
    result = run(module.llama_swiglu_kernel, x, up(wg), up(wu), wd, wd, 128, 128, 2, 0, 0, 0, grid=2)
    h = (F.silu(x.float() @ wg.float()) * (x.float() @ wu.float())).bfloat16()
    close(result.outputs, (h.float() @ wd.float()).bfloat16(), rtol=2e-2)
    assert [len(_sends(result, core)) for core in (0, 1)] == [1, 1]


@pytest.mark.parametrize("r", [1, 100, 128, 129])
def test_row_statistics_keep_whole_rows_on_their_owner(r: int) -> None:
    """A LayerNorm epilogue needs every column of a row: over one row tile K is not split (core 0
    finishes it all), and at 129 rows each core owns a tile; either way the sums match."""
    module = load_module(GENERATED / "swiglu_ffn_ln" / "kernel.py", target="trn2")
    x, w1t, b1, wgt, bg, w2t, b2, a = inputs(r, 384, 300, seed=r)
    cols, up = module._columns, (lambda w: module._up_layout(w, (0,), 300))
    result = run(
        module.swiglu_ffn_ln_kernel, x, up(w1t), cols(b1, bg), up(wgt), w2t, b2, a, 1e-6, w2t,
        256, 128, 2, 0, 0, 0, grid=2,
    )  # fmt: skip
    x_new, z = result.outputs
    want_x = swiglu(x, w1t, b1, wgt, bg, w2t, b2) + a
    close(x_new, want_x, rtol=1e-3)
    close(z, F.layer_norm(want_x, (384,), eps=1e-6).bfloat16(), rtol=2e-2)
    writes = [sum(rec.hbm_write for rec in result.trace if rec.core == c) for c in (0, 1)]
    assert writes == ([r * 384 * 6, 0] if r <= 128 else [128 * 384 * 6, (r - 128) * 384 * 6])


def _arg_id(result, n: int) -> int:  # type: ignore[no-untyped-def]
    """The allocation of kernel argument `n` (arguments are allocated first, in order)."""
    return sorted({op[1] for rec in result.trace for op in rec.operands if op[2] == "shared_hbm"})[n]


SOLO = [  # (r, k, i, s, ci): I-tiles odd (3 with a ragged 44-wide last, 5 whole) and even (8: as SPLIT=2)
    (1, 256, 300, 128, 128),  # core 1 owns no rows: core 0 alone computes the odd tile
    (7, 640, 300, 128, 128),
    (100, 256, 640, 128, 256),
    (128, 640, 300, 128, 128),
    (129, 256, 300, 256, 128),  # core 1 owns one row: the odd tile over one column
    (200, 640, 1000, 256, 256),  # 8 I-tiles: nothing odd
    (256, 640, 300, 256, 128),  # the planner's case at R = 256: each core one owned tile, two K-blocks
    (256, 256, 640, 256, 128),  # two chunks per core, the odd tile joins the last
    (384, 256, 300, 384, 128),  # core 0 owns two row tiles, core 1 one
    (300, 256, 640, 128, 384),  # three super-blocks: the odd tile's rows differ per super-block
]


@pytest.mark.parametrize(("r", "k", "i", "s", "ci"), SOLO)
@pytest.mark.parametrize("spec", ["swiglu_ffn", "swiglu_ffn_ln"])
def test_odd_i_tile_per_owner_matches_formula(spec: str, r: int, k: int, i: int, s: int, ci: int) -> None:
    """SPLIT=3: each core an even share of the I-tiles, exchanged as SPLIT=2; the odd (last) I-tile computed
    by each core for the rows it owns only, its sums never exchanged; with row statistics (LayerNorm) and
    with a one-pass epilogue."""
    module = load_module(GENERATED / spec / "kernel.py", target="trn2")
    x, w1t, b1, wgt, bg, w2t, b2, a = inputs(r, k, i, seed=17 * r + i)
    cols, up = module._columns, (lambda w: module._up_layout(w, (0,), i))
    args = [x, up(w1t), cols(b1, bg), up(wgt), w2t, b2]
    ln = spec == "swiglu_ffn_ln"
    args += [a, 1e-6, w2t] if ln else [w2t]
    result = run(getattr(module, f"{spec}_kernel"), *args, s, ci, 3, 0, 0, 0, grid=2)
    want = swiglu(x, w1t, b1, wgt, bg, w2t, b2)
    if ln:
        x_new, z = result.outputs
        close(x_new, want + a, rtol=1e-3)
        close(z, F.layer_norm(want + a, (k,), eps=1e-6).bfloat16(), rtol=2e-2)
    else:
        close(result.outputs, want.bfloat16(), rtol=2e-2)
    assert "core_barrier" not in result.trace.op_counts()
    # the down weight crosses HBM once per super-block; the odd tile's, once per core owning rows there
    n_t, own, extra = -(-i // 128), min(r, -(-r // 256) * 128), 0
    for r0 in range(0, r, s) if n_t % 2 else ():
        extra += (r0 < own) + (min(r, r0 + s) > own) - 1
    solo = k * (i - (n_t - 1) * 128) * extra
    assert _weight_bytes_read(result, args=(4,)) == (k * i * -(-r // s) + solo) * 2


def _weight_bytes_read(result, args: tuple[int, ...]) -> int:  # type: ignore[no-untyped-def]
    """HBM bytes DMA'd from kernel arguments `args`; arguments are allocated first, in order."""
    reads = [
        (op[1], rec.hbm_read)
        for rec in result.trace
        for op in rec.operands
        if op[0] == "r" and op[2] == "shared_hbm" and rec.engine == "dma"
    ]
    ids = sorted({alloc for alloc, _ in reads})
    wanted = {ids[n] for n in args}
    return sum(nbytes for alloc, nbytes in reads if alloc in wanted)
