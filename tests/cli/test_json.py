"""`--format json`: each command's document has exactly the documented fields and types (docs/cli.md)."""

from __future__ import annotations

import io
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from fusegen.cli import main

ROOT = Path(__file__).resolve().parents[2]
LAYERNORM = str(ROOT / "examples" / "layernorm.spec")
SMALL = ["T=3", "H=128"]

# A schema is a type (or tuple of types), {key: schema} (exactly these keys), [schema] (a list of them),
# or ("dict-of", schema) for a mapping from free-form names.
Number = (int, float)
Optional = type(None)
DIAGNOSTIC = {"level": str, "message": str, "path": str, "line": int, "column": int, "hint": (str, Optional)}
TENSOR = {"name": str, "dtype": str, "shape": [str]}
KERNEL = {
    "name": str, "dims": [{"name": str, "value": (int, Optional)}], "require": [str],
    "inputs": [{**TENSOR, "finite": bool}],
    "params": [{"name": str, "default": Number}], "nodes": int, "checks": [("dict-of", int)],
    "outputs": [{"name": str, "dtype": str, "shape": [str], "optional": bool}],
}  # fmt: skip
ENVELOPE = {"schema": str, "version": int, "ok": bool}
CHECK_SPEC = {**ENVELOPE, "specs": [{"path": str, "ok": bool, "kernel": (KERNEL, Optional),
                                      "diagnostics": [DIAGNOSTIC]}]}  # fmt: skip
OUTPUT = {"name": str, "dtype": str, "max_error": (*Number, Optional), "tolerance": Number, "ok": bool}
RUN = {"spec": str, "kernel": str, "target": str, "lnc": int, "dims": ("dict-of", int), "ok": bool,
       "outputs": [OUTPUT], "error": (str, Optional)}  # fmt: skip
CHECK = {**ENVELOPE, "runs": [RUN], "failed": int, "mode": str}
TILES = ("dict-of", int)
EXPLAIN = {
    **ENVELOPE, "kernel": str, "family": str, "dims": ("dict-of", int), "target": str, "lnc": int,
    "plan": ({"tiles": TILES, "sbuf_bytes": int, "sbuf_budget": int, "psum_banks": int, "psum_budget": int},
             Optional),
    "launches": int, "instructions": int, "modelled_ns": Number, "bound_engine": str,
    "engines": ("dict-of", {"busy_ns": Number, "busy_pct": Number}),
    "roofline": {"time_ns": Number, "bound": str, "efficiency": Number, "flops": Number,
                 "min_hbm_bytes": int, "hbm_moved_bytes": int},
    "alternatives": [{"tiles": TILES, "planner_ns": Number, "trace_ns": (*Number, Optional)}],
    "measured": [{"target": str, "lnc": int, "dims": ("dict-of", int), "p50_ns": Number, "p99_ns": Number,
                  "modelled_ns": Number, "ratio": (*Number, Optional), "time": (str, Optional)}],
}  # fmt: skip
MEASUREMENT = {"p50_ns": Number, "p99_ns": Number, "mean_ns": Number, "min_ns": Number, "warmup": int,
               "iters": int, "method": str}  # fmt: skip
BENCH = {
    **ENVELOPE, "kernel": str, "spec": str, "target": str, "lnc": int, "dims": ("dict-of", int),
    "modelled_ns": Number, "device": bool, "reason": (str, Optional), "measured": (MEASUREMENT, Optional),
    "ratio": (*Number, Optional), "calibration": (str, Optional),
}  # fmt: skip
BUILD_CHECK = {**ENVELOPE, "kernels": [str], "stale": [{"path": str, "reason": str}]}
FIGURE = (*Number, Optional)
TARGET = {
    "name": str, "offered": bool, "nc_version": int, "partitions": int, "sbuf_bytes_per_partition": int,
    "sbuf_usable_bytes_per_partition": int, "psum_banks": int, "psum_bank_bytes": int, "max_lnc": int,
    "clock_ghz": {"tensor": FIGURE, "vector": FIGURE, "scalar": FIGURE, "gpsimd": FIGURE},
    "hbm_gbps_per_chip": FIGURE, "dma_gbps_per_core": FIGURE, "cores_per_chip": int,
}  # fmt: skip
TARGETS = {**ENVELOPE, "targets": [TARGET], "sources": str}


def conforms(value: Any, schema: Any, where: str = "$") -> None:
    """Assert `value` has exactly the shape `schema` describes; the message names where it differs."""
    if isinstance(schema, tuple) and schema and schema[0] == "dict-of":
        assert isinstance(value, dict), f"{where}: expected an object"
        for key, item in value.items():
            assert isinstance(key, str)
            conforms(item, schema[1], f"{where}.{key}")
    elif isinstance(schema, tuple):  # one of several
        errors = []
        for option in schema:
            try:
                conforms(value, option, where)
                return
            except AssertionError as err:
                errors.append(str(err))
        raise AssertionError(" / ".join(errors))
    elif isinstance(schema, dict):
        assert isinstance(value, dict), f"{where}: expected an object, got {value!r}"
        assert set(value) == set(schema), f"{where}: keys {sorted(value)} != {sorted(schema)}"
        for key, item in schema.items():
            conforms(value[key], item, f"{where}.{key}")
    elif isinstance(schema, list):
        assert isinstance(value, list), f"{where}: expected a list"
        for i, item in enumerate(value):
            conforms(item, schema[0], f"{where}[{i}]")
    else:
        ok = isinstance(value, schema) and not (schema in (int, float) and isinstance(value, bool))
        assert ok, f"{where}: expected {schema}, got {value!r}"


