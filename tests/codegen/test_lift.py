"""Lifting 2-D row-wise specs to [T, 1, H]: the same values, shapes and axes moved as documented."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fusegen.codegen.rowreduce.lift import lift_rows
from fusegen.dsl import check, load_spec, parse
from tests.codegen.test_rewrites import reference_module

REPO = Path(__file__).resolve().parents[2]
ADD_RMSNORM = """\
kernel add_rmsnorm
dim T, H
input x: bf16[T, H]
input r: bf16[T, H]
input w: bf16[H]
param eps = 1e-6
output y: bf16[T, H]
output h: bf16[T, H]
output rstd: f32[T]
output ms: f32[T, 1]
s = x + r
h = bf16(s)
ms = mean(square(s), axis=-1, keepdim=true)
rstd = rsqrt(ms + eps)[:, 0]
y = rmsnorm(s, eps, w)
check T=5 H=256
"""

SOFTMAX = """\
kernel row_softmax
dim T, H
input x: f32[T, H]
param scale = 0.125
output p: f32[T, H]
z = x * scale
e = exp(z - max(z, axis=1, keepdim=true))
p = e / sum(e, axis=-1, keepdim=true)
check T=5 H=256
"""


@pytest.mark.parametrize("text", [ADD_RMSNORM, SOFTMAX], ids=["add_rmsnorm", "softmax"])
def test_lifted_ir_computes_the_same_values(text: str, tmp_path: Path) -> None:
    ir = check(parse(text, "inline.spec"))
    lifted = lift_rows(ir)
    assert lifted is not None
    ordered = all(n.id == i and all(a < n.id for a in n.args) for i, n in enumerate(lifted.ir.nodes))
    assert ordered
    gen = torch.Generator().manual_seed(0)
    args = [torch.randn([d.eval({"T": 5, "H": 256}) for d in i.shape], generator=gen).to(
        {"bf16": torch.bfloat16, "f32": torch.float32}[i.dtype]) for i in ir.inputs]  # fmt: skip
    want = getattr(reference_module(ir, tmp_path, "flat"), f"{ir.name}_reference")(*args)
    head_axis = {**dict.fromkeys(lifted.row_inputs, 1), **dict.fromkeys(lifted.weight_inputs, 0)}
    lifted_args = [a.unsqueeze(head_axis[i.name]) if i.name in head_axis else a
                   for a, i in zip(args, ir.inputs, strict=True)]  # fmt: skip
    got = getattr(reference_module(lifted.ir, tmp_path, "lifted"), f"{ir.name}_reference")(*lifted_args)
    want, got = (v if isinstance(v, tuple) else (v,) for v in (want, got))
    for out, w, g in zip(ir.outputs, want, got, strict=True):
        g = g.squeeze(1) if out.name in lifted.squeezed_outputs else g
        assert g.shape == w.shape and torch.equal(g, w), out.name


def test_shapes_axes_and_kept_dim_outputs() -> None:
    lifted = lift_rows(check(parse(ADD_RMSNORM, "inline.spec")))
    assert lifted is not None
    shapes = {d.name: [str(x) for x in d.shape] for d in lifted.ir.inputs}
    assert shapes == {"x": ["T", "1", "H"], "r": ["T", "1", "H"], "w": ["1", "H"]}
    assert lifted.row_inputs == ("x", "r") and lifted.weight_inputs == ("w",)
    assert lifted.squeezed_outputs == ("y", "h", "rstd")  # ms [T, 1] is read back through [:, :, 0]
    means = [n for n in lifted.ir.nodes if n.op == "mean"]
    assert [n.attr("axis") for n in means] == [2]


@pytest.mark.parametrize("example", ["engram_gate", "swiglu_ffn"])
def test_three_d_specs_and_matmuls_are_not_lifted(example: str) -> None:
    assert lift_rows(load_spec(str(REPO / "examples" / f"{example}.spec"))[0]) is None
