"""Shared helpers for the fusegen.sim tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

SEED_KERNEL = Path(__file__).resolve().parents[2] / ".." / "shared" / "seeds" / "swiglu_stream_kernel.py"


def line_of(path: str | Path, marker: str) -> int:
    """1-based line number of the unique line carrying the comment `# marker`."""
    lines = [i for i, text in enumerate(Path(path).read_text().splitlines(), 1) if f"# {marker}" in text]
    assert len(lines) == 1, f"marker {marker!r} found on lines {lines}"
    return lines[0]


def assert_located(exc: BaseException, path: str | Path, marker: str) -> None:
    """The message names the kernel source file and the line carrying `marker`."""
    where = f"{Path(path).name}:{line_of(path, marker)}:"
    assert where in str(exc), f"{where!r} not in {str(exc)!r}"


def close(out: torch.Tensor, ref: torch.Tensor, rtol: float = 2e-2, atol: float = 1e-5) -> bool:
    """nki-library 'max' comparator: |out - ref| <= atol + rtol * max|ref|."""
    bound = atol + rtol * ref.float().abs().max().item()
    return bool(((out.float() - ref.float()).abs() <= bound).all())


@pytest.fixture(autouse=True)
def _seeded() -> None:
    torch.manual_seed(0)
