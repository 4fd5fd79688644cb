"""How long the FFN planner's search takes per spec: every example spec's check shapes, LNC 1 and 2, trn2.

Goal (issue 7): under 100 ms per spec. Run: .venv/bin/python bench/planner_speed.py
"""

from __future__ import annotations

import time
from pathlib import Path

from fusegen.codegen.build import FAMILIES
from fusegen.codegen.family import Mismatch
from fusegen.codegen.ffn.family import FFN
from fusegen.codegen.rewrites import rewrite
from fusegen.dsl import load_spec

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    """Time `plans()` (one search per check line) for each FFN-family example."""
    assert FFN in FAMILIES
    worst = 0.0
    for spec in sorted((ROOT / "examples").glob("*.spec")):
        ir = rewrite(load_spec(str(spec))[0])
        try:
            match = FFN.match(ir)
        except Mismatch:  # another family's spec: not this planner's
            continue
        for lnc in (1, 2):
            start = time.perf_counter()
            FFN.plans(ir, match, "trn2", lnc)
            ms = (time.perf_counter() - start) * 1000
            worst = max(worst, ms)
            print(f"{spec.name:<32} LNC={lnc} {len(ir.checks)} check shapes  {ms:7.1f} ms")
    print(f"slowest spec: {worst:.1f} ms (goal < 100 ms): {'met' if worst < 100 else 'MISSED'}")


if __name__ == "__main__":
    main()
