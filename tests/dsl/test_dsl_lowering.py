"""What each construct lowers to: ops, attributes, shapes and dtypes of the IR nodes."""

from __future__ import annotations

import pytest

from fusegen.dsl import check, parse
from fusegen.dsl.ir import Dim, IndexItem, KernelIR, Node

PRELUDE = """\
kernel k
dim R, K, HC = 4
input x: bf16[R, K]
input kv: bf16[R, HC + 1, K]
input g: f32[K]
param eps = 1e-5
"""


def lower(statement: str, out_type: str) -> tuple[KernelIR, Node]:
    """Check a one-statement spec; return the IR and the node of `y`."""
    text = f"{PRELUDE}output y: {out_type}\ny = {statement}\ncheck R=3 K=8\n"
    kernel = check(parse(text, "t.spec"))
    return kernel, kernel.node(kernel.outputs[0].node)


def ops(kernel: KernelIR) -> list[str]:
    """The ops after the declarations."""
    return [n.op for n in kernel.nodes if n.op not in ("input", "param")]


@pytest.mark.parametrize(
    ("statement", "out_type", "expected_ops"),
    [
        ("-x", "f32[R, K]", ["neg"]),
        ("x - 1", "f32[R, K]", ["const", "sub"]),
        ("x * -1", "f32[R, K]", ["const", "mul"]),
        ("square(x) / x", "f32[R, K]", ["square", "div"]),
        ("gelu_tanh(x) + gelu(x)", "f32[R, K]", ["gelu_tanh", "gelu", "add"]),
        ("relu(tanh(exp(x)))", "f32[R, K]", ["exp", "tanh", "relu"]),
        ("minimum(x, eps)", "f32[R, K]", ["minimum"]),
        ("where(x >= 0, x, 0.5 * x)", "f32[R, K]", ["const", "ge", "const", "mul", "where"]),
        ("f16(x) + bf16(x)", "f16[R, K]", ["cast", "cast", "add"]),
        ("rmsnorm(x, eps, g)", "bf16[R, K]", ["rmsnorm"]),
        ("layernorm(x, 1e-6, g, g)", "f32[R, K]", ["const", "layernorm"]),
        ("x * K", "f32[R, K]", ["dim", "mul"]),
    ],
)
def test_ops(statement: str, out_type: str, expected_ops: list[str]) -> None:
    kernel, _ = lower(statement, out_type)
    assert ops(kernel) == expected_ops


def test_pow_keeps_a_constant_exponent() -> None:
    _, node = lower("x ** 2", "f32[R, K]")
    assert (node.op, node.attrs, node.dtype) == ("pow", (("exponent", 2.0),), "f32")


def test_clamp_keywords() -> None:
    _, node = lower("clamp(x, max=6)", "f32[R, K]")
    assert node.attrs == (("lo", None), ("hi", 6.0))
    _, node = lower("clamp(x, -1, None)", "f32[R, K]")
    assert node.attrs == (("lo", -1.0), ("hi", None))


def test_reduction_normalizes_the_axis() -> None:
    _, node = lower("max(x, axis=-2, keepdim=true)", "f32[1, K]")
    assert node.attrs == (("axis", 0), ("keepdim", True))
    assert node.shape == (Dim.const(1), Dim.sym("K"))


def test_index_at_a_dim_drops_it_and_keeps_the_dtype() -> None:
    _, node = lower("kv[:, HC]", "bf16[R, K]")
    assert node.dtype == "bf16"
    assert node.attr("index") == (
        IndexItem("slice", Dim.const(0), Dim.sym("R")),
        IndexItem("at", Dim.sym("HC")),
        IndexItem("slice", Dim.const(0), Dim.sym("K")),
    )


def test_broadcast_aligns_trailing_dims() -> None:
    _, node = lower("kv[:, 0:HC, :] * kv[:, HC:HC + 1, :] + g", "f32[R, HC, K]")
    assert node.shape == (Dim.sym("R"), Dim.sym("HC"), Dim.sym("K"))


def test_matmul_of_bf16_is_f32_and_output_casts_on_store() -> None:
    text = PRELUDE.replace("input g: f32[K]", "input w: bf16[K, R]")
    text += "output y: bf16[R, R]\ny = x @ w\ncheck R=3 K=8\n"
    kernel = check(parse(text, "t.spec"))
    node = kernel.node(kernel.outputs[0].node)
    assert (node.op, node.dtype, kernel.outputs[0].dtype) == ("matmul", "f32", "bf16")


def test_constants_and_dims_are_shared() -> None:
    kernel, _ = lower("x * 2 + x * 2 + K + K", "f32[R, K]")
    assert ops(kernel) == ["const", "mul", "mul", "add", "dim", "add", "add"]


def test_fixed_dims_join_every_check() -> None:
    kernel, _ = lower("-x", "f32[R, K]")
    assert kernel.checks[0].env() == {"HC": 4, "K": 8, "R": 3}
    assert kernel.fixed_dims() == {"HC": 4}


def test_constraints_normalize_to_dims_on_the_left() -> None:
    text = PRELUDE + "require 8 <= K\nrequire K + 1 <= 2 * R\nrequire 0 == K % 8\n"
    text += "output y: f32[R, K]\ny = -x\ncheck R=8 K=8\n"
    kernel = check(parse(text, "t.spec"))
    assert [str(c) for c in kernel.constraints] == ["K >= 8", "K - 2*R <= -1", "K % 8 == 0"]
