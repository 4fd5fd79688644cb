"""Instruction trace: one compact record per executed instruction, totals and Chrome trace export."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# An operand: (role 'r'/'w', allocation id, memory region, shape, dtype name)
Operand = tuple[str, int, str, tuple[int, ...], str]
ENGINES = ("dma", "tensor", "vector", "scalar", "gpsimd", "sync")
BYTE_FIELDS = ("hbm_read", "hbm_write", "sbuf_read", "sbuf_write", "psum_read", "psum_write")


@dataclass(slots=True)
class Record:
    """One instruction: enough for a cost model (engine, op, sizes, dtypes, bytes, alloc dependencies)."""

    index: int  # program order within its core
    core: int
    engine: str
    op: str
    operands: tuple[Operand, ...]
    partitions: int
    elems: int  # elements per partition of the main operand
    hbm_read: int
    hbm_write: int
    sbuf_read: int
    sbuf_write: int
    psum_read: int
    psum_write: int
    psum_bank: int | None  # absolute bank of a matmul/PSUM destination (after bank assignment)
    file: str
    line: int
    epoch: int  # core_barrier generation

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


#: A record's fields in Record's order, as instructions append them during a launch: a tuple is built in C,
#: a Record's generated __init__ costs ~2 us per instruction on the instances' serialised turn
Row = tuple[Any, ...]
PSUM_BANK = tuple(Record.__dataclass_fields__).index("psum_bank")  # its index in a Row
OPERANDS = tuple(Record.__dataclass_fields__).index("operands")


class Trace:
    """All records of one launch, ordered by (core, index); made from rows, as Records on first use."""

    def __init__(self, rows: list[Row]) -> None:
        self._rows: list[Any] = rows  # Rows, then (`_built`) the Records made from them
        self._built = False

    @property
    def records(self) -> list[Record]:
        """The Records (built from the rows once, in place)."""
        if not self._built:
            self._rows = [Record(*row) for row in self._rows]
            self._built = True
        return self._rows

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records)

    def totals(self) -> dict[str, dict[str, int]]:
        """Per-engine totals: instruction count, elements, bytes per memory level."""
        fields = ("count", "elems", *BYTE_FIELDS)
        out: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(fields, 0))
        for rec in self.records:
            row = out[rec.engine]
            row["count"] += 1
            row["elems"] += rec.partitions * rec.elems
            for name in BYTE_FIELDS:
                row[name] += getattr(rec, name)
        return dict(out)

    def op_counts(self) -> dict[str, int]:
        """Instruction count per op name."""
        counts: dict[str, int] = defaultdict(int)
        for rec in self.records:
            counts[rec.op] += 1
        return dict(counts)

    def summary(self) -> str:
        """Human-readable per-engine table."""
        header = f"{'engine':<8}{'instrs':>8}{'elems':>14}" + "".join(f"{n:>13}" for n in BYTE_FIELDS)
        lines = [header]
        for engine, row in sorted(self.totals().items()):
            lines.append(
                f"{engine:<8}{row['count']:>8}{row['elems']:>14}"
                + "".join(f"{row[n]:>13}" for n in BYTE_FIELDS)
            )
        lines.append(
            f"{len(self.records)} instructions; ops: "
            + ", ".join(f"{op}={n}" for op, n in sorted(self.op_counts().items()))
        )
        return "\n".join(lines)

    def to_chrome_json(self, path: str | Path) -> None:
        """Write Chrome trace-event JSON; timestamps are instruction indices until a cost model exists."""
        tids = {engine: i for i, engine in enumerate(ENGINES)}
        lanes = sorted({(rec.core, rec.engine) for rec in self.records})
        events: list[dict[str, Any]] = [
            {
                "name": "thread_name",
                "ph": "M",
                "pid": core,
                "tid": tids.get(engine, len(tids)),
                "args": {"name": engine},
            }
            for core, engine in lanes
        ]
        events += [
            {
                "name": rec.op,
                "cat": rec.engine,
                "ph": "X",
                "ts": rec.index,
                "dur": 1,
                "pid": rec.core,
                "tid": tids.get(rec.engine, len(tids)),
                "args": {k: v for k, v in rec.to_dict().items() if k not in ("op", "engine")},
            }
            for rec in self.records
        ]
        Path(path).write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ns"}))
