"""`None` in an index inserts a size-1 axis (NumPy's newaxis), and rewrites.keep_axes turns keepdim=false
row statistics and their `[:, None]` into the [T, 1] form the families lower, without changing the math
(the reference, which runs the spec's own IR, agrees with torch's own indexing)."""

from __future__ import annotations

import pytest
import torch

from fusegen.codegen.files.reference import reference_lines
from fusegen.codegen.rewrites import keep_axes, rewrite
from fusegen.dsl import SpecError, check, parse
from fusegen.dsl.ir import KernelIR, shape_str

HEAD = "kernel k\ndim T, H, G\ninput x: f32[T, H]\ninput q: f32[T, G, H]\ninput w: f32[H]\n"


def _ir(body: str, output: str = "y: f32[T, H]") -> KernelIR:
    return check(parse(f"{HEAD}output {output}\n{body}\ncheck T=4 H=8 G=2\n", "t.spec"))


def _value_shape(ir: KernelIR, name: str) -> str:
    return shape_str(next(n for n in ir.nodes if n.name == name).shape)


@pytest.mark.parametrize(
    ("expr", "shape"),
    [
        ("sum(x, axis=-1)[:, None]", "[T, 1]"),
        ("sum(q, axis=-1)[:, :, None]", "[T, G, 1]"),
        ("sum(q, axis=-1)[:, None]", "[T, 1, G]"),  # omitted trailing dims follow the new axis
        ("w[None, :]", "[1, H]"),
        ("x[0:2, None]", "[2, 1, H]"),
        ("x[:, 3, None]", "[T, 1]"),
    ],
)
def test_none_inserts_a_size_one_axis_where_it_stands(expr: str, shape: str) -> None:
    ir = _ir(f"v = {expr}\ny = x * 2")
    assert _value_shape(ir, "v") == shape


def test_none_counts_as_no_dim() -> None:
    with pytest.raises(SpecError, match=r"too many indices: \[T, H\] has 2 dims, got 3"):
        _ir("v = x[:, None, :, :]\ny = x * 2")


def test_a_statistic_broadcast_back_becomes_the_kept_axis() -> None:
    ir = _ir("rstd = rsqrt(mean(square(x), axis=-1) + 1e-6)\ny = x * rstd[:, None]")
    kept = rewrite(ir)
    assert not any(n.op == "unindex" for n in kept.nodes)
    means = [n for n in kept.nodes if n.op == "mean"]
    assert len(means) == 1 and means[0].attr("keepdim") is True and shape_str(means[0].shape) == "[T, 1]"
    assert shape_str(next(n for n in kept.nodes if n.op == "rsqrt").shape) == "[T, 1]"


def test_a_dropped_output_is_the_drop_of_the_kept_statistic() -> None:
    ir = _ir("rstd = rsqrt(mean(square(x), axis=-1) + 1e-6)", output="rstd: f32[T]")
    kept = keep_axes(ir)
    out = kept.node(kept.outputs[0].node)
    assert out.op == "index" and shape_str(out.shape) == "[T]"
    assert shape_str(kept.node(out.args[0]).shape) == "[T, 1]" and kept.node(out.args[0]).op == "rsqrt"


def test_specs_without_dropped_axes_come_back_unchanged() -> None:
    ir = _ir("m = mean(x, axis=-1, keepdim=true)\ny = x - m")
    assert keep_axes(ir) is ir
    token_sum = _ir("s = sum(q, axis=0)", output="s: f32[G, H]")
    assert keep_axes(token_sum) is token_sum  # only reductions over the last axis keep it


def test_the_reference_indexes_as_torch_does() -> None:
    ir = _ir("r = mean(x, axis=-1)\ny = x * r[:, None]")
    scope: dict[str, object] = {"torch": torch, "x": torch.randn(4, 8), "q": torch.zeros(4, 2, 8),
                                "w": torch.zeros(8)}
    exec("\n".join(reference_lines(ir)), scope)  # the generated reference's own lines
    x = scope["x"]
    assert isinstance(x, torch.Tensor)
    out = next(v for k, v in scope.items() if k == "_y")
    torch.testing.assert_close(out, x * x.mean(-1)[:, None], rtol=0, atol=0)
