"""How the front end's time grows with a spec's size: errors, dim products past the term limit, ragged shapes.

Each case runs at n and 2n; a ratio near 2 is linear, near 4 quadratic.
Goal (issue 17): 13,000 errors answered in under 2 s of CPU time, and growth no worse than linear.
Run: .venv/bin/python bench/frontend_speed.py
"""

from __future__ import annotations

import contextlib
import io
import tempfile
import time
from pathlib import Path

from fusegen.cli import main as cli_main
from fusegen.codegen.files.tests import test_shapes
from fusegen.dsl import load_spec
from fusegen.dsl.check import check
from fusegen.dsl.diagnostics import SpecError
from fusegen.dsl.parser import parse

HEAD = "kernel k\ndim T, H\ninput x: f32[T, H]\ninput w: f32[H, H]\noutput y: f32[T, H]\n"
TAIL = "\ncheck T=4 H=128\n"


def _errors_spec(lines: int) -> str:
    """A spec with `lines` bad lines, each an unknown value and a redeclared `z` (two errors a line)."""
    names = min(1500, lines)
    body = [f"v{i} = x\n" for i in range(names)] + [f"z = v{i % names}q #\n" for i in range(lines)]
    return HEAD + "y = x\n" + "".join(body) + TAIL


def _check_spec_seconds(text: str) -> float:
    """CPU seconds `fusegen check-spec` takes on `text`, best of 3."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.spec"
        path.write_text(text)
        best = float("inf")
        for _ in range(3):
            start = time.process_time()
            with contextlib.redirect_stderr(io.StringIO()):
                cli_main(["check-spec", str(path)])
            best = min(best, time.process_time() - start)
    return best


def _product_seconds(factors: int) -> float:
    """CPU seconds to reject a product of `factors` nine-term sums (past the term limit), best of 3."""
    symbols = [f"D{i}" for i in range(1, 10)]
    nine = "(" + " + ".join(symbols) + ")"
    text = (f"kernel k\ndim T, {', '.join(symbols)}\ninput x: f32[T, {', '.join(symbols)}]\n"
            f"input z: f32[T, {' * '.join([nine] * factors)}]\noutput y: f32[T, {', '.join(symbols)}]\n"
            f"y = x * 2.0\ncheck T=1 {' '.join(f'{d}=1' for d in symbols)}\n")  # fmt: skip
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        with contextlib.suppress(SpecError):
            check(parse(text, "t.spec"))
        best = min(best, time.process_time() - start)
    return best


def _ragged_seconds(dims: int) -> float:
    """CPU seconds to find the ragged check shapes of a row spec with `dims` extra dims, best of 3."""
    names = [f"D{i}" for i in range(dims)]
    text = (f"kernel k\ndim T, H, {', '.join(names)}\nrequire H % 128 == 0\ninput x: f32[T, H]\n"
            "input r: f32[T, H]\ninput w: f32[H]\nparam eps = 1e-6\noutput y: f32[T, H]\n"
            f"y = rmsnorm(x + r, eps, w)\ncheck T=4 H=128 {' '.join(f'{d}=1' for d in names)}\n")  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "k.spec"
        path.write_text(text)
        ir, _ = load_spec(str(path))
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        test_shapes(ir)
        best = min(best, time.process_time() - start)
    return best


def main() -> None:
    """Print each case's CPU time at n and 2n, the ratio, and the goal."""
    small, large = _check_spec_seconds(_errors_spec(3250)), _check_spec_seconds(_errors_spec(6500))
    print(f"check-spec, 6,500 vs 13,000 errors: {small:.2f} s, {large:.2f} s, ratio {large / small:.2f}")
    print(f"13,000 errors under 2 s of CPU time: {'met' if large < 2.0 else 'MISSED'}")
    short, long = _product_seconds(30), _product_seconds(60)
    print(f"dim product past the term limit, 30 vs 60 factors: {short * 1e3:.1f} ms, {long * 1e3:.1f} ms, "
          f"ratio {long / short:.2f}")  # fmt: skip
    few, many = _ragged_seconds(1000), _ragged_seconds(2000)
    print(f"ragged check shapes, 1,000 vs 2,000 dims: {few * 1e3:.1f} ms, {many * 1e3:.1f} ms, "
          f"ratio {many / few:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
