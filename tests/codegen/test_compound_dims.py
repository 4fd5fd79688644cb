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


FFN_WIDTHS = {
    "inter": ("K", "2*I", "check R=4 K=128 I=64"),
    "hidden": ("K + 128", "I", "check R=3 K=128 I=40"),
}


@pytest.mark.parametrize("name", FFN_WIDTHS)
def test_an_ffn_whose_width_is_a_dim_expression_builds_and_runs(name: str, tmp_path: Path) -> None:
    """An FFN's hidden or intermediate axis spelled as an expression (a packed `2*I`) reached the planner
    as a dim name: KeyError '2*I', exit 3. Now it plans, its plan names the spec's dims, and the host
    matches a float64 formula at a width the check line does not give."""
    hidden, inter, check = FFN_WIDTHS[name]
    spec = tmp_path / f"{name}.spec"
    spec.write_text(
        f"kernel {name}\ndim R, K, I\nrequire K % 128 == 0\ninput x: bf16[R, {hidden}]\n"
        f"input w1t: bf16[{hidden}, {inter}]\ninput w2t: bf16[{inter}, {hidden}]\n"
        f"output o: f32[R, {hidden}]\n"
        f"o = bf16(silu(x @ w1t)) @ w2t\n{check}\n"
    )
    assert main(["build", "--out", str(tmp_path / "out"), str(spec)]) == 0
    folder = tmp_path / "out" / name
    headings = [line for line in (folder / "plan.md").read_text().splitlines() if line.startswith("## ")]
    assert headings and all("*" not in line and "+" not in line for line in headings), headings
    gen = torch.Generator().manual_seed(7)
    rows, k, i = 5, (256 if name == "hidden" else 128), (130 if name == "inter" else 67)
    x = torch.randn(rows, k, generator=gen).bfloat16()
    w1t = (torch.randn(k, i, generator=gen) * k**-0.5).bfloat16()
    w2t = (torch.randn(i, k, generator=gen) * i**-0.5).bfloat16()
    h = torch.nn.functional.silu(x.double() @ w1t.double())
    want = h.bfloat16().double() @ w2t.double()
    got = getattr(load_module(folder / "kernel.py", target="trn2"), name)(x, w1t, w2t, lnc=1)
    torch.testing.assert_close(got.double(), want, rtol=1e-3, atol=1e-3)
