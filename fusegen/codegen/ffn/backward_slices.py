"""Column slices in the FFN backward's elementwise stages: a packed product read by halves, its gradient
written back whole.

A spec that slices the columns of a GEMM's result (`h[:, 0:I]` and `h[:, I:2 * I]` of `h = x @ w12t`,
examples/packed_clamped_swiglu.spec) has a backward IR with `index` nodes over that result and, as the
result's gradient, a sum of `unindex` nodes (zeros with a slice's gradient placed at its columns, autodiff.py)
whose slices tile the columns: a concatenation. An elementwise kernel reads an index of a value in HBM as
a leaf at a column offset, and writes the concatenation's parts into one buffer at their offsets, so the
GEMMs read the packed value whole (dW12 = X^T @ [dG | dU], dX = [dG | dU] @ W12^T). Offsets and widths are
dims, which the host binds from its inputs' shapes (as the reference does) and passes to the kernel.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fusegen.codegen.family import Mismatch
from fusegen.codegen.files.reference import dim_bindings
from fusegen.dsl.ir import Dim, IndexItem, KernelIR, Node

FAMILY = "ffn backward"
ZERO = Dim.const(0)


@dataclass(frozen=True)
class Concat:
    """A sum of unindexed column slices that tile the columns: each part's node and its first column."""

    node: int
    parts: tuple[tuple[int, Dim], ...]
    nodes: frozenset[int]  # the sum's add and unindex nodes, which no kernel computes on their own


def column_start(n: Node, rows: Dim) -> Dim | None:
    """The first column of an index / unindex `n` that keeps every row and slices the last axis, else None."""
    items: tuple[IndexItem, ...] = n.attr("index")  # type: ignore[assignment]
    if len(items) != 2 or any(it.kind != "slice" for it in items):
        return None
    row, column = items
    return column.start if row.start == ZERO and row.stop == rows else None


def concats(ir: KernelIR, rows: Dim) -> dict[int, Concat]:
    """The backward IR's concatenations by node id; raises Mismatch for an unindex that is in none."""
    found: dict[int, Concat] = {}
    for n in ir.nodes:
        if n.op == "add" or n.op == "unindex":
            cat = _concat(ir, n, rows)
            if cat is not None:
                found = {k: c for k, c in found.items() if k not in cat.nodes}  # a larger sum absorbs it
                found[n.id] = cat
    covered = {m for c in found.values() for m in c.nodes}
    for n in ir.nodes:
        if n.op == "unindex" and n.id not in covered:
            raise Mismatch(FAMILY, n.span, "a gradient scattered into columns that is not a concatenation")
    return found


def _concat(ir: KernelIR, n: Node, rows: Dim) -> Concat | None:
    """`n` as a concatenation: a tree of adds over column unindexes whose slices tile n's columns."""
    parts: list[tuple[int, Dim, Dim]] = []  # (part, first column, end column)
    nodes: set[int] = set()
    todo = [n]
    while todo:
        m = todo.pop()
        nodes.add(m.id)
        if m.op == "add" and m.shape == n.shape:
            todo += [ir.node(a) for a in m.args]
            continue
        start = column_start(m, rows) if m.op == "unindex" else None
        if start is None:
            return None
        parts.append((m.args[0], start, start + ir.node(m.args[0]).shape[-1]))
    ordered = _tiling(parts, n.shape[-1])
    return None if ordered is None else Concat(n.id, ordered, frozenset(nodes))


def _tiling(parts: list[tuple[int, Dim, Dim]], width: Dim) -> tuple[tuple[int, Dim], ...] | None:
    """The parts in column order when each starts where the previous ends and the last ends at `width`."""
    ordered, at = [], ZERO
    remaining = list(parts)
    while remaining:
        nxt = next((p for p in remaining if p[1] == at), None)
        if nxt is None:
            return None
        remaining.remove(nxt)
        ordered.append((nxt[0], nxt[1]))
        at = nxt[2]
    return tuple(ordered) if at == width else None


def dim_lines(ir: KernelIR, needed: set[str]) -> list[tuple[str, str]]:
    """(`d_<dim>`, source) host lines binding the dims in `needed` and those their sources read, in order."""
    bindings = dim_bindings(ir, lambda name: name)
    want = set(needed)
    for name, source in reversed(bindings):
        if name in want:
            want.update(re.findall(r"\bd_(\w+)", source))
    return [(f"d_{name}", source) for name, source in bindings if name in want]
