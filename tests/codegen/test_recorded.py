"""Your own specs beside the examples: `build --check` and `build` with no SPEC use each generated folder's
recorded spec (the path its header names), so a user's kernel is checked and rebuilt, not flagged."""

from __future__ import annotations

from pathlib import Path

import pytest

from fusegen.cli import main
from fusegen.codegen.recorded import default_specs, kernel_folders

ROOT = Path(__file__).resolve().parents[2]
LAYERNORM = (ROOT / "examples" / "layernorm.spec").read_text()


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's project: pyproject.toml, one example, and their own spec under specs/."""
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "layernorm.spec").write_text(LAYERNORM)
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "my.spec").write_text(LAYERNORM.replace("kernel layernorm", "kernel my_kernel"))
    monkeypatch.chdir(tmp_path)
    assert main(["build", "examples/layernorm.spec", "specs/my.spec"]) == 0
    return tmp_path


def test_folders_name_their_recorded_specs(project: Path) -> None:
    folders = {f.path.name: (f.recorded, f.spec) for f in kernel_folders(Path("generated"))}
    assert folders == {
        "layernorm": ("examples/layernorm.spec", project / "examples" / "layernorm.spec"),
        "my_kernel": ("specs/my.spec", project / "specs" / "my.spec"),
    }
    assert default_specs(Path("generated")) == (["examples/layernorm.spec", "specs/my.spec"], [])


def test_check_covers_a_users_folder_instead_of_flagging_it(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert main(["build", "--check"]) == 0, capsys.readouterr().out
    spec = project / "specs" / "my.spec"
    spec.write_text(spec.read_text().replace("param eps = 1e-5", "param eps = 1e-6"))
    assert main(["build", "--check"]) == 1
    out = capsys.readouterr().out
    assert "stale: generated/my_kernel/kernel.py" in out and "layernorm/" not in out


def test_build_without_spec_rebuilds_every_folder_from_its_spec(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = project / "specs" / "my.spec"
    spec.write_text(spec.read_text().replace("param eps = 1e-5", "param eps = 1e-6"))
    capsys.readouterr()
    assert main(["build"]) == 0
    out = capsys.readouterr().out
    assert "layernorm: 6 files in generated/layernorm, 0 changed" in out
    assert "my_kernel: 6 files in generated/my_kernel, 6 changed" in out  # the header's sha256 changed
    assert "eps: float = 1e-06" in (project / "generated" / "my_kernel" / "kernel.py").read_text()
    assert main(["build", "--check"]) == 0


def test_a_folder_whose_spec_is_gone_is_stale_and_named(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "specs" / "my.spec").unlink()
    capsys.readouterr()
    assert main(["build", "--check"]) == 1
    assert "stale: generated/my_kernel/ (its spec specs/my.spec is not found)" in capsys.readouterr().out
    assert main(["build"]) == 1  # the others are rebuilt; the lost folder is named, not deleted
    err = capsys.readouterr().err
    assert "generated/my_kernel/ was not rebuilt: its spec specs/my.spec is not found" in err
    assert (project / "generated" / "my_kernel" / "kernel.py").is_file()
    for spec in (project / "examples").iterdir():
        spec.unlink()
    assert main(["build", "--check"]) == 1  # nothing left to build, and the lost folders are still named
    assert "its spec examples/layernorm.spec is not found" in capsys.readouterr().out


def test_the_stale_count_counts_an_orphan_folder_once_beside_the_files(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "specs" / "my.spec").unlink()  # my_kernel/ (6 files) is one stale folder
    with (project / "generated" / "layernorm" / "plan.md").open("a") as plan:
        plan.write("edited\n")
    capsys.readouterr()
    assert main(["build", "--check"]) == 1
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("1 file(s) and 1 folder(s) under generated/ are stale: run `fusegen build`"), last
    assert "build their spec by name, or delete them" in last
