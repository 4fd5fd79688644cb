"""bench/rows_perf.py's floors: the split bound is the least max(Vector, Scalar) over every share of
each step's columns (checked against a fine grid), never above the whole-pass bound."""

from __future__ import annotations

import importlib.util
import itertools
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "rows_perf.py"
INF = math.inf
GRID = 12  # shares k/12 of each flexible step: 13^4 picks at most


def _rows_perf() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fusegen_bench_rows_perf", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _grid_bound(steps: list[tuple[float, float]], n: int = GRID) -> float:
    """max(Vector, Scalar) minimised over shares k/n of each flexible step on Vector (brute force)."""
    shares = [[1.0] if s == INF else [0.0] if v == INF else [k / n for k in range(n + 1)] for v, s in steps]
    return min(_engines(steps, pick) for pick in itertools.product(*shares))


def _engines(steps: list[tuple[float, float]], on_vector: tuple[float, ...]) -> float:
    """max(Vector, Scalar) time, each step's share `on_vector` of columns on Vector, the rest on Scalar."""
    vector = sum(f * v for f, (v, _) in zip(on_vector, steps, strict=True) if f > 0)
    scalar = sum((1 - f) * s for f, (_, s) in zip(on_vector, steps, strict=True) if f < 1)
    return max(vector, scalar)


@pytest.mark.parametrize(
    "steps",
    [
        [(2.0, INF), (2.0, 0.8), (2.0, 0.8), (1.0, 0.8), (1.0, 0.8)],  # engram_gate's shape: 2.667 either way
        [(2.0, INF), (2.0, 0.8), (0.5, 0.8), (1.0, 0.8)],  # layernorm's
        [(INF, 3.0), (1.0, 1.0)],  # Scalar-bound: the flexible step all on Vector
        [(1.0, 5.0), (3.0, 1.0)],
    ],
)
def test_split_bound_is_the_least_max_over_column_shares(steps: list[tuple[float, float]]) -> None:
    got = _rows_perf().split_bound(steps)
    grid = _grid_bound(steps)
    assert got <= grid + 1e-9  # no share on the grid does better
    assert grid - got <= max(c for step in steps for c in step if c < INF) / GRID  # reached, to a grid step


def test_engram_gate_goal_is_reachable_only_with_split_passes() -> None:
    """Whole passes leave more on the busier engine than shared columns (engram_gate: 73.5% vs 82.6%)."""
    steps = [(2.0, INF), (2.0, 0.8), (2.0, 0.8), (1.0, 0.8), (1.0, 0.8)]
    whole = min(_engines(steps, pick) for pick in itertools.product([1.0], *[[0.0, 1.0]] * 4))
    assert whole == pytest.approx(3.0) and _rows_perf().split_bound(steps) == pytest.approx(8 / 3)


def test_engram_gate_instruction_floor_sits_on_the_goal() -> None:
    """Priced per instruction (the best known design), engram_gate at the issue's shape needs 5.84 us per
    token tile and head on both engines: 64 of them per core, plus a DMA's fixed latency at each end, is
    376.3 us, a hair over the 376.1 us an 80% kernel may take (roofline 300.9 us; docs/performance.md)."""
    rows_perf = _rows_perf()
    assert rows_perf.split_bound(rows_perf.engram_instructions(2048, 4)) == pytest.approx(5839.3, abs=0.1)
    floor_ns = rows_perf.instruction_floor_ns("engram_gate", {"T": 4096, "HC": 4, "H": 2048})
    assert floor_ns == pytest.approx(376.3e3, abs=50) and 300.9e3 / floor_ns < 0.80
