"""Packaging: the runtime dependencies are what fusegen imports, the wheel works outside the repo,
generated kernels load from anywhere, and generated files are ordinary files (0644 under umask 022)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from fusegen.cli import main
from fusegen.codegen.files.ops import load_ops

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: distribution name -> the module it is imported as
MODULE = {"lark": "lark", "jinja2": "jinja2", "numpy": "numpy", "torch": "torch"}


def _requirement_name(requirement: str) -> str:
    return requirement.split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower()


def _imported_top_level_modules() -> set[str]:
    """Every top-level module fusegen's own code imports (templates render text, they import nothing)."""
    modules = set()
    for path in (ROOT / "fusegen").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                modules |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules.add(node.module.split(".")[0])
    return modules


def test_runtime_dependencies_are_exactly_what_fusegen_imports() -> None:
    declared = {_requirement_name(r) for r in PYPROJECT["project"]["dependencies"]}
    assert declared == set(MODULE)  # no pytest, no ml_dtypes
    third_party = _imported_top_level_modules() - set(sys.stdlib_module_names) - {"fusegen", "nki"}
    assert third_party == {MODULE[d] for d in declared}


def test_extras_and_metadata() -> None:
    project = PYPROJECT["project"]
    extras = project["optional-dependencies"]
    assert {_requirement_name(r) for r in extras["dev"]} >= {"pytest", "ruff", "mypy"}
    assert {_requirement_name(r) for r in extras["neuron"]} == {"neuronx-cc", "torch-neuronx", "nki"}
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text


def test_python_dash_m_fusegen() -> None:
    result = subprocess.run([sys.executable, "-m", "fusegen", "--version"], capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == 0 and result.stdout.startswith("fusegen ")


@pytest.fixture
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o027, 0o640)], indirect=["umask"])
def test_generated_files_respect_the_umask(umask: int, mode: int, tmp_path: Path) -> None:
    assert main(["build", "--out", str(tmp_path), str(ROOT / "examples" / "layernorm.spec")]) == 0
    files = [p for p in (tmp_path / "layernorm").iterdir() if p.is_file()]
    assert files and {p.name: p.stat().st_mode & 0o777 for p in files} == {p.name: mode for p in files}


def test_load_ops_takes_a_generated_folder_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = tmp_path / "ln.spec"
    text = (ROOT / "examples" / "layernorm.spec").read_text()
    spec.write_text(text.replace("kernel layernorm", "kernel ln_anywhere"))
    assert main(["build", "--out", str(tmp_path / "kernels"), str(spec)]) == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    with pytest.raises(FileNotFoundError, match="pass the generated folder's path"):
        load_ops("ln_anywhere")  # by name: only generated/ under the working directory
    with pytest.raises(FileNotFoundError, match=r"^no kernels/ln_anywhere/ops\.py \(from "):
        load_ops("kernels/ln_anywhere")  # a path is not looked up under generated/: the error names it
    load_ops(Path("..") / "kernels" / "ln_anywhere")
    x, w, b = torch.randn(5, 128).bfloat16(), torch.randn(128), torch.randn(128)
    y = torch.ops.fusegen.ln_anywhere(x, w, b)[0]
    xf = x.float()
    want = (xf - xf.mean(-1, keepdim=True)) / (xf.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt() * w + b
    assert (y.float() - want).abs().max() <= 1e-5 + 2e-2 * want.abs().max()  # bf16, nki-library's rule


def test_the_wheel_installs_and_runs_outside_the_repo() -> None:
    """.ci/wheel-smoke: wheel, fresh venv (CPU torch, no dev extra), build/check/explain/README snippet."""
    result = subprocess.run([str(ROOT / ".ci" / "wheel-smoke"), sys.executable], capture_output=True,
                            text=True, timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.rstrip().endswith("wheel smoke test: ok")
