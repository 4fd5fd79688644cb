"""pytest's `--fusegen-mode`: where generated tests run their kernels (fusegen/modes.py, docs/hardware.md).

Registered as a pytest plugin by fusegen's package metadata; the option sets FUSEGEN_MODE for the session,
so generated tests and ops.py read the one switch. It imports nothing from pytest: the hooks receive
pytest's objects."""

from __future__ import annotations

import os
from typing import Any

from fusegen import modes


def pytest_addoption(parser: Any) -> None:
    """Add `--fusegen-mode` (default: FUSEGEN_MODE, else sim)."""
    parser.getgroup("fusegen").addoption(
        "--fusegen-mode", choices=modes.MODES, default=None,
        help=f"where generated kernels run: {', '.join(modes.MODES)} (default: ${modes.ENV}, else sim)",
    )  # fmt: skip


def pytest_configure(config: Any) -> None:
    """Make the option the session's FUSEGEN_MODE (xdist workers get it through their own configure)."""
    mode = config.getoption("--fusegen-mode", default=None)
    if mode:
        os.environ[modes.ENV] = mode
