"""Where each dim gets its runtime value: an input's whole axis (`T`), or an axis linear in one dim not
yet known (`2*D`, `HC + 1`, `NQ + 2*NKV` once NKV is known), solved for that dim."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fusegen.dsl.ir import Dim, TensorDecl


@dataclass(frozen=True)
class DimSource:
    """`name` = (axis `axis` of input `input` - `rest`) // `coef`; a whole axis has rest 0 and coef 1."""

    name: str
    input: str
    axis: int
    rest: Dim
    coef: int

    @property
    def plain(self) -> bool:
        """Whether the axis is the dim itself."""
        return self.coef == 1 and self.rest == Dim.const(0)


def dim_sources(inputs: Sequence[TensorDecl], known: Iterable[str]) -> list[DimSource]:
    """Every dim the inputs' shapes determine beyond `known` (fixed dims), in an order that binds a dim
    only after the dims its axis also reads: first plain axes, then solved ones, one dim at a time."""
    bound = set(known)
    found: list[DimSource] = []
    for decl in inputs:
        for axis, dim in enumerate(decl.shape):
            names = dim.symbols()
            if len(names) == 1 and dim == Dim.sym(names[0]) and names[0] not in bound:
                bound.add(names[0])
                found.append(DimSource(names[0], decl.name, axis, Dim.const(0), 1))
    progress = True
    while progress:  # each round solves at least one more dim, so this ends within len(dims) rounds
        progress = False
        for decl in inputs:
            for axis, dim in enumerate(decl.shape):
                solved = _solve(dim, bound)
                if solved is not None:
                    name, coef = solved
                    bound.add(name)
                    found.append(DimSource(name, decl.name, axis, dim - Dim.sym(name) * coef, coef))
                    progress = True
    return found


def _solve(dim: Dim, bound: set[str]) -> tuple[str, int] | None:
    """(the one unbound dim, its coefficient) when `dim` is `coef * name + terms over bound dims`."""
    unbound = [s for s in dim.symbols() if s not in bound]
    if len(unbound) != 1:
        return None
    terms = [(mono, coef) for mono, coef in dim.terms if unbound[0] in mono]
    if len(terms) != 1 or terms[0][0] != (unbound[0],) or terms[0][1] <= 0:
        return None
    return unbound[0], terms[0][1]
