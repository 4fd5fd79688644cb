"""The built-in functions a spec may call, as data: name -> parameters and how the checker lowers it."""

from __future__ import annotations

from dataclasses import dataclass

from fusegen.dsl.ir import DTYPES, NORM_OPS, REDUCE_OPS, UNARY_OPS


@dataclass(frozen=True)
class Param:
    """One parameter: its name, what it accepts, and whether it may be left out."""

    name: str
    kind: str  # "value" (a tensor or scalar), "int" / "bool" (a literal), "bound" (a number or None)
    optional: bool = False


@dataclass(frozen=True)
class Signature:
    """A function: the IR op it becomes and how its arguments lower (`family` picks the lowering rule)."""

    name: str
    op: str
    family: str  # "unary" | "binary" | "reduce" | "clamp" | "where" | "norm" | "cast"
    params: tuple[Param, ...]

    def usage(self) -> str:
        """`sum(x, axis, keepdim=...)`, for hints."""
        parts = [f"{p.name}=..." if p.optional else p.name for p in self.params]
        return f"{self.name}({', '.join(parts)})"


_X = Param("x", "value")
_UNARY_FUNCTIONS = tuple(op for op in UNARY_OPS if op != "neg")  # `neg` is spelled `-x`


def _table() -> dict[str, Signature]:
    sigs = [Signature(op, op, "unary", (_X,)) for op in _UNARY_FUNCTIONS]
    sigs += [
        Signature(op, op, "binary", (Param("a", "value"), Param("b", "value")))
        for op in ("maximum", "minimum")
    ]
    reduce_params = (_X, Param("axis", "int"), Param("keepdim", "bool", optional=True))
    sigs += [Signature(op, op, "reduce", reduce_params) for op in REDUCE_OPS]
    bounds = (_X, Param("min", "bound", optional=True), Param("max", "bound", optional=True))
    sigs.append(Signature("clamp", "clamp", "clamp", bounds))
    sigs.append(
        Signature(
            "where", "where", "where", (Param("cond", "value"), Param("a", "value"), Param("b", "value"))
        )
    )
    affine = {"layernorm": ("gamma", "beta"), "rmsnorm": ("gamma",)}
    for op in NORM_OPS:
        extra = tuple(Param(name, "value", optional=True) for name in affine[op])
        sigs.append(Signature(op, op, "norm", (_X, Param("eps", "value"), *extra)))
    sigs += [Signature(dtype, "cast", "cast", (_X,)) for dtype in DTYPES]
    return {sig.name: sig for sig in sigs}


#: every callable name.
SIGNATURES: dict[str, Signature] = _table()
