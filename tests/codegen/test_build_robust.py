"""Specs the checker accepts but a family cannot take end in a diagnostic, never a traceback; what builds
compiles."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fusegen.cli import main
from fusegen.codegen import build
from fusegen.codegen.files import tests as tests_file
from fusegen.dsl import load_spec
from fusegen.dsl.diagnostics import SpecError
from fusegen.testing import load_generated

ROOT = Path(__file__).resolve().parents[2]
ROWS = (
    "kernel k\ndim T, H\nrequire H % 128 == 0\ninput x: f32[T, H]\ninput r: f32[T, H]\ninput w: f32[H]\n"
    "param eps = 1e-6\noutput y: f32[T, H]\n"
)


@pytest.mark.parametrize("op", ["exp(eps)", "log(eps)", "sigmoid(eps)", "clamp(eps, 0.0, 1.0)"])
def test_scalar_math_a_stage_cannot_express_is_a_spec_error(
    op: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "k.spec"
    spec.write_text(ROWS + f"y = rmsnorm(x + r, eps, w) * {op}\ncheck T=4 H=128\n")
    assert main(["build", "--out", str(tmp_path / "out"), str(spec)]) == 2
    err = capsys.readouterr().err
    assert f"k.spec:9:30: error: `{op.split('(')[0]}` of scalars is not supported" in err
    assert "Traceback" not in err


def test_a_scalar_output_of_a_row_spec_is_a_family_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "k.spec"
    text = ROWS + "output z: f32[]\ny = rmsnorm(x + r, eps, w)\nz = sum(sum(x, axis=-1), axis=-1)\n"
    spec.write_text(text + "check T=4 H=128\n")
    assert main(["build", "--out", str(tmp_path / "out"), str(spec)]) == 2
    err = capsys.readouterr().err
    assert "no kernel family matches" in err and "Traceback" not in err


def test_an_unused_scalar_input_builds_a_test_file_that_compiles(tmp_path: Path) -> None:
    text = (ROOT / "examples" / "swiglu_ffn.spec").read_text()
    spec = tmp_path / "swiglu_ffn.spec"
    spec.write_text(text.replace("input b2:  f32[K]", "input b2:  f32[K]\ninput s: f32[]"))
    assert main(["build", "--out", str(tmp_path / "out"), str(spec)]) == 0
    test = (tmp_path / "out" / "swiglu_ffn" / "test_swiglu_ffn.py").read_text()
    compile(test, "test_swiglu_ffn.py", "exec")
    assert '"b2": (d_K,), "s": ()}' in test


def test_a_value_named_like_an_unnamed_node_keeps_its_own_reference_local(tmp_path: Path) -> None:
    """`v0 = x + 2.0` once shared the reference local `_v0` with the cast of input x (node 0)."""
    spec = tmp_path / "k.spec"
    spec.write_text(
        "kernel k\ndim T, H\nrequire H % 128 == 0\ninput x: f32[T, H]\nparam eps = 1e-6\n"
        "output o0: f32[T, H]\noutput o1: f32[T, H]\nv0 = x + 2.0\nv1 = layernorm(v0, eps)\n"
        "o0 = v1 * 2.0\no1 = v0 * x\ncheck T=4 H=128\n"
    )
    assert main(["build", "--out", str(tmp_path / "out"), str(spec)]) == 0
    reference = load_generated(tmp_path / "out" / "k" / "reference.py")
    x = torch.randn(4, 128)
    o0, o1 = reference.k_reference(x)
    assert torch.allclose(o1, (x + 2.0) * x)
    assert torch.allclose(o0, torch.nn.functional.layer_norm(x + 2.0, (128,), eps=1e-6) * 2.0, atol=1e-5)


def test_ragged_shapes_never_move_a_dim_the_spec_fixes() -> None:
    ir, _ = load_spec(str(ROOT / "examples" / "engram_gate_hc8.spec"))
    shapes = tests_file.test_shapes(ir)
    assert any(label.startswith("ragged-") for _, label in shapes)
    assert all(dims["HC"] == 8 for dims, _ in shapes)


def test_two_thousand_dims_move_only_the_dims_inputs_use(tmp_path: Path) -> None:
    """Ragged shapes move only dims an input uses (bench/frontend_speed.py times the search at n and 2n)."""
    names = [f"D{i}" for i in range(2000)]
    spec = tmp_path / "k.spec"
    spec.write_text(
        ROWS.replace("dim T, H", "dim T, H, " + ", ".join(names)) + "y = rmsnorm(x + r, eps, w)\n"
        "check T=4 H=128 " + " ".join(f"{d}=1" for d in names) + "\n"
    )
    ir, _ = load_spec(str(spec))
    shapes = tests_file.test_shapes(ir)
    assert [label for _, label in shapes if label.startswith("ragged-")] == ["ragged-T3"]  # H % 128 holds H


def _no_family(tmp_path: Path, text: str) -> str:
    spec = tmp_path / "k.spec"
    spec.write_text(text)
    with pytest.raises(SpecError) as info:
        build.build_spec(str(spec), build.BuildOptions(out_dir=tmp_path))
    return info.value.render()


FFN_HEAD = (
    "kernel k\ndim R, K, I\nrequire K % 128 == 0\ninput x: bf16[R, K]\ninput w1t: bf16[K, I]\n"
    "input w2t: bf16[I, K]\n"
)


def test_with_no_family_the_caret_is_on_the_line_the_closest_family_cannot_take(tmp_path: Path) -> None:
    """An FFN with an optional output: the error sits on that output (ffn's reason first), not on `input x`;
    rowreduce says what is true of it (a matmul is not row-wise math), not 'expected a 3-D input'."""
    text = _no_family(tmp_path, FFN_HEAD + "output y: f32[R, K]\noptional output m: f32[R, 1]\n"
                      "h = relu(x @ w1t)\ny = bf16(h) @ w2t\nm = mean(y, axis=-1, keepdim=true)\n"
                      "check R=4 K=128 I=128\n")  # fmt: skip
    head, first_note = text.split("\n")[0], text.split("note:")[1]
    assert head.endswith("k.spec:8:1: error: no kernel family matches `k` (tried: ffn, proj, rowreduce); the "
                         "ffn family comes closest and cannot take this line")  # fmt: skip
    assert first_note.startswith(" leaves the ffn family here: optional outputs are not supported")
    assert "k.spec:9:10: note: leaves the rowreduce family here: `@` is not row-wise math" in text
    assert "3-D" not in text


def test_a_row_spec_value_is_described_as_written(tmp_path: Path) -> None:
    """A [T] input of a [T, H] spec is shown as f32[T], not as its lifted f32[T, 1]."""
    text = _no_family(tmp_path, "kernel k\ndim T, H\ninput x: f32[T, H]\ninput c: f32[T]\nparam eps = 1e-6\n"
                      "output y: f32[T, H]\noutput z: f32[T]\ny = rmsnorm(x, eps)\nz = c * 2.0\n"
                      "check T=4 H=128\n")  # fmt: skip
    assert text.split("\n")[0].endswith("k.spec:4:1: error: no kernel family matches `k` (tried: ffn, "
                                        "proj, rowreduce); the rowreduce family comes closest and cannot "
                                        "take this line")  # fmt: skip
    assert "(`c` is f32[T]); a spec over [T, H] data is read as [T, 1, H] (one head)" in text
    assert "[T, 1]" not in text
