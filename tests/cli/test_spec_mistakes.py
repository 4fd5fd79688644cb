"""Mistakes a first spec makes that only `build` met: each is a spec error (exit 2, a caret), not a
traceback, and writes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from fusegen.cli import main

SPEC = "kernel k\ndim T, H\ninput x: f32[T, H]\noutput z: f32[T, H]\nz = x * 2\ncheck T=4 H=128\n"


def test_two_specs_of_one_kernel_name_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Both wrote out/k/, the later silently replacing the earlier; the same file named twice builds once."""
    first, second, out = tmp_path / "a.spec", tmp_path / "b.spec", tmp_path / "out"
    first.write_text(SPEC)
    second.write_text("# a copy\n" + SPEC)
    assert main(["build", "--out", str(out), str(first), str(second)]) == 2
    err = capsys.readouterr().err
    assert err.endswith(
        f"{second}:2:1: error: kernel `k` is also built by {first}: both would write {out / 'k'}/\n"
        "    kernel k\n    ^~~~~~~~\n  hint: give one of them another name: `kernel k_2`\n"
    )
    assert not out.exists()
    assert main(["build", "--out", str(out), str(first), str(first)]) == 0
    assert capsys.readouterr().out == f"k: 6 files in {out / 'k'}, 6 changed\n"


def test_a_dim_no_input_gives_is_a_spec_error_in_build(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`G` only in an output's shape passed check-spec, and build died on a KeyError (exit 3)."""
    spec, out = tmp_path / "g.spec", tmp_path / "out"
    spec.write_text(SPEC.replace("dim T, H", "dim T, H, G").replace("z: f32[T, H]", "z: f32[T, G]")
                    .replace("z = x * 2", "z = x[:, 0:G] * 2").replace("H=128", "H=128 G=2"))  # fmt: skip
    assert main(["build", "--out", str(out), str(spec)]) == 2
    err = capsys.readouterr().err
    assert f"{spec}:4:1: error: dim `G` is in no input's shape, so a call cannot give its value" in err
    assert "Traceback" not in err and not out.exists()


@pytest.mark.parametrize("command", ["build", "explain", "check"])
def test_lnc_2_on_trn1_is_one_usage_error(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was a plan error repeated at every check line, hinting "shrink this shape"."""
    spec = tmp_path / "k.spec"
    spec.write_text(SPEC)
    out = ["--out", str(tmp_path / "out")] if command == "build" else []
    assert main([command, str(spec), *out, "--target", "trn1", "--lnc", "2"]) == 2
    assert capsys.readouterr().err == (
        f"fusegen {command}: error: --lnc 2 needs NeuronCore-v3 core pairs; --target trn1 runs LNC 1 only: "
        "drop --lnc, or build for --target trn2\n"
    )


@pytest.mark.parametrize(("command", "math", "name", "guard"), [
    ("check", "log(x)", "log", "`log(maximum(x, 1e-6))`"),
    ("explain", "sqrt(relu(x))", "sqrt", "`sqrt(x + 1e-30)` (sqrt(0) is outside it)"),
    ("bench", "log(x)", "log", "`log(maximum(x, 1e-6))`"),
])  # fmt: skip
def test_an_activation_argument_out_of_range_is_a_spec_error(
    command: str, math: str, name: str, guard: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`log(x)` of the tests' N(0, 1) inputs, or sqrt of relu's zeros, met the interpreter's valid-input-range
    rule as a traceback calling it a fusegen bug (exit 3); it is the spec's math, answered at its line."""
    spec = tmp_path / "k.spec"
    spec.write_text(SPEC.replace("x * 2", math))
    assert main([command, str(spec)]) == 2
    err = capsys.readouterr().err
    where = f"{spec}:5:5: error: at H=128 T=4, the test inputs drive `{name}` outside the range the hardware "
    assert where in err
    hint = f"  hint: keep the argument inside it, e.g. {guard}; the tests draw every input from N(0, 1)\n"
    assert hint in err
    assert "Traceback" not in err
