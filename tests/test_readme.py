"""The README's examples work as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from fusegen.cli import main

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_readme_spec_builds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = next(block for block in re.findall(r"```\n(.*?)```", README, re.S) if block.startswith("# SwiGLU"))
    path = tmp_path / "readme.spec"
    path.write_text(spec)
    assert main(["build", "--out", str(tmp_path / "out"), str(path)]) == 0
    assert (tmp_path / "out" / "swiglu_ffn_ln" / "kernel.py").is_file()


def test_readme_quick_start_names_make_targets_that_exist() -> None:
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    for target in re.findall(r"^make (\w+)", README, re.M):
        assert re.search(rf"^{target}:", makefile, re.M), target


def test_readme_ffn_training_example_lowers_the_loss(capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    block = next(b for b in re.findall(r"```python\n(.*?)```", README, re.S) if "swiglu_ffn" in b)
    monkeypatch.chdir(Path(__file__).resolve().parents[1])  # load_ops looks in ./generated
    monkeypatch.setenv("FUSEGEN_OPS_BACKEND", "interpreter")
    torch.manual_seed(0)
    exec(compile(block, "README.md", "exec"), {})  # our own README
    losses = [float(line.split()[1]) for line in capsys.readouterr().out.splitlines()]
    assert len(losses) == 3 and losses[-1] < losses[0], losses
