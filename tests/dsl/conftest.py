"""Fixtures for the spec front end: golden-file comparison (`pytest --update-golden` rewrites them)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

GOLDEN_DIR = Path(__file__).parent / "golden"
REPO = Path(__file__).parents[2]

Golden = Callable[..., None]


@pytest.fixture
def golden(request: pytest.FixtureRequest) -> Golden:
    """`golden(name, text)`: compare with golden/<name>.txt, or rewrite it under --update-golden."""
    update = bool(request.config.getoption("--update-golden"))

    def compare(name: str, text: str, directory: Path = GOLDEN_DIR) -> None:
        path = directory / f"{name}.txt"
        if update:
            path.write_text(text, encoding="utf-8")
            return
        if not path.exists():
            pytest.fail(f"missing golden file {path}; create it with `pytest tests/dsl --update-golden`")
        assert text == path.read_text(encoding="utf-8"), (
            f"{path} differs; rerun with --update-golden if intended"
        )

    return compare


@pytest.fixture
def repo_root(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in the repository root, so spec paths read `examples/x.spec` as users type them."""
    monkeypatch.chdir(REPO)
    return REPO
