"""Sums over the tokens followed by elementwise post-ops, in shapes the Engram specs do not have: each spec is
built, its backward kernels run on the interpreter and compared with fp64 autograd through its reference."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fusegen.codegen.build import BuildOptions, build_spec
from fusegen.codegen.files.reference import reference_source
from fusegen.codegen.output import write_atomically
from fusegen.dsl import load_spec
from fusegen.dsl.ir import eval_shape
from fusegen.sim import load_module
from tests.codegen.test_autodiff import BAR, calc_diff, fp64_function

HEADER = """dim T, G, H
require H % 128 == 0
input x: bf16[T, G, H]
output out: bf16[T, G, H]
check T=130 G=2 H=256
"""
SPECS = {
    # grad_w = Σ_T(g_r·x) · 2w: the post-ops read the weight and a constant
    "sq_weight": """input w: bf16[G, H]
r = sum(x * square(w), axis=-1, keepdim=true)
out = x * sigmoid(r)
""",
    # w1 alone and inside the fused w1·w2: grad_w1 = Σ_T(g_r·x)·w2 + Σ_T(g_q·x), two token sums
    "two_sums": """input w1: bf16[G, H]
input w2: bf16[G, H]
r = sum(x * w1 * w2, axis=-1, keepdim=true)
q = sum(x * w1, axis=-1, keepdim=true)
out = x * sigmoid(r) + x * tanh(q)
""",
}


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("name", SPECS)
def test_post_ops_of_token_sums(name: str, lnc: int, tmp_path: Path) -> None:
    path = tmp_path / f"{name}.spec"
    path.write_text(f"kernel {name}\n{HEADER}{SPECS[name]}")
    write_atomically(tmp_path, build_spec(str(path), BuildOptions(out_dir=tmp_path)).files)
    ir = load_spec(str(path))[0]
    env = ir.checks[0].env()
    gen = torch.Generator().manual_seed(0)
    # weights near 0.1 keep sigmoid and tanh off their flat tails, where every gradient vanishes
    scales = [1.0 if i.name == "x" else 0.1 for i in ir.inputs]
    tensors = [
        (torch.randn(eval_shape(i.shape, env), generator=gen) * scale).to(torch.bfloat16)
        for i, scale in zip(ir.inputs, scales, strict=True)
    ]
    grad_out = torch.randn(eval_shape(ir.outputs[0].shape, env), generator=gen).to(torch.bfloat16)
    leaves = [t.double().requires_grad_(True) for t in tensors]
    out = fp64_function(reference_source(ir), f"{name}_reference")(*leaves)
    expected = torch.autograd.grad(out, leaves, grad_out.double())
    backward = getattr(load_module(tmp_path / name / "backward_kernel.py", target="trn2"), f"{name}_backward")
    got = backward(*tensors, grad_out, lnc=lnc)
    diffs = [calc_diff(g, e) for g, e in zip(got, expected, strict=True)]
    assert max(diffs) < BAR, diffs  # measured ≤ 2.8e-14
