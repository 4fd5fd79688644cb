"""K halves (LNC 2, one row tile): the received half's sums plus this core's are the block epilogue's input;
an epilogue that only casts them has the add write the cast's destination, no cast after the exchange."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fusegen.codegen.ffn.lower import lower_ffn
from fusegen.codegen.ffn.match import match_ffn
from fusegen.dsl import load_spec
from fusegen.sim import load_module, run

ROOT = Path(__file__).resolve().parents[2]


def _late_work(spec: str) -> list[str] | None:
    """The instructions (DMAs aside) the late block epilogue over `blk + acc` emits; None: none of its own."""
    ir, _ = load_spec(str(ROOT / "examples" / f"{spec}.spec"))
    stage = lower_ffn(ir, match_ffn(ir)).late_add
    if stage is None:
        return None
    lines = [line for ps in stage.passes for line in ps.lines]
    return [line for line in lines if line.startswith("nisa.") and not line.startswith("nisa.dma_copy")]


@pytest.mark.parametrize("spec", ["swiglu_ffn", "llama_swiglu"])
def test_a_cast_only_epilogue_is_the_add(spec: str) -> None:
    """The epilogue casts the sums to the bf16 output: one instruction, the add on GpSimd into that output."""
    work = _late_work(spec)
    assert work is not None and len(work) == 1
    assert work[0].startswith("nisa.tensor_tensor(") and "op=nl.add" in work[0] and "gpsimd" in work[0]
    assert "data1=blk[0:pr, 0:nb], data2=acc[rs][0:pr, k0:k0 + nb]" in work[0]


def test_an_epilogue_doing_more_keeps_its_own_code() -> None:
    """swiglu_fp8 scales and biases the sums before the cast: no fused add (the template adds into `blk`)."""
    assert _late_work("swiglu_fp8") is None


@pytest.mark.parametrize(("r", "k", "i", "ci"), [(128, 1280, 640, 128), (7, 640, 300, 384)])
def test_the_received_add_writes_the_output(r: int, k: int, i: int, ci: int) -> None:
    """On the interpreter (swiglu_ffn, split 2 over one row tile): on each core the received tile is read
    once, by a GpSimd add writing a bf16 tile that the output's DMA reads; no cast in between."""
    module = load_module(ROOT / "generated" / "swiglu_ffn" / "kernel.py", target="trn2")
    gen = torch.Generator().manual_seed(r + k + i)
    x = torch.randn(r, k, generator=gen).bfloat16()
    w1t, wgt = ((torch.randn(k, i, generator=gen) * k**-0.5).bfloat16() for _ in range(2))
    b1, bg, b2 = torch.randn(i, generator=gen), torch.randn(i, generator=gen), torch.randn(k, generator=gen)
    w2t = (torch.randn(i, k, generator=gen) * i**-0.5).bfloat16()
    cols, up = module._columns, (lambda w: module._up_layout(w, (0,), i))
    result = run(
        module.swiglu_ffn_kernel, x, up(w1t), cols(b1, bg), up(wgt), w2t, b2, w2t, 128, ci, 2, 0, 0, 0, grid=2
    )
    h = (torch.nn.functional.silu(x.float() @ w1t.float() + b1) * (x.float() @ wgt.float() + bg)).bfloat16()
    want = (h.float() @ w2t.float() + b2).bfloat16().float()
    assert (result.outputs.float() - want).abs().max().item() <= 2e-2 * want.abs().max().item()
    for core in (0, 1):
        recs = [rec for rec in result.trace if rec.core == core]
        (got,) = [op[1] for rec in recs if rec.op == "sendrecv" for op in rec.operands if op[0] == "w"]
        readers = [rec for rec in recs if any(op[:2] == ("r", got) for op in rec.operands)]
        assert [(rec.engine, rec.op) for rec in readers] == [("gpsimd", "tensor_tensor")]
        (dst,) = [op for op in readers[0].operands if op[0] == "w"]
        assert dst[4] == "bfloat16"  # the output's dtype: the add wrote the cast's destination
        readers = [rec for rec in recs if any(op[:2] == ("r", dst[1]) for op in rec.operands)]
        assert [rec.op for rec in readers] == ["dma_copy"]
        assert any(op[0] == "w" and op[2] == "shared_hbm" for op in readers[0].operands)
