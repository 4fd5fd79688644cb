"""Fixtures for the spec front end: golden-file comparison (`pytest --update-golden` rewrites them)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

GOLDEN_DIR = Path(__file__).parent / "golden"
REPO = Path(__file__).parents[2]


@pytest.fixture
def golden(request: pytest.FixtureRequest) -> Callable[[str, str], None]:
    """Compare text with tests/dsl/golden/<name>.txt, or rewrite it under --update-golden."""
    update = bool(request.config.getoption("--update-golden"))

    def compare(name: str, text: str) -> None:
        path = GOLDEN_DIR / f"{name}.txt"
        if update:
            path.write_text(text, encoding="utf-8")
            return
        if not path.exists():
            pytest.fail(f"missing golden file {path}; create it with `pytest tests/dsl --update-golden`")
        assert text == path.read_text(encoding="utf-8"), (
            f"{path} differs; if intended, rerun with --update-golden"
        )

    return compare


@pytest.fixture
def repo_root(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in the repository root, so spec paths read `examples/x.spec` as users type them."""
    monkeypatch.chdir(REPO)
    return REPO
