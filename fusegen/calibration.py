"""The calibration file: device latencies `fusegen bench` measured, next to what the cost model predicted.

JSON lines, one measurement per line, appended (schema in docs/hardware.md). `fusegen explain` reads it to
show measured against modelled per kernel. The default file is calibration.jsonl in the project root (the
nearest folder above the working directory holding pyproject.toml or .git, else the working directory);
FUSEGEN_CALIBRATION or `--calibration PATH` choose another.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fusegen import __version__

SCHEMA = "fusegen.calibration"
VERSION = 1
ENV = "FUSEGEN_CALIBRATION"
DEFAULT_NAME = "calibration.jsonl"
#: rows of other shapes `explain` lists under the current one
OTHER_ROWS = 8


@dataclass(frozen=True)
class Measurement:
    """Latency statistics of `iters` timed calls after `warmup` untimed ones, in nanoseconds."""

    p50_ns: float
    p99_ns: float
    mean_ns: float
    min_ns: float
    warmup: int
    iters: int
    method: str


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank q-th percentile (0 < q <= 100) of non-empty `values`."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n q / 100), at least the first
    return ordered[int(rank) - 1]


def summarize(latencies_ns: list[float], warmup: int, method: str) -> Measurement:
    """p50, p99, mean and min of the timed calls."""
    if not latencies_ns:
        raise ValueError("no timed calls to summarize: --iters must be at least 1")
    mean = sum(latencies_ns) / len(latencies_ns)
    return Measurement(percentile(latencies_ns, 50), percentile(latencies_ns, 99), mean, min(latencies_ns),
                       warmup, len(latencies_ns), method)  # fmt: skip


def default_path() -> Path:
    """FUSEGEN_CALIBRATION, else calibration.jsonl in the project root (else the working directory)."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    from fusegen.codegen.files.render import project_root

    return (project_root(Path.cwd() / DEFAULT_NAME) or Path.cwd()) / DEFAULT_NAME


def record(kernel: str, spec: str, spec_sha256: str, target: str, lnc: int, dims: dict[str, int],
           modelled_ns: float, measured: Measurement) -> dict[str, Any]:  # fmt: skip
    """One calibration line."""
    return {
        "schema": SCHEMA, "version": VERSION, "kernel": kernel, "spec": spec, "spec_sha256": spec_sha256,
        "target": target, "lnc": lnc, "dims": dict(sorted(dims.items())), "modelled_ns": modelled_ns,
        "measured": asdict(measured), "fusegen": __version__,
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
    }  # fmt: skip


def append(path: Path, line: dict[str, Any]) -> None:
    """Append one line to the calibration file (creating it and its folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


def read(path: Path) -> list[dict[str, Any]]:
    """Every well-formed line of the file, oldest first ([] when there is no file); a line that is not a
    calibration record of this schema is skipped with a note on stderr, never a traceback."""
    if not path.is_file():
        return []
    records, bad = [], 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            item = None
        if _valid(item):
            records.append(item)
        else:
            bad += 1
    if bad:
        print(f"fusegen: {path}: skipped {bad} line(s) that are not {SCHEMA} records", file=sys.stderr)
    return records


def _valid(item: Any) -> bool:
    """A record of this schema with the fields `explain` reads."""
    if not isinstance(item, dict) or item.get("schema") != SCHEMA or item.get("version") != VERSION:
        return False
    measured = item.get("measured")
    return (all(k in item for k in ("kernel", "target", "lnc", "dims", "modelled_ns"))
            and isinstance(measured, dict) and "p50_ns" in measured and "p99_ns" in measured)  # fmt: skip


def latest_per_shape(records: list[dict[str, Any]], kernel: str) -> list[dict[str, Any]]:
    """The newest record of `kernel` per (target, LNC, dims), in first-measured order."""
    latest: dict[str, dict[str, Any]] = {}
    for r in records:
        if r["kernel"] == kernel:
            latest[json.dumps([r["target"], r["lnc"], r["dims"]], sort_keys=True)] = r
    return list(latest.values())


def same_run(r: dict[str, Any], target: str, lnc: int, dims: dict[str, int]) -> bool:
    """`r` measured this target, LNC and shape."""
    return bool(r["target"] == target and r["lnc"] == lnc and r["dims"] == dict(sorted(dims.items())))


def measured_json(records: list[dict[str, Any]], kernel: str) -> list[dict[str, Any]]:
    """`explain --format json`'s `measured`: the newest record per shape of `kernel`."""
    return [{"target": r["target"], "lnc": r["lnc"], "dims": r["dims"], "p50_ns": r["measured"]["p50_ns"],
             "p99_ns": r["measured"]["p99_ns"], "modelled_ns": r["modelled_ns"],
             "ratio": r["measured"]["p50_ns"] / r["modelled_ns"] if r["modelled_ns"] else None,
             "time": r.get("time")} for r in latest_per_shape(records, kernel)]  # fmt: skip


def section(records: list[dict[str, Any]], path: Path, kernel: str, target: str, lnc: int,
            dims: dict[str, int], modelled_ns: float) -> str:  # fmt: skip
    """explain's text: this shape's newest measurement against the model now, then the other shapes."""
    rows = latest_per_shape(records, kernel)
    if not rows:
        return f"measured\n  no device measurement of {kernel} in {path} (`fusegen bench` on a Neuron host)"
    lines = [f"measured on a device ({path}; p50/p99 of `fusegen bench`, against the model)"]
    here = [r for r in rows if same_run(r, target, lnc, dims)]
    for r in here:
        p50 = r["measured"]["p50_ns"]
        lines.append(f"  this shape: p50 {p50 / 1000:.1f} us, p99 {r['measured']['p99_ns'] / 1000:.1f} us; "
                     f"modelled {modelled_ns / 1000:.1f} us; measured/modelled {p50 / modelled_ns:.2f}x "
                     f"(measured {r.get('time', '?')})")  # fmt: skip
    if not here:
        lines.append(f"  this shape ({target}, LNC {lnc}) is not measured; other shapes:")
    others = [r for r in rows if r not in here][-OTHER_ROWS:]
    for r in others:
        shape = " ".join(f"{k}={v}" for k, v in r["dims"].items())
        p50, model = r["measured"]["p50_ns"], r["modelled_ns"]
        ratio = f"{p50 / model:.2f}x" if model else "-"
        lines.append(f"  {shape} {r['target']} LNC {r['lnc']}: p50 {p50 / 1000:.1f} us against modelled "
                     f"{model / 1000:.1f} us at bench time: {ratio}")  # fmt: skip
    return "\n".join(lines)
