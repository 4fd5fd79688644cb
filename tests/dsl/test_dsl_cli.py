"""`fusegen check-spec` through fusegen.cli.main: exit codes, summaries, dumps, and clean errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from fusegen import __version__
from fusegen.cli import main

EXAMPLES = ["examples/swiglu_ffn.spec", "examples/swiglu_ffn_ln.spec", "examples/engram_gate.spec"]


def test_examples_pass_with_a_summary(repo_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-spec", *EXAMPLES]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert "examples/swiglu_ffn.spec: kernel swiglu_ffn ok" in out
    assert "  inputs   x: bf16[R, K], w1t: bf16[K, I], b1: f32[I]," in out
    assert "  outputs  x_new: f32[R, K], z: bf16[R, K]" in out
    assert "optional dot: f32[T, HC]" in out
    assert "  checks   R=256 K=1280 I=3416; R=300 K=384 I=1000; R=7 K=256 I=384\n" in out


def test_bad_spec_exits_2_with_a_caret(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "bad.spec"
    spec.write_text("kernel k\ndim R\ninput x: f32[R]\noutput y: f32[R]\ny = silu(x +)\ncheck R=1\n")
    assert main(["check-spec", str(spec)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    expected = "5:13: error: unexpected `)`; expected an expression\n    y = silu(x +)\n                ^\n"
    assert err == f"{spec}:{expected}"
    assert "Traceback" not in err


def test_every_spec_is_reported(repo_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "missing.spec")
    assert main(["check-spec", missing, EXAMPLES[0]]) == 2
    out, err = capsys.readouterr()
    assert err == f"{missing}: error: cannot read the spec: No such file or directory\n"
    assert "kernel swiglu_ffn ok" in out


def test_dump_ir(repo_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-spec", "--dump", "ir", EXAMPLES[0]]) == 0
    out = capsys.readouterr().out
    assert out == (repo_root / "tests/dsl/golden/swiglu_ffn.ir.txt").read_text()


def test_dump_ast(repo_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-spec", "--dump", "ast", EXAMPLES[0]]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        "Spec examples/swiglu_ffn.spec\n  KernelDecl @ 4:1\n    name: Ident name='swiglu_ffn' @ 4:8\n"
    )
    assert "value: BinOp op='+' @ 21:7" in out


def test_warnings_go_to_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "w.spec"
    spec.write_text("kernel k\ndim R\ninput x: f32[R]\ninput u: f32[R]\noutput y: f32[R]\ny = -x\ncheck R=1")
    assert main(["check-spec", str(spec)]) == 0
    assert (
        capsys.readouterr().err
        == f"{spec}:4:7: warning: input `u` is never used\n    input u: f32[R]\n          ^\n"
    )


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"fusegen {__version__}\n"


def test_help_lists_check_spec(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["check-spec", "--help"])
    assert info.value.code == 0
    assert "--dump {ast,ir}" in capsys.readouterr().out


def test_top_level_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    assert "check-spec" in capsys.readouterr().out
