"""The forward row kernel's software pipeline as two plain helper functions (NKI traces no generators).

Per token tile and head the kernel calls `head_passes` (loads, reduction passes, per-row math), then
issues the output DMAs queued so far, then runs the previous head's `head_epilogue` (the full-width
combine; it returns its output DMAs): the next head's loads and passes go ahead of this head's epilogue
and stores. NKI inlines function calls at trace time, so this is the same instruction order a
generator would give, in the traced subset (module-level functions, tuples, lists).

What crosses from one helper to the other is decided here, from the rendered bodies: `head_passes`
returns the tuple of every per-head value the epilogue reads (`head`), and each helper takes the
launch-wide names it reads as parameters, named as in the kernel so every call passes them through.
A kernel with the per-tile chain (tile_math.py) has two passes helpers, which differ only in where the
per-row math goes: both call `_row_passes`, the loads and reduction passes, written once (`RowsHelper`);
one head's then runs `_row_math`, the tile's chain, over its own one column, and the other copies its
sums into the tile's columns for the chain after the tile's last head. Both end with the head's column
`hc` of the chain's tiles, which one epilogue helper reads.
"""

from __future__ import annotations

import ast
import builtins
import symtable
from dataclasses import dataclass

from fusegen.codegen.files.render import render
from fusegen.codegen.rowreduce.lower import RowReduceLowering
from fusegen.codegen.select_span import stats

HEAD_TEMPLATE = "rowreduce_head.py.jinja"
ROWS = "_row_passes"
MATH = "_row_math"
HELPERS = {ROWS, MATH}  # functions of the generated module besides the prologue's
#: Names of the kernel body that change per token tile or head (the rest are fixed for the launch).
PER_HEAD = ("t0", "pt", "h")


@dataclass(frozen=True)
class HeadHelpers:
    """Bodies and signatures of `head_passes` / `head_epilogue` for the template."""

    passes_body: str
    epilogue_body: str
    passes_params: str  # e.g. `t0, pt, h, prepared, v_ld, x_hbm, d_H, HB`
    head: str  # the per-head state `head_passes` returns, e.g. `t0, pt, h, x_ld, e12`
    epilogue_params: str  # `head`, then the launch-wide names the epilogue reads
    epilogue_args: str  # the kernel's call after the head's state: the names it reads
    math_body: str = ""  # `_row_math`: the per-row math of a tile's heads c0:c1 (tile_math.py), if any
    math_params: str = ""
    math_args: str = ""  # the kernel's call after `pt, c0, c1`


@dataclass(frozen=True)
class RowsHelper:
    """`_row_passes`: a head's loads and reduction passes, shared by the passes helpers that follow them
    with different per-row math."""

    body: str
    params: str
    returns: str  # the row loads and accumulators the helpers after it read, e.g. `k_ld, x_ld, acc9`

    def call(self) -> str:
        """The line of a passes helper that runs them."""
        return f"{self.returns} = {ROWS}({self.params})"


def rows_helper(lows: tuple[RowReduceLowering, ...], module_source: str) -> RowsHelper:
    """The loads and reduction passes of lowerings `lows`, which share them (a lowering and its per-tile
    variant): what they read, and what the per-row math and epilogues of all of them read after them."""
    body = render(HEAD_TEMPLATE, low=lows[0], part="rows").rstrip()
    reads, sets = _names(body)
    known = _module_names(module_source) | set(dir(builtins)) | HELPERS
    later: set[str] = set()
    for low in lows:
        for part in ("tail", "epilogue"):
            later |= _names(render(HEAD_TEMPLATE, low=low, part=part, math_call=_math_call(low, known)))[0]
    return RowsHelper(body, ", ".join(_ordered(reads - known)), ", ".join(_ordered(sets & later)))


def head_helpers(low: RowReduceLowering, varying: tuple[str, ...], module_source: str,
                 rows: RowsHelper | None = None) -> HeadHelpers:  # fmt: skip
    """The helpers of lowering `low`; `varying` are kernel locals set per token tile or head outside the
    helpers (shared row loads, column staging, `prepared`); `module_source` defines the file's globals;
    `rows`: the loads and passes as a call of the shared helper."""
    known = _module_names(module_source) | set(dir(builtins)) | HELPERS
    call = _math_call(low, known)
    passes = render(HEAD_TEMPLATE, low=low, part="passes", math_call=call).rstrip()
    if rows is not None:
        passes = rows.call() + "\n" + render(HEAD_TEMPLATE, low=low, part="tail", math_call=call).rstrip()
    epilogue = render(HEAD_TEMPLATE, low=low, part="epilogue").rstrip()
    passes_reads, passes_sets = _names(passes)
    epilogue_reads, _ = _names(epilogue)
    per_head = set(PER_HEAD) | set(varying) | passes_sets
    head = list(PER_HEAD) + sorted((epilogue_reads & per_head) - set(PER_HEAD))
    passes_params = _ordered((passes_reads | (set(head) - passes_sets)) - known)
    launch = sorted(epilogue_reads - set(head) - known)
    math = "\n".join(low.tile_math)
    math_reads = _math_reads(low, known)
    return HeadHelpers(
        passes_body=passes,
        epilogue_body=epilogue,
        passes_params=", ".join(passes_params),
        head=", ".join(head),
        epilogue_params=", ".join(["head", *launch]),
        epilogue_args=", ".join(launch),
        math_body=math,
        math_params=", ".join(["pt", "c0", "c1", *math_reads]),
        math_args=", ".join(math_reads),
    )


def _math_reads(low: RowReduceLowering, known: set[str]) -> list[str]:
    """The names the chain reads besides its range (`pt, c0, c1`): `_row_math`'s other parameters."""
    return sorted(_names("\n".join(low.tile_math))[0] - {"pt", "c0", "c1"} - known) if low.tile_math else []


def _math_call(low: RowReduceLowering, known: set[str]) -> str:
    """One head's call of the chain (`low.head_math`): over column 0:1 of its own tiles, its accumulators
    read where the tile's chain reads their `[P, heads]` tiles; "" otherwise."""
    if not low.head_math:
        return ""
    accs = {stats(a): a for a in low.tile_accs}
    return f"{MATH}(pt, 0, 1, {', '.join(accs.get(n, n) for n in _math_reads(low, known))})"


def _ordered(names: set[str]) -> list[str]:
    """Token tile and head first, then alphabetical: a stable signature."""
    return [n for n in PER_HEAD if n in names] + sorted(names - set(PER_HEAD))


def _names(body: str) -> tuple[set[str], set[str]]:
    """(names a function body reads from outside, names it assigns)."""
    lines = "".join(f"    {line}\n" if line else "\n" for line in body.splitlines())
    source = "def body():\n" + lines + "    pass\n"  # a body of comments only (no reduction pass) parses
    ast.parse(source)  # a syntax error here is a template bug: fail with Python's message
    table = symtable.symtable(source, "<head helper>", "exec").get_children()[0]
    reads = {s.get_name() for s in table.get_symbols() if s.is_global() and s.is_referenced()}
    sets = {s.get_name() for s in table.get_symbols() if s.is_assigned()}
    return reads, sets


def _module_names(source: str) -> set[str]:
    """Names bound at the top level of a module's source (imports, constants, functions)."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names
