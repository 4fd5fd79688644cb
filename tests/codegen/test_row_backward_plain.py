"""A [T, G, H] spec without weights trains through its generated backward kernel (bench/fuzz.py --oracle,
seed 8: the kernel called `_prepare_weights`, which only specs with weights define, so every backward of such
a spec raised NameError)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from fusegen.cli import main
from fusegen.codegen.files.ops import load_ops

SPEC = """kernel plain_rows_bwd
dim T, G, H
input x: f32[T, G, H]
param eps = 0.1
output y: f32[T, G, H]
y = x * rsqrt(mean(square(x), axis=-1, keepdim=true) + eps) + x * 2.0
check T=3 G=2 H=256
"""


def test_a_weightless_row_spec_trains_through_its_backward_kernel(tmp_path: Path) -> None:
    spec = tmp_path / "plain.spec"
    spec.write_text(SPEC)
    assert main(["build", "--out", str(tmp_path / "out"), str(spec)]) == 0
    folder = tmp_path / "out" / "plain_rows_bwd"
    assert "backward_kernel.py" in (folder / "ops.py").read_text()  # the kernel, not backward_reference.py
    load_ops(folder)
    gen = torch.Generator().manual_seed(8)
    x, cot = torch.randn((3, 2, 256), generator=gen), torch.randn((3, 2, 256), generator=gen)
    xg = x.clone().requires_grad_(True)
    (torch.ops.fusegen.plain_rows_bwd(xg, eps=0.1) * cot).sum().backward()
    x64 = x.double().requires_grad_(True)
    ((F.rms_norm(x64, (256,), eps=0.1) + 2 * x64) * cot.double()).sum().backward()
    assert xg.grad is not None and x64.grad is not None
    torch.testing.assert_close(xg.grad.double(), x64.grad, rtol=1e-5, atol=1e-5)
