"""A slice of bench/fuzz.py in CI: generated and mutated specs through check-spec, build and import."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench" / "fuzz.py"


def _fuzz_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fusegen_bench_fuzz", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_two_hundred_specs_give_no_traceback_and_no_slow_case() -> None:
    fuzz = _fuzz_module()
    tally = fuzz.fuzz(count=200, seed=17, run_every=0)
    assert tally.specs == 200
    assert tally.accepted >= 40 and tally.built >= 30  # the generator reaches the families, not only errors
    assert tally.tracebacks == [], tally.tracebacks[:3]
    assert tally.slow == []
