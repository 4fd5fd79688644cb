"""A row stage's per-row chain emitted over a column range: the heads of a token tile at once.

The forward row kernel runs its per-row math (rstd, a scale, a gate: a chain of one-column Scalar steps,
each at the instruction's fixed cost) once per token tile and head. With a heads axis the Selector can
emit the same chain once per token tile over the columns `c0:c1` of `[P, heads]` tiles (column h = head
h, the accumulators copied into `<acc>_t` tiles at the end of each head's passes): a step on one column
becomes the same step on the range at the same cost, except where an operand must be a `[P, 1]` column
(an activation's scale or bias, a tensor_scalar operand, a constant column in a two-tensor step), which
runs once per column `j` of the range, as do the diagonals of a PE-formed output (one `[P, P]` stationary
per head, appended to a list per tile). The chain is the per-row prefix of the epilogue (`column_prefix`
in rowreduce/lower.py): the first full-width or Vector step ends it, and from there on the Selector emits
the per-head epilogue, reading column `hc` of each range tile and diagonal `hc` (hc = h after the tile's
chain; 0 where one head ran the chain over `[P, 1]` tiles of its own). The Selector keeps its operands
in their per-head form (`name[0:pt, 0:1]`) and this class decides, per emitted instruction, the access
each is written with. docs/performance.md, second pass, step 12.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fusegen.codegen.engines import GPSIMD

COLUMN = "0:1"  # a per-head column's free range
RANGE = "c0:c1"  # the chain's columns: all heads of the tile
ONE = "j:j + 1"  # one column of the range, in a per-column step
COLUMN_OF_HEAD = "hc"  # the epilogue's column of its head: h after the tile's chain, 0 after one head's
HEAD = f"{COLUMN_OF_HEAD}:{COLUMN_OF_HEAD} + 1"
CURRENT_HEAD = "h:h + 1"  # a [P, G] tile's column of the head being run (a staged column input)
LOOP = "for j in range(c0, c1):"
#: roles an instruction takes as a `[P, 1]` column ([ISA] activation, tensor_scalar)
SCALAR_ROLES = ("scale", "bias", "operand0", "operand1")
#: instructions with one tensor input (a constant column is then a scale or bias: no range needed)
ONE_INPUT = ("activation", "activation_reduce", "tensor_scalar")


@dataclass
class Span:
    """The chain's state: its range tiles, diagonals and accumulators, and whether it is still open."""

    heads: str  # the range tiles' width: the kernel's head count
    accs: frozenset[str]  # the accumulators' names: read from their `[P, heads]` tiles in the chain
    part: str = "pt"
    open: bool = True
    end: int = 0  # the Selector's line count where the chain closed
    foreign: bool = False  # the chain read a per-head column it cannot widen (hoisted, an input)
    columns: set[str] = field(default_factory=set)
    diagonals: set[str] = field(default_factory=set)
    read_accs: set[str] = field(default_factory=set)
    # in allocation order: (name, nl dtype) of a range tile, (name, "") of a diagonal list
    tiles: list[tuple[str, str]] = field(default_factory=list)

    def close(self, end: int) -> None:
        """The chain ends before the Selector's line `end` (a full-width or Vector step, or the outputs')."""
        if self.open:
            self.open, self.end = False, end

    def column(self, name: str, nl_dtype: str) -> None:
        """A `[P, 1]` value of the chain: a `[P, heads]` tile per token tile."""
        self.columns.add(name)
        self.tiles.append((name, nl_dtype))

    def diagonal(self, name: str) -> None:
        """A `[P, P]` diagonal of the chain: a list of one per head, per token tile."""
        self.diagonals.add(name)
        self.tiles.append((name, ""))

    def allocs(self, heads: str) -> tuple[str, ...]:
        """The chain's tiles for `heads` columns (the tile's heads, or one head's), and its diagonal lists
        (appended in head order)."""
        return tuple(f"{name} = nl.ndarray((_P, {heads}), dtype={dtype}, buffer=nl.sbuf)" if dtype
                     else f"{name} = []" for name, dtype in self.tiles)  # fmt: skip

    def at(self, code: str, columns: str, constants: set[str]) -> str:
        """The access an instruction writes for operand `code` (per-head form) at `columns`: RANGE or ONE in
        the chain, HEAD in the epilogue."""
        name = code.split("[")[0]
        if code == f"{name}[0:{self.part}, 0:{self.part}]" and name in self.diagonals and columns == HEAD:
            return f"{name}[{COLUMN_OF_HEAD}]{code[len(name):]}"
        if code == f"{name}[0:{self.part}, {CURRENT_HEAD}]" and columns != HEAD:
            self.foreign = True  # one head's run of the chain (columns 0:1) could not widen it either
        if code != f"{name}[0:{self.part}, {COLUMN}]":
            return code
        if name in self.columns:
            return f"{name}[0:{self.part}, {columns}]"
        if columns == HEAD or name in constants:
            return code
        if name in self.accs:
            self.read_accs.add(name)
            return f"{stats(name)}[0:{self.part}, {columns}]"
        self.foreign = True
        return code

    def lines(self, call: str, kwargs: dict[str, str], chain: bool, constants: set[str]) -> list[str]:
        """An instruction's lines: over the range in the chain (per column where an operand must be one
        column), at the head's column in the epilogue after it."""
        one = chain and self.per_column(call, kwargs, constants)
        columns = ONE if one else RANGE if chain else HEAD
        line = call_line(call, {k: self.at(v, columns, constants) for k, v in kwargs.items()})
        return [LOOP, "    " + line] if one else [line]

    def per_column(self, call: str, kwargs: dict[str, str], constants: set[str]) -> bool:
        """Whether a chain step runs once per column: a per-row column in a `[P, 1]` role, or a constant
        column beside the range in a two-tensor step."""
        per_row = self.columns | self.accs
        for role in SCALAR_ROLES:
            name = kwargs.get(role, "").split("[")[0]
            if name in per_row and kwargs[role] == f"{name}[0:{self.part}, {COLUMN}]":
                return True
        return call not in ONE_INPUT and any(v.split("[")[0] in constants for v in kwargs.values())

    def copies(self) -> tuple[str, ...]:
        """The end of a head's passes: its accumulators into their column h."""
        return tuple(f"nisa.tensor_copy(dst={stats(a)}[0:{self.part}, h:h + 1], src={a}[0:{self.part}, "
                     f"{COLUMN}], engine={GPSIMD})" for a in sorted(self.read_accs))  # fmt: skip

    def stats_allocs(self) -> tuple[str, ...]:
        """The accumulators' `[P, heads]` tiles, per token tile."""
        return tuple(f"{stats(a)} = nl.ndarray((_P, {self.heads}), dtype=nl.float32, buffer=nl.sbuf)"
                     for a in sorted(self.read_accs))  # fmt: skip


def call_line(call: str, kwargs: dict[str, str]) -> str:
    """`nisa.<call>(k=v, ...)`."""
    return f"nisa.{call}({', '.join(f'{k}={v}' for k, v in kwargs.items())})"


def stats(acc: str) -> str:
    """The `[P, heads]` tile of accumulator `acc`'s head columns."""
    return f"{acc}_t"
