"""`--format json`: one JSON document on stdout per command, tagged with a versioned schema name.

The schemas are documented in docs/cli.md; a field is only ever added within a version, never renamed,
retyped or removed (that makes a new version)."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

FORMATS = ("text", "json")
SCHEMA_VERSION = 1


def document(command: str, ok: bool, **fields: Any) -> dict[str, Any]:
    """The envelope every JSON output shares: schema name, version, overall verdict, then the fields."""
    return {"schema": f"fusegen.{command}", "version": SCHEMA_VERSION, "ok": ok, **fields}


def number(value: float) -> float | None:
    """A float JSON can carry: infinity and NaN (a shape mismatch, a NaN output) become null."""
    return value if math.isfinite(value) else None


def emit(doc: dict[str, Any]) -> None:
    """Print the document as one JSON line (one line: easy to pipe into `jq` or split by line)."""
    print(json.dumps(doc, sort_keys=False), flush=True)
    sys.stdout.flush()
