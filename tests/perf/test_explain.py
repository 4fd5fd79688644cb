"""`fusegen explain` end to end: report sections, the Chrome trace and the SVG."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from fusegen.cli import main

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("plan\n", "SBUF per partition", "modelled time", "busy %", "bound by:", "roofline",
            "modelled efficiency", "HBM traffic moved", "next plans")  # fmt: skip


def test_explain_ffn_writes_report_trace_and_svg(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace, svg = tmp_path / "t.json", tmp_path / "t.svg"
    spec = str(ROOT / "examples" / "swiglu_ffn.spec")
    shape = ["--shape", "R=256", "K=256", "I=384"]  # a row tile per core: both cores in the trace
    assert main(["explain", spec, *shape, "--trace", str(trace), "--svg", str(svg)]) == 0
    out = capsys.readouterr().out
    for section in SECTIONS:
        assert section in out, section
    assert "why the chosen plan wins" in out
    events = json.loads(trace.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["tid"] for e in spans} >= {"tensor", "dma0"} and {e["pid"] for e in spans} == {0, 1}
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
    root = ET.parse(svg).getroot()
    assert root.tag.endswith("svg") and len(root.findall("{http://www.w3.org/2000/svg}rect")) > 10


def test_explain_rowreduce_family(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["explain", str(ROOT / "examples" / "engram_gate.spec"), "--lnc", "1", "--target", "trn1"]) == 0
    )
    out = capsys.readouterr().out
    assert "rowreduce family" in out and "tile HB" in out and "no alternative plans" in out
    assert "  launch-wide tiles (the Tensor engine's identity)  " in out  # buffer names whole, not cut at 39


def test_explain_rejects_a_bad_shape(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["explain", str(ROOT / "examples" / "swiglu_ffn.spec"), "--shape", "R=7", "K=100", "I=384"]) == 2
    )
    assert "violates" in capsys.readouterr().err
