"""The command line for people and CI: exit codes, `--shape` placement, stdin, help, targets, summaries."""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
from pathlib import Path

import pytest

from fusegen import cli
from fusegen.cli import main
from fusegen.codegen import commands
from fusegen.perf.targets import offered
from fusegen.sim.targets import TARGETS
from fusegen.testing import OutputCheck, Report

ROOT = Path(__file__).resolve().parents[2]
LAYERNORM = str(ROOT / "examples" / "layernorm.spec")
SMALL = ["T=3", "H=128"]


def test_shape_before_the_spec_leaves_the_spec_alone(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--shape", *SMALL, LAYERNORM]) == 0
    out = capsys.readouterr().out
    assert "layernorm [H=128 T=3] trn2 lnc=2: y (bfloat16)" in out


def test_explain_takes_the_spec_after_shape(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "--shape", *SMALL, LAYERNORM]) == 0
    assert capsys.readouterr().out.startswith("layernorm (rowreduce family) at H=128 T=3 on trn2")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["check", "--shape", "T=x", LAYERNORM], "--shape takes NAME=INT items, got `T=x`"),
        (["check", "--shape", "T=3", "H=128", "T=5", LAYERNORM], "--shape gives T twice: T=3 and T=5"),
        (["explain", LAYERNORM, LAYERNORM], "explain takes one SPEC, got 2"),
        (["explain"], "explain takes one SPEC, got none"),
        (["explain", LAYERNORM, "--shape", "T", "3", "H=128"], f"got 3: {LAYERNORM} T 3 (--shape items are "
         "NAME=INT, e.g. `T=3`)"),
        (["build", "--format", "json", LAYERNORM], "--format json is for `build --check`"),
        (["check-spec", "--dump", "ir", "--format", "json", LAYERNORM], "does not combine with --format"),
    ],
)
def test_usage_errors_exit_2_with_a_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("command", ["check", "explain", "bench"])
@pytest.mark.parametrize("rows", ["0", "2147483648"])
def test_a_shape_dim_outside_1_to_2_31_is_a_spec_error(
    command: str, rows: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """T=0 reached the planner's report (ZeroDivisionError, exit 3); a huge T the allocator."""
    assert main([command, "--shape", f"T={rows}", "H=128", LAYERNORM]) == 2
    err = capsys.readouterr().err
    assert f"error: --shape gives T={rows}: a dim must be a positive integer" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("command", ["check", "explain", "bench"])
def test_a_shape_giving_a_fixed_dim_another_value_is_a_spec_error(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`dim HC = 8` and --shape HC=4 reached the host function's argument check: a ValueError traceback,
    exit 3, "a fusegen bug"; now an error at the `dim` line, and HC=8 itself is accepted."""
    spec = str(ROOT / "examples" / "engram_gate_hc8.spec")
    assert main([command, "--shape", "T=3", "H=256", "HC=4", spec]) == 2
    err = capsys.readouterr().err
    assert f"{spec}:11:5: error: --shape gives HC=4, but the spec fixes `HC = 8`" in err
    assert "hint: drop HC=4" in err and "Traceback" not in err


def test_a_shape_naming_no_dim_underlines_the_dim_line_and_lists_the_dims(
    capsys: pytest.CaptureFixture[str]
) -> None:
    """The caret stood under the first dim's name alone, as if `T` were wrong; a case slip gets its dim."""
    assert main(["check", "--shape", *SMALL, "h=128", "Q=4", LAYERNORM]) == 2
    err = capsys.readouterr().err
    assert f"{LAYERNORM}:5:5: error: --shape names `h`, which is not a dim of `layernorm`" in err
    assert "    dim T, H\n        ^~~~\n  hint: did you mean `H`? (the dims of `layernorm` are T, H)" in err
    assert "hint: drop it (the dims of `layernorm` are T, H)" in err


@pytest.mark.parametrize("command", ["check-spec", "build", "check"])
def test_a_param_default_the_host_refuses_is_a_spec_error(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`param p = 0` with `x / p` passed check-spec and build; `check` then ran the host, which refuses
    p = 0, and exited 3 with a traceback calling it a fusegen bug."""
    spec = tmp_path / "zero.spec"
    spec.write_text("kernel zero\ndim T, H\ninput x: bf16[T, H]\nparam p = 0\noutput y: bf16[T, H]\n"
                    "y = x / p\ncheck T=4 H=128\n")  # fmt: skip
    assert main([command, "--out", str(tmp_path / "gen"), str(spec)] if command == "build"
                else [command, str(spec)]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert f"{spec}:6:5: error: with `param p = 0.0` (line 4), the kernel needs p != 0, and it is 0.0" in err
    assert "Traceback" not in err and "fusegen bug" not in err


@pytest.mark.parametrize("command", ["check", "explain", "bench"])
def test_a_shape_past_the_host_memory_is_a_spec_error(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Dims each within range whose product outgrows the host: the interpreter's allocation failed (exit 3,
    a traceback); now the shape is answered before anything runs, on a check line and from --shape."""
    spec = tmp_path / "huge.spec"
    spec.write_text("kernel huge\ndim T, H\ninput x: bf16[T, H]\noutput y: bf16[T, H]\ny = x * 2\n"
                    "check T=100000000 H=100000000\n")  # fmt: skip
    assert main([command, str(spec)]) == 2
    err = capsys.readouterr().err
    assert f"{spec}:6:1: error: H=100000000 T=100000000 needs 37,252,903.0 GiB for its inputs" in err
    assert "Traceback" not in err and "internal error" not in err
    assert main([command, "--shape", "T=1000000", "H=1000000", LAYERNORM]) == 2
    err = capsys.readouterr().err
    assert "error: H=1000000 T=1000000 needs 3,725.3 GiB for its inputs and outputs, more than" in err


def test_unwritable_output_paths_are_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An --out that is a file, or cannot be made, and an --trace / --svg that cannot be written, name the
    path (each was an OSError traceback and exit 3); nothing else is written."""
    taken = tmp_path / "taken"
    taken.write_text("")
    assert main(["build", "--out", str(taken), LAYERNORM]) == 2
    assert f"--out {taken} is a file, not a folder" in capsys.readouterr().err
    assert main(["build", "--out", str(taken / "sub"), LAYERNORM]) == 2
    assert f"cannot create the output folder --out {taken / 'sub'}" in capsys.readouterr().err
    for flag in ("--trace", "--svg"):
        assert main(["explain", "--shape", *SMALL, flag, str(tmp_path), LAYERNORM]) == 2
        err = capsys.readouterr().err
        assert f"fusegen explain: error: cannot write {tmp_path}: Is a directory" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


@pytest.mark.parametrize(
    "argv", [["check", "--out", "x", LAYERNORM], ["check", "--target", "trn3", LAYERNORM], ["frobnicate"]]
)
def test_options_argparse_refuses_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_no_spec_and_no_examples_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["check"]) == 2
    assert main(["build"]) == 2
    assert "no SPEC given" in capsys.readouterr().err


def test_spec_error_exits_2_and_failure_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.spec"
    bad.write_text("kernel k\n")
    assert main(["check", str(bad)]) == 2
    assert f"{bad}: error: the spec declares no `output`" in capsys.readouterr().err

    def mismatch(*args: object, **kwargs: object) -> Report:
        return Report("layernorm:", (OutputCheck("y", __import__("torch").bfloat16, 1.0, 0.5),))

    monkeypatch.setattr(commands, "run_against_reference", mismatch)
    assert main(["check", "--shape", *SMALL, LAYERNORM]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH" in out
    assert out.splitlines()[-1] == "check: 1 spec(s), 1 run(s), 1 FAILED"



UNUSED = "kernel k\ndim T, H\ninput x: bf16[T, H]\ninput w: bf16[{w}]\noutput y: bf16[T, H]\ny = abs(x)\n" \
         "check T=5 H=128\n"  # fmt: skip


def test_build_check_and_explain_print_the_checkers_warnings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "unused.spec"
    spec.write_text(UNUSED.format(w="H") + "q = x * 2.0\n")
    assert main(["build", "--out", str(tmp_path / "out"), str(spec)]) == 0
    err = capsys.readouterr().err
    assert f"{spec}:4:7: warning: input `w` is never used" in err
    assert f"{spec}:8:1: warning: `q` is computed but never used" in err
    assert main(["check", str(spec)]) == 0
    assert f"{spec}:4:7: warning: input `w` is never used" in capsys.readouterr().err
    assert main(["explain", str(spec)]) == 0
    assert f"{spec}:4:7: warning: input `w` is never used" in capsys.readouterr().err


def test_a_family_error_names_the_input_never_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An [H, H] input read by nothing fits no family's roles: the warning says why."""
    spec = tmp_path / "unused.spec"
    spec.write_text(UNUSED.format(w="H, H"))
    assert main(["build", "--out", str(tmp_path / "out"), str(spec)]) == 2
    err = capsys.readouterr().err
    assert f"{spec}:4:1: error: no kernel family matches `k`" in err
    assert f"{spec}:4:7: warning: input `w` is never used" in err
    assert not (tmp_path / "out").exists()

def test_internal_error_exits_3_saying_whose_fault(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*args: object, **kwargs: object) -> int:
        raise RuntimeError("planner bug")

    monkeypatch.setattr(commands, "list_families", broken)
    assert main(["list"]) == 3
    err = capsys.readouterr().err
    assert "RuntimeError: planner bug" in err and "this is a fusegen bug" in err


def test_check_ends_with_a_summary_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", LAYERNORM, "--shape", *SMALL]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "check: 1 spec(s), 1 run(s), all ok"
    assert all(line.endswith(": ok") for line in lines[:-1]) and len(lines) == 4  # y, mu, rstd


def _stdin(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))


def test_check_spec_dash_reads_stdin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _stdin(monkeypatch, Path(LAYERNORM).read_bytes())
    assert main(["check-spec", "-"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("<stdin>: kernel layernorm ok\n")
    assert "  inputs   x: bf16[T, H], w: f32[H], b: f32[H]" in out


def test_check_spec_dash_reports_errors_at_stdin_lines(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _stdin(monkeypatch, b"kernel k\ndim R\ninput x: f32[R]\noutput y: f32[R]\ny = silu(x +)\ncheck R=1\n")
    assert main(["check-spec", "-"]) == 2
    assert capsys.readouterr().err.startswith("<stdin>:5:13: error: unexpected `)`")


def test_every_option_and_command_has_help_text() -> None:
    parser = cli._parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in action._choices_actions}
    assert set(helps) == {"check-spec", "build", "list", "targets", "check", "explain", "bench"}
    for name, sub in action.choices.items():
        assert helps[name], f"fusegen {name} has no help"
        for option in sub._actions:
            assert option.help, f"fusegen {name} {option.option_strings or option.dest} has no help"


def test_target_choices_are_the_targets_with_every_figure() -> None:
    assert cli.TARGETS == offered() == ("trn1", "trn2")
    assert TARGETS["trn3"].tensor_clock_ghz is None  # why trn3 is not offered


def test_targets_lists_the_figures_of_the_target_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["targets"]) == 0
    out = capsys.readouterr().out
    for target in TARGETS.values():
        assert f"{target.name}: NeuronCore-v{target.nc_version}" in out
        assert f"{target.sbuf_usable_bytes:,} B usable by a kernel" in out
        assert f"{target.sbuf_bytes_per_partition // 1024} KiB per partition" in out
    assert "trn2: NeuronCore-v3, LNC up to 2\n" in out
    assert "clocks tensor / vector / scalar / gpsimd 2.4 / 0.96 / 1.2 / 1.2 GHz" in out
    assert "trn3: NeuronCore-v4, LNC up to 2  (not offered" in out
    assert "sources:" in out


def test_piped_results_stay_in_order_with_progress() -> None:
    """stdout is line-buffered, so each run's result follows its progress line even through one pipe."""
    result = subprocess.run(
        [sys.executable, "-m", "fusegen", "check", LAYERNORM], cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout
    kinds = ["progress" if line.startswith("fusegen: running") else line.split(":")[0].split(" ")[0]
             for line in result.stdout.splitlines()]  # fmt: skip
    runs = (len(kinds) - 1) // 4
    assert runs >= 2 and kinds == ["progress", "layernorm", "layernorm", "layernorm"] * runs + ["check"]
