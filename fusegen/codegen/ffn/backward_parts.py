"""The FFN backward program's parts: the kernels it launches (elementwise and row kernels), their HBM
leaves and writes, and the host's calls; backward_program.py builds them, backward_rows.py builds the row
kernels, ffn_backward.py.jinja renders them."""

from __future__ import annotations

from dataclasses import dataclass

from fusegen.codegen.select_tables import NL_DTYPE
from fusegen.dsl.ir import Dim, Node

FAMILY = "ffn backward"
SCALARS = ("const", "param", "dim")


@dataclass(frozen=True)
class Leaf:
    """An HBM value an elementwise kernel reads: token-major [R, N], or an [N] vector broadcast over rows."""

    name: str  # the host's variable and the kernel's argument (`<name>_hbm`)
    dtype: str
    vector: bool
    column: str = ""  # a column slice's first column in `name` ("" for 0; source over the kernel's dims)
    tile: str = ""  # a column slice's SBUF tile (a whole value's is `<name>_t`)

    @property
    def nl_dtype(self) -> str:
        """Its dtype in the kernel's source."""
        return NL_DTYPE[self.dtype]


@dataclass(frozen=True)
class RowPass:
    """One pass over a row tile's chunks: accumulators zeroed before it, the chunk's loads and lines (ending
    in the accumulation), the per-row math on the accumulators after it."""

    before: tuple[str, ...]
    leaves: tuple[Leaf, ...]
    lines: tuple[str, ...]
    after: tuple[str, ...]


@dataclass(frozen=True)
class Elementwise:
    """One elementwise kernel: its leaves, the lines of one tile, and the values it writes."""

    kernel: str
    leaves: tuple[Leaf, ...]
    params: tuple[str, ...]
    lines: tuple[str, ...]
    writes: tuple[tuple[str, str, str], ...]  # (result buffer, tile access, its first column or "")
    buffers: tuple[tuple[str, str, str], ...]  # (result name, nl dtype, columns: "N" or a concat's width)
    width: str  # the source of (R, N)
    # a row kernel's (backward_rows.py): its reduction passes, launch-wide lines, the last pass's loads
    # (None: all leaves) and its token sums (result name, the core's [1, N] accumulator)
    passes: tuple[RowPass, ...] = ()
    setup: tuple[str, ...] = ()
    final_leaves: tuple[Leaf, ...] | None = None
    sums: tuple[tuple[str, str], ...] = ()

    @property
    def sources(self) -> tuple[str, ...]:
        """The kernel's HBM arguments: its leaves' values, once each."""
        return tuple(dict.fromkeys(lf.name for lf in self.leaves))

    @property
    def results(self) -> tuple[str, ...]:
        """What the kernel returns: the written buffers, then the token sums' per-core partials."""
        return (*(b[0] for b in self.buffers), *(s[0] for s in self.sums))


@dataclass(frozen=True)
class Write:
    """A value an elementwise kernel writes: node `value` into node `buffer`'s HBM buffer at `column`."""

    value: int
    buffer: int
    column: Dim | None  # None: the buffer is the value's own


@dataclass(frozen=True)
class Call:
    """One host line: results = a GEMM helper's or an elementwise kernel's call."""

    results: str
    call: str


@dataclass(frozen=True)
class Program:
    """The FFN backward's host program and the elementwise kernels it launches."""

    calls: tuple[Call, ...]
    kernels: tuple[Elementwise, ...]
    returns: tuple[str, ...]


def var(n: Node) -> str:
    """The host's variable holding node `n`: an input's own name, `_v<id>` for a computed value."""
    return str(n.name) if n.op == "input" else f"_v{n.id}"
