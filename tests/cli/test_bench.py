"""`fusegen bench` and the calibration file: the no-device path, a measurement written and read back (a fake
measurement injected through bench()'s `measure`), and `fusegen explain` showing measured against modelled."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import pytest

from fusegen import bench, calibration, modes
from fusegen.calibration import Measurement
from fusegen.cli import main
from fusegen.testing import Case
from tests.cli.test_json import BENCH, EXPLAIN, conforms

ROOT = Path(__file__).resolve().parents[2]
SPEC = str(ROOT / "examples" / "layernorm.spec")
SMALL = {"H": 128, "T": 3}
SHAPE = ["--shape", "T=3", "H=128"]


@pytest.fixture(autouse=True)
def no_device(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No AWS packages, no device files, and the default calibration file inside tmp_path."""
    for name in ("nki", "torch_neuronx", "neuronxcc"):
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setattr(modes, "DEVICE_GLOB", str(tmp_path / "neuron*"))
    monkeypatch.setenv(calibration.ENV, str(tmp_path / "default.jsonl"))


def fake_measure(seen: list[tuple[str, dict[str, int], str, int, int, int]], p50_ns: float = 9000.0
                 ) -> bench.Measure:  # fmt: skip
    """A measurement without a device: records what bench() hands over, returns fixed latencies."""

    def measure(folder: Path, name: str, case: Case, target: str, lnc: int, warmup: int, iters: int
                ) -> Measurement:  # fmt: skip
        assert (folder / "kernel.py").is_file() and (folder / "reference.py").is_file()
        seen.append((name, case.dims, target, lnc, warmup, iters))
        return Measurement(p50_ns, p50_ns * 1.5, p50_ns * 1.1, p50_ns * 0.9, warmup, iters, "fake")

    return measure


def test_without_a_device_bench_prints_the_model_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", SPEC, *SHAPE]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "layernorm at H=128 T=3 on trn2, LNC 2"
    assert out[1].startswith("  modelled  ") and float(out[1].split()[1]) > 0
    assert out[2].startswith("  measured  -: no Neuron device to measure on (mode device needs nki")
    assert not (tmp_path / "default.jsonl").exists()  # nothing measured, nothing recorded


def test_without_a_device_bench_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", SPEC, *SHAPE, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    conforms(doc, BENCH)
    assert doc["ok"] and not doc["device"] and doc["measured"] is None and doc["calibration"] is None
    assert doc["dims"] == SMALL and doc["modelled_ns"] > 0 and "neuronx-cc" in doc["reason"]


def test_a_measurement_is_appended_and_explain_shows_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                        ) -> None:  # fmt: skip
    path, seen = tmp_path / "cal" / "runs.jsonl", []
    for p50 in (9000.0, 12000.0):  # the newest of a shape is the one explain shows
        assert bench.bench(SPEC, "trn2", 2, SMALL, 3, 7, path, measure=fake_measure(seen, p50)) == 0
    assert seen == [("layernorm", SMALL, "trn2", 2, 3, 7)] * 2
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 2
    first = lines[0]
    assert (first["schema"], first["version"], first["kernel"], first["target"], first["lnc"]) == (
        "fusegen.calibration", 1, "layernorm", "trn2", 2)  # fmt: skip
    assert first["dims"] == SMALL and len(first["spec_sha256"]) == 64 and first["modelled_ns"] > 0
    assert first["measured"] == {"p50_ns": 9000.0, "p99_ns": 13500.0, "mean_ns": 9900.0, "min_ns": 8100.0,
                                 "warmup": 3, "iters": 7, "method": "fake"}  # fmt: skip
    text = capsys.readouterr().out
    assert f"appended to {path}" in text
    assert f"measured/modelled {12000.0 / lines[1]['modelled_ns']:.2f}x (p50)" in text

    assert main(["explain", SPEC, *SHAPE, "--calibration", str(path)]) == 0
    report = capsys.readouterr().out
    modelled = lines[1]["modelled_ns"]  # the model is deterministic: explain models the same time
    assert (f"  this shape: p50 12.0 us, p99 18.0 us; modelled {modelled / 1000:.1f} us; "
            f"measured/modelled {12000.0 / modelled:.2f}x") in report  # fmt: skip

    assert main(["explain", SPEC, *SHAPE, "--calibration", str(path), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    conforms(doc, EXPLAIN)
    (row,) = doc["measured"]
    assert (row["p50_ns"], row["p99_ns"], row["dims"]) == (12000.0, 18000.0, SMALL)
    assert row["ratio"] == pytest.approx(12000.0 / modelled)


def test_explain_lists_other_shapes_and_says_when_this_one_is_not_measured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "runs.jsonl"
    other = calibration.record("layernorm", SPEC, "0" * 64, "trn2", 2, {"T": 200, "H": 1024}, 20000.0,
                               Measurement(30000.0, 31000.0, 30500.0, 29000.0, 10, 100, "fake"))  # fmt: skip
    calibration.append(path, other)
    assert main(["explain", SPEC, *SHAPE, "--calibration", str(path)]) == 0
    report = capsys.readouterr().out
    assert "this shape (trn2, LNC 2) is not measured; other shapes:" in report
    assert "  H=1024 T=200 trn2 LNC 2: p50 30.0 us against modelled 20.0 us at bench time: 1.50x" in report


def test_explain_without_measurements_says_where_it_looked(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                           ) -> None:  # fmt: skip
    assert main(["explain", SPEC, *SHAPE]) == 0
    assert f"no device measurement of layernorm in {tmp_path / 'default.jsonl'}" in capsys.readouterr().out


def test_a_corrupt_calibration_line_is_skipped_with_a_note(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                           ) -> None:  # fmt: skip
    path = tmp_path / "runs.jsonl"
    good = calibration.record("layernorm", SPEC, "0" * 64, "trn2", 2, SMALL, 1.0,
                              Measurement(2.0, 3.0, 2.0, 1.0, 0, 1, "fake"))  # fmt: skip
    path.write_text('{"not json\n[1, 2]\n' + json.dumps(good) + "\n\n")
    assert calibration.read(path) == [good]
    assert f"{path}: skipped 2 line(s) that are not fusegen.calibration records" in capsys.readouterr().err


def test_a_wrong_result_on_the_device_records_nothing_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def wrong(*_: object) -> Measurement:
        raise bench.BenchError("layernorm y (bfloat16): max|out - ref| = 1.0e+00, tolerance 1e-02: MISMATCH")

    path = tmp_path / "runs.jsonl"
    assert bench.bench(SPEC, "trn2", 2, SMALL, path=path, measure=wrong) == 1
    assert "fusegen bench: layernorm y (bfloat16)" in capsys.readouterr().err and not path.exists()


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(100, 0, -1)]
    assert (calibration.percentile(values, 50), calibration.percentile(values, 99)) == (50.0, 99.0)
    assert calibration.percentile([7.0], 99) == 7.0
    m = calibration.summarize([4.0, 1.0, 3.0, 2.0], 5, "wall clock")
    assert (m.p50_ns, m.p99_ns, m.mean_ns, m.min_ns, m.warmup, m.iters) == (2.0, 4.0, 2.5, 1.0, 5, 4)


@pytest.mark.parametrize(("argv", "message"), [
    (["--iters", "0"], "--iters must be >= 1"),
    (["--mode", "sim"], "invalid choice: 'sim'"),
])  # fmt: skip
def test_bench_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    refused = pytest.raises(SystemExit) if "choice" in message else contextlib.nullcontext()  # by argparse
    with refused:
        assert main(["bench", SPEC, *SHAPE, *argv]) == 2
    assert message in capsys.readouterr().err
