"""Generated FFN kernels on the interpreter against independent hand-written torch formulas."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from fusegen.sim import load_module, run
from tests.codegen.ffn_formula import GENERATED, close, inputs, swiglu

SHAPES = [(1, 128, 128), (129, 256, 300), (300, 384, 1000), (256, 1280, 3416)]


@pytest.mark.parametrize(("r", "k", "i"), SHAPES)
@pytest.mark.parametrize(("target", "lnc"), [("trn2", 2), ("trn2", 1), ("trn1", 1)])
def test_swiglu_ffn_matches_formula(r: int, k: int, i: int, target: str, lnc: int) -> None:
    module = load_module(GENERATED / "swiglu_ffn" / "kernel.py", target=target)
    x, w1t, b1, wgt, bg, w2t, b2, _ = inputs(r, k, i, seed=r + k + i)
    out = module.swiglu_ffn(x, w1t, b1, wgt, bg, w2t, b2, lnc=lnc, target=target)
    assert out.dtype == torch.bfloat16 and out.shape == (r, k)
    close(out, swiglu(x, w1t, b1, wgt, bg, w2t, b2).bfloat16(), rtol=2e-2)


@pytest.mark.parametrize(("r", "k", "i"), SHAPES)
def test_swiglu_ffn_ln_matches_formula(r: int, k: int, i: int) -> None:
    module = load_module(GENERATED / "swiglu_ffn_ln" / "kernel.py", target="trn2")
    args = inputs(r, k, i, seed=7 * r + k)
    x_new, z = module.swiglu_ffn_ln(*args, eps=1e-6, lnc=2)
    want_x = swiglu(*args[:7]) + args[7]
    want_z = F.layer_norm(want_x, (k,), eps=1e-6)
    assert x_new.dtype == torch.float32 and z.dtype == torch.bfloat16
    close(x_new, want_x, rtol=1e-3)
    close(z, want_z.bfloat16(), rtol=2e-2)


def test_inference_only() -> None:
    module = load_module(GENERATED / "swiglu_ffn" / "kernel.py", target="trn2")
    args = inputs(4, 128, 128, seed=0)[:7]
    args[0] = args[0].clone().requires_grad_()
    with pytest.raises(RuntimeError, match="inference-only"):
        module.swiglu_ffn(*args)


@settings(max_examples=12, deadline=None, derandomize=True)
@given(
    r=st.integers(1, 400), k=st.integers(1, 4).map(lambda n: 128 * n), i=st.integers(1, 700),
    lnc=st.sampled_from([1, 2]),
)  # fmt: skip
def test_random_shapes_match_formula(r: int, k: int, i: int, lnc: int) -> None:
    """Any R >= 1 and any I (ragged tiles everywhere), with the plan the host function picks."""
    module = load_module(GENERATED / "swiglu_ffn_ln" / "kernel.py", target="trn2")
    args = inputs(r, k, i, seed=r * 7919 + i)
    x_new, z = module.swiglu_ffn_ln(*args, eps=1e-6, lnc=lnc)
    want_x = swiglu(*args[:7]) + args[7]
    close(x_new, want_x, rtol=1e-3)
    close(z, F.layer_norm(want_x, (k,), eps=1e-6).bfloat16(), rtol=2e-2)


def _first_hbm_write_and_last_matmul(result, core: int) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """Trace positions on `core`: its first DMA into a shared HBM tensor, and its last matmul."""
    records = [rec for rec in result.trace if rec.core == core]
    writes = [rec.index for rec in records if rec.engine == "dma" and rec.hbm_write > 0]
    matmuls = [rec.index for rec in records if rec.op == "nc_matmul"]
    return min(writes), max(matmuls)


@pytest.mark.parametrize("split", [0, 1])
def test_the_last_chunk_overlaps_the_epilogue_and_the_exchange(split: int) -> None:
    """Issue 15: each row tile's epilogue (split over rows) or the other core's partial sums (split over I)
    leave during the last chunk, before its last matmul, not after the chunk loop; results stay right."""
    module = load_module(GENERATED / "swiglu_ffn" / "kernel.py", target="trn2")
    r, k, i = 256, 256, 640
    x, w1t, b1, wgt, bg, w2t, b2, _ = inputs(r, k, i, seed=5)
    cols, up = module._columns, (lambda w: module._up_layout(w, (0,), i))
    args = (x, up(w1t), cols(b1, bg), up(wgt), w2t, b2)
    result = run(module.swiglu_ffn_kernel, *args, w2t, 256, 128, split, 0, 0, 0, grid=2 if split else 1)
    close(result.outputs, swiglu(x, w1t, b1, wgt, bg, w2t, b2).bfloat16(), rtol=2e-2)
    for core in range(2 if split else 1):
        first_write, last_matmul = _first_hbm_write_and_last_matmul(result, core)
        assert first_write < last_matmul, f"core {core}: nothing left HBM-bound before the last matmul"


@pytest.mark.parametrize(("k", "transfers"), [(1024, 1), (1536, 1), (2048, 4)])
def test_x_rows_are_read_whole_up_to_the_dma_knee(k: int, transfers: int) -> None:
    """x's rows are staged whole while 3 F_MOV blocks of bf16 reach the DMA packet knee (K <= 1536), one
    2-3 KiB partition row per DMA; wider rows in 512-column blocks (1 KiB rows)."""
    module = load_module(GENERATED / "swiglu_ffn" / "kernel.py", target="trn2")
    r, i = 130, 128
    x, w1t, b1, wgt, bg, w2t, b2, _ = inputs(r, k, i, seed=k)
    cols, up = module._columns, (lambda w: module._up_layout(w, (0,), i))
    args = (x, up(w1t), cols(b1, bg), up(wgt), w2t, b2)
    result = run(module.swiglu_ffn_kernel, *args, w2t, 256, 128, 0, 0, 0, 0)
    close(result.outputs, swiglu(x, w1t, b1, wgt, bg, w2t, b2).bfloat16(), rtol=2e-2)
    x_id = min(op[1] for rec in result.trace for op in rec.operands if op[2] == "shared_hbm")
    reads = [rec for rec in result.trace if rec.engine == "dma" and any(op[1] == x_id for op in rec.operands)]
    assert len(reads) == 2 * transfers  # two row tiles (128 + 2 rows)
    assert sum(rec.hbm_read for rec in reads) == r * k * 2