def _json(capsys: pytest.CaptureFixture[str], name: str) -> dict[str, Any]:
    out = capsys.readouterr().out
    assert out.count("\n") == 1, "one JSON document on one line"
    doc = json.loads(out)
    assert doc["schema"] == f"fusegen.{name}" and doc["version"] == 1
    return doc


def test_the_validator_rejects_extra_missing_and_mistyped_fields() -> None:
    for bad in ({"a": 1, "b": 2}, {}, {"a": "1"}, {"a": True}):
        with pytest.raises(AssertionError):
            conforms(bad, {"a": int})
    conforms({"a": None}, {"a": (int, Optional)})


def test_check_spec_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.spec"
    bad.write_text("kernel k\ndim R\ninput x: f32[R]\noutput y: f32[R]\ny = silu(x +)\ncheck R=1\n")
    assert main(["check-spec", "--format", "json", LAYERNORM, str(bad)]) == 2
    doc = _json(capsys, "check-spec")
    conforms(doc, CHECK_SPEC)
    good, broken = doc["specs"]
    assert not doc["ok"] and good["ok"] and not broken["ok"] and broken["kernel"] is None
    assert good["kernel"]["inputs"][0] == {"name": "x", "dtype": "bf16", "shape": ["T", "H"], "finite": False}
    assert good["kernel"]["checks"] == [{"T": 200, "H": 1024}, {"T": 3, "H": 1280}]
    assert [o["optional"] for o in good["kernel"]["outputs"]] == [False, True, True]
    assert broken["diagnostics"][0] | {"hint": None} == {
        "level": "error", "message": "unexpected `)`; expected an expression", "path": str(bad),
        "line": 5, "column": 13, "hint": None,
    }  # fmt: skip


def test_check_spec_json_from_stdin_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = b"kernel k\ndim R\ninput x: f32[R]\ninput u: f32[R]\noutput y: f32[R]\ny = -x\ncheck R=1\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text)))
    assert main(["check-spec", "--format", "json", "-"]) == 0
    doc = _json(capsys, "check-spec")
    conforms(doc, CHECK_SPEC)
    (spec,) = doc["specs"]
    assert spec["diagnostics"] == [{"level": "warning", "message": "input `u` is never used",
                                    "path": "<stdin>", "line": 4, "column": 7, "hint": None}]  # fmt: skip


def test_check_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--format", "json", LAYERNORM, "--shape", *SMALL]) == 0
    doc = _json(capsys, "check")
    conforms(doc, CHECK)
    (run,) = doc["runs"]
    assert doc["ok"] and doc["failed"] == 0
    assert (run["kernel"], run["target"], run["lnc"]) == ("layernorm", "trn2", 2)
    assert run["dims"] == {"H": 128, "T": 3}
    assert [o["name"] for o in run["outputs"]] == ["y", "mu", "rstd"]
    assert all(0 <= o["max_error"] <= o["tolerance"] for o in run["outputs"])
    assert doc["mode"] == "sim" and run["error"] is None


def test_explain_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    calibration = str(tmp_path / "none.jsonl")
    argv = ["explain", "--format", "json", LAYERNORM, "--shape", *SMALL, "--calibration", calibration]
    assert main(argv) == 0
    doc = _json(capsys, "explain")
    conforms(doc, EXPLAIN)
    assert (doc["kernel"], doc["family"], doc["dims"]) == ("layernorm", "rowreduce", {"H": 128, "T": 3})
    assert set(doc["engines"]) >= {"tensor", "vector", "scalar", "gpsimd"}
    assert doc["bound_engine"] in doc["engines"] and doc["roofline"]["bound"] in ("PE", "HBM")
    assert doc["modelled_ns"] >= doc["roofline"]["time_ns"] > 0
    assert math.isclose(doc["roofline"]["efficiency"], doc["roofline"]["time_ns"] / doc["modelled_ns"],
                        rel_tol=1e-9)  # fmt: skip
    assert doc["measured"] == []  # no calibration file: nothing measured


def test_build_check_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path)
    assert main(["build", "--out", out, LAYERNORM]) == 0
    capsys.readouterr()
    assert main(["build", "--check", "--format", "json", "--out", out, LAYERNORM]) == 0
    fresh = _json(capsys, "build-check")
    conforms(fresh, BUILD_CHECK)
    assert fresh == {"schema": "fusegen.build-check", "version": 1, "ok": True, "kernels": ["layernorm"],
                     "stale": []}  # fmt: skip
    (tmp_path / "layernorm" / "plan.md").write_text("edited\n")
    (tmp_path / "layernorm" / "reference.py").unlink()
    (tmp_path / "layernorm" / "old.py").write_text("")
    assert main(["build", "--check", "--format", "json", "--out", out, LAYERNORM]) == 1
    stale = _json(capsys, "build-check")
    conforms(stale, BUILD_CHECK)
    assert not stale["ok"]
    assert {(Path(s["path"]).name, s["reason"]) for s in stale["stale"]} == {
        ("plan.md", "differs"), ("reference.py", "missing"), ("old.py", "left over")
    }


def test_targets_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["targets", "--format", "json"]) == 0
    doc = _json(capsys, "targets")
    conforms(doc, TARGETS)
    by_name = {t["name"]: t for t in doc["targets"]}
    assert by_name["trn2"]["sbuf_usable_bytes_per_partition"] == 212_984
    assert by_name["trn1"]["clock_ghz"]["tensor"] == 2.8
    assert [t["name"] for t in doc["targets"] if t["offered"]] == ["trn1", "trn2"]
