"""The per-row math of a token tile's heads at once: `[P, 1]` column chains widened to `[P, G]` columns.

The forward kernel runs its per-row math (rstd, a scale, a gate: a chain of one-column Scalar steps, each
at the instruction's fixed cost) once per token tile and head. When a spec has a heads axis, the same
chain reads every head's statistics from `[P, G]` columns (the head's accumulators copied into column h at
the end of its passes) and runs once per token tile for columns `c0:c1` = all heads: a step on one column
becomes the same step on G columns at the same cost, except where an operand must be a `[P, 1]` column (an
activation's scale or bias, a tensor_scalar operand, a constant column in a two-tensor step), which stays
one step per column, as do the diagonals of a PE-formed output (one `[P, P]` stationary per head, kept in
a list per tile). The epilogue then reads column h and diagonal h. Where a tile cannot wait for its last head
(the kernel's last tile, or no SBUF for the pending heads) the kernel runs the per-head lowering unchanged:
on shared `[P, HC]` tiles each head's chain would wait for the next head's writes (the cost model orders
every access to one tile). docs/performance.md, second pass, step 12.
"""

from __future__ import annotations

import dataclasses
import re

from fusegen.codegen import select_pe
from fusegen.codegen.engines import GPSIMD
from fusegen.codegen.rowreduce.lower import ColumnOutput, RowReduceLowering

COLUMN = "[0:pt, 0:1]"  # a per-head column's access in the per-head lowering
RANGE = "c0:c1"  # the chain's columns: all heads of the tile, or one
ONE = "j:j + 1"  # one column of the range, in a per-column step
HEAD = "h:h + 1"  # the epilogue's head
_ALLOC = re.compile(r"^(\s*)(\w+) = nl\.ndarray\(\(_P, (1|_P)\), dtype=([\w.]+), buffer=nl\.sbuf\)$")
_CALL = re.compile(r"^(\s*)nisa\.(\w+)\((.*)\)$")
_SCALAR_ROLES = ("scale", "bias", "operand0", "operand1")


@dataclasses.dataclass(frozen=True)
class Names:
    """The per-row tiles of a chain: `[P, 1]` columns, `[P, P]` diagonals, the accumulators it reads."""

    columns: frozenset[str]
    diagonals: frozenset[str]
    accs: frozenset[str]


def tiled(low: RowReduceLowering, heads: str) -> RowReduceLowering:
    """`low`'s per-tile variant: its per-row prefix run once per token tile on `[P, heads]` columns; or `low`
    itself where the prefix reads a per-head value other than an accumulator (a hoisted pass value, a
    column load), which the per-tile chain would not have."""
    if low.streamed or not low.epi_columns:
        return low
    names = _names(low.epi_columns)
    reads = set(re.findall(r"\b(\w+)\[0:pt, 0:1\]", "\n".join(low.epi_columns)))
    constants = {m.group(2) for line in low.constants if (m := _ALLOC.match(line))}
    if reads - names.columns - names.accs - constants:
        return low
    allocs, body = _chain(low.epi_columns, names, heads, constants)
    copies = tuple(f"nisa.tensor_copy(dst={_stats(a)}[0:pt, {HEAD}], src={a}{COLUMN}, engine={GPSIMD})"
                   for a in sorted(names.accs))  # fmt: skip
    allocs += tuple(f"{_stats(a)} = nl.ndarray((_P, {heads}), dtype=nl.float32, buffer=nl.sbuf)"
                    for a in sorted(names.accs))  # fmt: skip
    epilogue = select_pe.scalar_share(_per_head(low.epi_lines, names), "h == 0") if low.scalar_share else (
        _per_head(low.epi_lines, names))  # fmt: skip
    return dataclasses.replace(
        low, epi_columns=copies, epi_lines=epilogue, save_lines=_per_head(low.save_lines, names),
        required_columns=tuple(_column(c, names) for c in low.required_columns),
        optional_columns=tuple(_column(c, names) for c in low.optional_columns),
        tile_allocs=allocs, tile_math=body, model=low.model._replace(tile_heads=1),
    )  # fmt: skip



def _stats(acc: str) -> str:
    """The `[P, G]` tile of accumulator `acc`'s head columns."""
    return f"{acc}_t"


