"""Kernel families: an IR matcher, the hook points its template offers, and the error when none match."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from fusegen.dsl.diagnostics import Diagnostic, Span, SpecError
from fusegen.dsl.ir import BINARY_OPS, COMPARE_OPS, UNARY_OPS, KernelIR, Node, Shape, shape_str

if TYPE_CHECKING:  # the planners import the families' helpers
    from fusegen.codegen.plan import TilePlan

#: Ops every family treats as elementwise (comparisons give 1.0 / 0.0, `where` selects by them: stage.py),
#: and the trace-time scalars.
ELEMENTWISE = frozenset((*UNARY_OPS, *BINARY_OPS, *COMPARE_OPS, "pow", "clamp", "cast", "where"))
SCALAR_LEAVES = frozenset(("param", "const", "dim"))


def kernel_arg(name: str) -> str:
    """A kernel's name for spec input `name` (suffixed so it never meets a template local)."""
    return f"{name}_hbm"


class Family(Protocol):
    """What the build needs of a kernel family: a matcher, per-shape plans and the kernel source."""

    @property
    def name(self) -> str:
        """The family's name, e.g. `ffn`."""

    @property
    def summary(self) -> str:
        """What the family matches, in one line."""

    @property
    def hooks(self) -> tuple[str, ...]:
        """The hook points its template offers."""

    @property
    def planning(self) -> str:
        """How its planner chooses, for plan.md."""

    def match(self, ir: KernelIR) -> Any:
        """The family's roles in `ir` (raises Mismatch)."""

    def plans(self, ir: KernelIR, m: Any, target: str, lnc: int) -> Any:
        """One TilePlan per check shape (raises PlanError)."""

    def candidates(self, ir: KernelIR, m: Any, dims: dict[str, int], target: str, lnc: int,
                   count: int) -> list[TilePlan]:  # fmt: skip
        """The planner's `count` best plans at `dims`, best first; [] for a planner without a search (raises
        PlanError)."""

    def kernel_source(self, ir: KernelIR, m: Any, target: str, lnc: int) -> str:
        """kernel.py."""

    @property
    def trainable(self) -> bool:
        """Whether its ops get autograd (a backward_reference.py, and kernels where `backward` gives them)."""

    def backward(self, ir: KernelIR, target: str, lnc: int) -> KernelBackward | None:
        """The backward kernels of the spec's own IR `ir`, or None where the family has none for it (raises
        PlanError when no plan fits)."""


@dataclass(frozen=True)
class KernelBackward:
    """A family's backward files by name (backward_kernel.py, backward_plan.md) and the backward IR its
    kernels compute (ops.py passes them its inputs; None: a plan only, the op's backward runs the
    reference)."""

    ir: KernelIR | None
    files: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Mismatch(Exception):
    """Where and why a spec leaves a family."""

    family: str
    span: Span
    reason: str
    relevant: bool = True  # False: the spec lacks what defines the family (an FFN's matmul), so it is no
    # candidate for the line the user must change


def leave(family: str, node: Node, reason: str) -> Mismatch:
    """A mismatch at `node`, with its shape in the message."""
    return Mismatch(family, node.span, f"{reason} ({describe(node)})")


def describe(node: Node) -> str:
    """`` `x` is f32[T, H] ``: a value as the spec declares it, for messages. An unnamed value is "the value
    here" (the caret shows it): its op may be one the spec never wrote, such as the lifting's `index`."""
    what = f"`{node.name}`" if node.name else "the value here"
    return f"{what} is {node.dtype}{shape_str(node.shape)}"


def shape_is(shape: Shape, *expected: Shape) -> bool:
    """Whether `shape` equals one of `expected`."""
    return any(shape == e for e in expected)


def no_family_error(ir: KernelIR, mismatches: Iterable[Mismatch], source: str) -> SpecError:
    """One error naming every family and where the spec leaves it, the caret on the line the best-matching
    family could not take: of the families whose defining structure the spec has, the one that got
    furthest into it (its mismatch lies latest), its reason first."""
    found = list(mismatches)
    candidates = [m for m in found if m.relevant] or found
    best = max(candidates, key=lambda m: (m.span.line, m.span.col))
    names = ", ".join(m.family for m in found)
    notes = [
        Diagnostic(m.span, f"leaves the {m.family} family here: {m.reason}", level="note")
        for m in [best] + [m for m in found if m is not best]
    ]
    head = Diagnostic(
        best.span,
        f"no kernel family matches `{ir.name}` (tried: {names}); the {best.family} family comes closest "
        "and cannot take this line",
        hint="`fusegen list` shows each family's shape; docs/variants.md shows how to write one",
    )
    return SpecError([head, *notes], source)
