"""The FFN kernel's down-projection order (`down_order`): every (I-tile, K-block) matmul once, and each
K-block's first matmul overwrites PSUM (accumulate=False) whichever I-tile comes first."""

from __future__ import annotations

import pytest

from fusegen.codegen.ffn.sbuf import P, down_order, k_spans, paired_tiles


@pytest.mark.parametrize("i", [700, 1536, 2000, 3416])
@pytest.mark.parametrize("k", [256, 1280, 1536])
@pytest.mark.parametrize("core", [0, 1])
def test_each_block_starts_with_an_overwrite(i: int, k: int, core: int) -> None:
    n_h = -(-i // P)
    share = -(-n_h // 2)
    # core 1 the first share of I, core 0 the last (with the ragged tile)
    its = list(range(share)) if core else list(range(share, n_h))
    blocks = k_spans(k, core * (k // 2), k // 2)
    steps = down_order(len(its), blocks, paired_tiles(its, i))
    every = [(hl, ko) for hl in range(len(its)) for ko in range(len(blocks))]
    assert sorted((hl, ko) for hl, ko, _ in steps) == every
    seen: set[int] = set()
    for _, ko, accumulate in steps:
        assert accumulate == (ko in seen)  # the first matmul into a block overwrites, every later one adds
        seen.add(ko)


def test_ragged_tile_before_the_pairs_overwrites() -> None:
    """I=700 (a 60-wide last I-tile): the core holding it computes it first, before the paired whole tiles,
    so its matmuls must start the accumulation (the interpreter rejects accumulate=True on fresh PSUM)."""
    its = [3, 4, 5]
    steps = down_order(3, k_spans(256, 0, 128), paired_tiles(its, 700))
    assert steps[0][0] == 2 and steps[0][2] is False
