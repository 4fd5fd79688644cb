"""The row-reduction family beyond the Engram gate: two reduction levels, an [H] weight, max, chunking."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import torch

from fusegen.codegen.build import BuildOptions, build_spec
from fusegen.codegen.output import write_atomically
from fusegen.sim import load_module

#: a per-head LayerNorm with an [H] gain and a row max: the variance reads the mean (a second pass).
SPEC = """\
kernel head_norm
dim T, G, H
input x: bf16[T, G, H]
input w: bf16[H]
param eps = 1e-5
output y: bf16[T, G, H]
output peak: f32[T, G]
mu = mean(x, axis=-1, keepdim=true)
var = mean(square(x - mu), axis=-1, keepdim=true)
y = (x - mu) * rsqrt(var + eps) * w
m = max(x, axis=-1, keepdim=true)
peak = m[:, :, 0]
check T=130 G=3 H=384
"""


@pytest.fixture(scope="module")
def head_norm(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    out = tmp_path_factory.mktemp("gen")
    spec = out / "head_norm.spec"
    spec.write_text(SPEC)
    built = build_spec(str(spec), BuildOptions(out_dir=out))
    write_atomically(out, built.files)
    return load_module(out / "head_norm" / "kernel.py")


def formula(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    xf = x.double()
    centred = xf - xf.mean(-1, keepdim=True)
    y = centred * torch.rsqrt(centred.square().mean(-1, keepdim=True) + 1e-5) * w.double()
    return y.bfloat16(), xf.amax(-1)


@pytest.mark.parametrize("hb", [384, 128])
def test_two_levels_and_max_match_the_formula(head_norm: ModuleType, hb: int) -> None:
    gen = torch.Generator().manual_seed(7)
    x = (torch.randn(130, 3, 384, generator=gen) * 3 + 1).bfloat16()
    w = torch.randn(384, generator=gen).bfloat16()
    y, peak = head_norm.head_norm_kernel[2](x, w, 1e-5, hb, True, True, False, False)
    want_y, want_peak = formula(x, w)
    assert (y.float() - want_y.float()).abs().max() <= 2e-2 * want_y.float().abs().max()
    assert torch.equal(peak, want_peak.float())


def test_two_reduction_passes_are_generated(head_norm: ModuleType) -> None:
    source = Path(head_norm.__file__).read_text()

    def body(function: str) -> str:
        return source.split(f"def {function}(")[1].split("\ndef ")[0]

    assert body("_row_passes").count("# reduction pass") == 2  # once, called by both passes helpers
    assert "= _row_passes(" in body("_head_passes") and "= _row_passes(" in body("_tile_passes")
    assert body("_stream_passes").count("# reduction pass") == 2  # the same passes streamed from HBM
    assert "op=nl.maximum" in source
