"""The generated reference in row chunks (forced by a tiny memory budget) matches it whole."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fusegen.codegen.files.reference_chunks import row_chunks
from fusegen.dsl import load_spec
from fusegen.sim import load_module
from fusegen.testing import load_generated, make_inputs

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("spec", "dims"),
    [
        ("engram_gate", {"T": 37, "HC": 4, "H": 256}),
        ("swiglu_rmsnorm", {"R": 37, "K": 256, "I": 300}),
        ("prenorm_swiglu", {"R": 21, "K": 128, "I": 200}),
    ],
)
def test_row_chunks_match_the_whole(spec: str, dims: dict[str, int], monkeypatch: pytest.MonkeyPatch) -> None:
    directory = ROOT / "generated" / spec
    generated_test = load_generated(directory / f"test_{spec}.py")
    args = make_inputs(generated_test.INPUTS, generated_test.input_shapes(dims))
    module = load_module(directory / "reference.py")
    reference = getattr(module, f"{spec}_reference")
    whole = reference(*args)
    monkeypatch.setattr(module, "_MEMORY_BUDGET", 1)  # one row per chunk
    chunked = reference(*args)
    for got, want in zip(chunked if isinstance(chunked, tuple) else (chunked,),
                         whole if isinstance(whole, tuple) else (whole,), strict=True):  # fmt: skip
        # f32 GEMMs over fewer rows may sum in another order: torch's default tolerance of each dtype
        torch.testing.assert_close(got, want)


def test_a_reduction_over_rows_is_not_chunked() -> None:
    """A value that mixes rows (here the backward's weight gradient, summed over tokens) keeps it whole."""
    ir, _ = load_spec(str(ROOT / "examples" / "engram_gate.spec"))
    assert row_chunks(ir) is not None
    backward = (ROOT / "generated" / "engram_gate" / "backward_reference.py").read_text(encoding="utf-8")
    assert "MEMORY_BUDGET" not in backward