def _names(lines: tuple[str, ...]) -> Names:
    columns: set[str] = set()
    diagonals: set[str] = set()
    for line in lines:
        found = _ALLOC.match(line)
        if found:
            (columns if found.group(3) == "1" else diagonals).add(found.group(2))
    accs = set(re.findall(r"\b(acc\d+)\[0:pt, 0:1\]", "\n".join(lines)))
    return Names(frozenset(columns), frozenset(diagonals), frozenset(accs))


def _chain(lines: tuple[str, ...], names: Names, heads: str, constants: set[str]
           ) -> tuple[tuple[str, ...], tuple[str, ...]]:  # fmt: skip
    """(per-tile allocations, the chain over columns `c0:c1`) of the per-head prefix `lines`."""
    allocs, body, dtypes = [], [], {}
    for line in lines:
        alloc = _ALLOC.match(line)
        if alloc and alloc.group(2) in names.columns:
            name, dtype = alloc.group(2), alloc.group(4)
            allocs.append(f"{name} = nl.ndarray((_P, {heads}), dtype={dtype}, buffer=nl.sbuf)")
        elif alloc:
            allocs.append(f"{alloc.group(2)} = []")  # one diagonal per head, appended in head order
            dtypes[alloc.group(2)] = alloc.group(4)
        else:
            body += _step(line, names, constants, dtypes)
    return tuple(allocs), tuple(body)


def _step(line: str, names: Names, constants: set[str], dtypes: dict[str, str]) -> list[str]:
    """One instruction of the prefix over the range, or once per column of it where an operand must be
    one column; a control line as it is."""
    call = _CALL.match(line)
    if call is None:
        return [line]
    pad, op, args = call.groups()
    diagonal = next((d for d in names.diagonals if f"dst={d}[" in args), None)
    if diagonal is None and not _per_column(op, args, names, constants):
        return [pad + _widened(f"nisa.{op}({args})", names, RANGE)]
    step = _widened(f"nisa.{op}({args})", names, ONE)
    inner = [step]
    if diagonal is not None:
        one = f"{diagonal}_j"
        inner = [f"{one} = nl.ndarray((_P, _P), dtype={dtypes[diagonal]}, buffer=nl.sbuf)",
                 step.replace(f"dst={diagonal}[", f"dst={one}["), f"{diagonal}.append({one})"]  # fmt: skip
    return [f"{pad}for j in range(c0, c1):"] + [f"{pad}    {s}" for s in inner]


def _per_column(op: str, args: str, names: Names, constants: set[str]) -> bool:
    """Whether the step must run per column: a per-row column in a `[P, 1]` role, or a constant column
    beside the range in a two-tensor step."""
    per_row = names.columns | names.accs
    for role in _SCALAR_ROLES:
        found = re.search(rf"\b{role}=(\w+)\[0:pt, 0:1\]", args)
        if found and found.group(1) in per_row:
            return True
    two_tensor = op not in ("activation", "activation_reduce", "tensor_scalar")
    return two_tensor and any(c in constants for c in re.findall(r"\b(\w+)\[0:pt, 0:1\]", args))


def _widened(text: str, names: Names, columns: str) -> str:
    """`text` with every per-row column read at `columns` (accumulators from their `[P, G]` tiles)."""

    def sub(found: re.Match[str]) -> str:
        name = found.group(1)
        if name in names.accs:
            return f"{_stats(name)}[0:pt, {columns}]"
        return f"{name}[0:pt, {columns}]" if name in names.columns else found.group(0)

    return re.sub(r"\b(\w+)\[0:pt, 0:1\]", sub, text)


def _per_head(lines: tuple[str, ...], names: Names) -> tuple[str, ...]:
    """Epilogue lines reading head h's column of each per-row tile and its diagonal."""
    out = []
    for line in lines:
        line = re.sub(r"\b(\w+)\[0:pt, 0:1\]",
                      lambda f: f"{f.group(1)}[0:pt, {HEAD}]" if f.group(1) in names.columns else f.group(0),
                      line)  # fmt: skip
        out.append(re.sub(r"\b(\w+)\[0:pt, 0:pt\]",
                          lambda f: f"{f.group(1)}[h][0:pt, 0:pt]" if f.group(1) in names.diagonals
                          else f.group(0), line))  # fmt: skip
    return tuple(out)


def _column(col: ColumnOutput, names: Names) -> ColumnOutput:
    """A [T, G] output staged from head h's column."""
    return dataclasses.replace(col, source=_per_head((col.source,), names)[0])
