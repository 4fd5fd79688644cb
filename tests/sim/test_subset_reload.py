"""The subset check reads a kernel's file as it is when launched: a file rewritten at the same path (a kernel
rebuilt in one process, as bench/fuzz.py does) is checked by its new functions, not by the old file's
functions at the same lines (the stale parse raised `is` from a host function the new file did not have)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fusegen.sim import subset

WITH_IS = "def k(x):\n    if x is None:\n        return 0\n    return 1\n"
CLEAN = "def k(x):\n    return x + 1\n"  # the same first line, another body


def _load(path: Path, text: str, name: str) -> Callable[..., Any]:
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.k  # type: ignore[no-any-return]


def test_a_rewritten_file_is_checked_as_it_is_now(tmp_path: Path) -> None:
    path = tmp_path / "kernel.py"
    assert [f[0] for f in subset.findings(_load(path, WITH_IS, "subset_reload_1"))] == ["lang-no-is"]
    assert subset.findings(_load(path, CLEAN, "subset_reload_2")) == ()
    assert [f[0] for f in subset.findings(_load(path, WITH_IS, "subset_reload_3"))] == ["lang-no-is"]
