"""The trace the interpreter hands the cost model stays the same when the interpreter is made faster.

data/stable_traces.json holds the traces of two generated kernels as the interpreter recorded them
before its speed work (issue 15); every record must match, and so must the modelled time of the kernel
(computed from both traces with the current cost model, so a cost-model change does not break this test).
The kernels are frozen copies (data/frozen/, generated at the commit the traces were recorded on), so
codegen changes do not move them; their inputs come from today's generated tests (same signatures).
Regenerate only for an intended interpreter trace change: `.venv/bin/python tests/sim/test_trace_stable.py`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fusegen import testing
from fusegen.perf.capture import launches
from fusegen.perf.schedule import schedule
from fusegen.sim import Record, get_target, load_module

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "data" / "stable_traces.json"
FROZEN = Path(__file__).parent / "data" / "frozen"
#: (kernel, dims, lnc): an FFN with the LayerNorm epilogue (deferred matmuls, two cores) and a row kernel
CASES = (
    ("swiglu_ffn_ln", {"I": 1000, "K": 384, "R": 300}, 2),
    ("layernorm", {"H": 640, "T": 200}, 1),
)


def traced(name: str, dims: dict[str, int], lnc: int) -> list[list[Any]]:
    """The normalised records of every launch the host function makes: allocation ids renumbered in
    order of first use (ids are process-global counters) and the file reduced to its name."""
    test = testing.load_generated(ROOT / "generated" / name / f"test_{name}.py")
    module = load_module(FROZEN / name / "kernel.py", target="trn2")
    tensors = testing.make_inputs(test.INPUTS, test.input_shapes(dims))
    with launches(module) as found:
        getattr(module, name)(*tensors, lnc=lnc, target="trn2")
    ids: dict[int, int] = {}
    rows = []
    for launch in found:
        for rec in launch.result.trace:
            operands = [[role, ids.setdefault(alloc, len(ids)), region, list(shape), dtype]
                        for role, alloc, region, shape, dtype in rec.operands]  # fmt: skip
            row = rec.to_dict()
            row.update(operands=operands, file=Path(rec.file).name)
            rows.append(list(row.values()))
    return rows


def as_record(row: list[Any]) -> Record:
    """A normalised row back as a Record (operands as tuples, as the scheduler expects)."""
    fields = dict(zip(Record.__dataclass_fields__, row, strict=True))
    fields["operands"] = tuple((r, a, m, tuple(s), d) for r, a, m, s, d in fields["operands"])
    return Record(**fields)


@pytest.mark.parametrize(("name", "dims", "lnc"), CASES, ids=[c[0] for c in CASES])
def test_trace_and_modelled_time_unchanged(name: str, dims: dict[str, int], lnc: int) -> None:
    want = json.loads(FIXTURE.read_text())[name]
    got = json.loads(json.dumps(traced(name, dims, lnc)))  # tuples as lists, like the fixture
    assert len(got) == len(want)
    for index, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"record {index} differs"
    target = get_target("trn2")
    modelled = schedule([as_record(r) for r in got], target).time_ns
    assert modelled > 0
    assert modelled == schedule([as_record(r) for r in want], target).time_ns


if __name__ == "__main__":
    FIXTURE.parent.mkdir(exist_ok=True)
    traces = {name: traced(name, dims, lnc) for name, dims, lnc in CASES}
    FIXTURE.write_text(json.dumps(traces, separators=(",", ":")) + "\n")
