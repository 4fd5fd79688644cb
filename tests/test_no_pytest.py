"""`fusegen check` and `fusegen explain` run in an install without pytest (a test-only dependency)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
#: Runs the CLI with pytest unimportable, as in an install without the `dev` extra.
WITHOUT_PYTEST = """
import sys

class NoPytest:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("pytest", "_pytest"):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")

sys.meta_path.insert(0, NoPytest())
for name in [n for n in sys.modules if n.split(".")[0] in ("pytest", "_pytest")]:
    del sys.modules[name]
from fusegen.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_PYTEST, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_the_blocker_blocks_pytest() -> None:
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_PYTEST.replace("from fusegen.cli", "import pytest\nfrom fusegen.cli")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0 and "No module named 'pytest'" in result.stderr


@pytest.mark.parametrize("command", ["check", "explain"])
def test_cli_runs_without_pytest(command: str) -> None:
    result = _run(command, "examples/layernorm.spec", "--shape", "T=3", "H=128")
    assert result.returncode == 0, result.stderr
    assert "pytest" not in result.stderr
    assert ("ok" if command == "check" else "modelled") in result.stdout
