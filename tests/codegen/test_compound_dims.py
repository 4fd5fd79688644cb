"""Dims that appear only inside compound axes (`x: [T, 2*D]`, `[T, D + E]` with E fixed) are solved from the
runtime shapes by every generated entry point: the reference and the host run at the check shape and
match a hand-written formula; a width no whole dim gives is a ValueError naming the argument."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fusegen.cli import main
from fusegen.sim import load_module
from fusegen.testing import load_generated

SPECS = {
    "twice": ("dim T, D", "2*D", "check T=4 D=64"),
    "offset": ("dim T, D, E = 128", "D + E", "check T=3 D=128"),
}


def _build(tmp_path: Path, name: str) -> Path:
    dims, width, check = SPECS[name]
    spec = tmp_path / f"{name}.spec"
    spec.write_text(
        f"kernel {name}\n{dims}\ninput x: f32[T, {width}]\ninput w: f32[{width}]\nparam eps = 1e-6\n"
        f"output y: f32[T, {width}]\ny = rmsnorm(x, eps, w)\n{check}\n"
    )
    assert main(["build", "--out", str(tmp_path / "out"), str(spec)]) == 0
    return tmp_path / "out" / name


@pytest.mark.parametrize(("name", "rows", "width"), [("twice", 4, 128), ("offset", 3, 256)])
def test_a_solved_dim_runs_in_the_reference_and_the_host(name: str, rows: int, width: int, tmp_path: Path
                                                          ) -> None:  # fmt: skip
    folder = _build(tmp_path, name)
    gen = torch.Generator().manual_seed(width)
    x, w = torch.randn(rows, width, generator=gen), torch.randn(width, generator=gen)
    want = x / x.pow(2).mean(dim=1, keepdim=True).add(1e-6).sqrt() * w
    reference = load_generated(folder / "reference.py")
    torch.testing.assert_close(getattr(reference, f"{name}_reference")(x, w), want, rtol=1e-5, atol=1e-5)
    kernel = load_module(folder / "kernel.py", target="trn2")
    torch.testing.assert_close(getattr(kernel, name)(x, w, lnc=1), want, rtol=1e-5, atol=1e-5)


def test_a_width_no_whole_dim_gives_names_the_argument(tmp_path: Path) -> None:
    kernel = load_module(_build(tmp_path, "twice") / "kernel.py", target="trn2")
    with pytest.raises(ValueError, match=r"twice: x: axis `2\*D` has size 129, which no whole `D` gives"):
        kernel.twice(torch.zeros(2, 129), torch.zeros(129), lnc=1)
    with pytest.raises(ValueError, match=r"twice: w: expected \[2\*D=128\] \(D from x\), got \[130\]"):
        kernel.twice(torch.zeros(2, 128), torch.zeros(130), lnc=1)
