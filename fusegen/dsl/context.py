"""The checker's working state: diagnostics collected so far, names in scope, and the nodes built."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from fusegen.dsl import ir
from fusegen.dsl.diagnostics import Diagnostic, Span, SpecError
from fusegen.dsl.names import did_you_mean, name_problem

#: the node of a name whose definition failed: its uses stay quiet instead of repeating the error.
FAILED_NODE = -1


def article(word: str) -> str:
    """`an input`, `a param`."""
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


@dataclass(frozen=True)
class Binding:
    """What a name means: a node, declared by a kind of line at a span."""

    node: int
    kind: str  # "input" | "param" | "value"
    span: Span


@dataclass
class Context:
    """Mutable while checking one spec; everything it accumulates ends up frozen in the KernelIR."""

    path: str
    errors: list[Diagnostic] = field(default_factory=list)
    warnings: list[Diagnostic] = field(default_factory=list)
    dims: dict[str, ir.DimDecl] = field(default_factory=dict)
    scope: dict[str, Binding] = field(default_factory=dict)
    #: statement names not yet reached, with their spans: reading one is a use before definition.
    pending: dict[str, Span] = field(default_factory=dict)
    #: every name declared so far, any kind, for duplicate detection.
    declared: dict[str, Span] = field(default_factory=dict)
    #: what each declared name is: "kernel", "dim", "input", "param" or "value".
    kinds: dict[str, str] = field(default_factory=dict)
    reads: set[str] = field(default_factory=set)
    #: names whose declaration failed: their uses stay quiet rather than repeat the error.
    failed: set[str] = field(default_factory=set)
    nodes: list[ir.Node] = field(default_factory=list)
    #: per node, the longest chain of operations ending at it (filled by the checker as nodes appear).
    chain: list[int] = field(default_factory=list)
    _leaves: dict[tuple[str, ir.AttrValue], int] = field(default_factory=dict)

    def error(self, span: Span, message: str, hint: str | None = None) -> None:
        """Record an error and keep checking (every error is reported at once)."""
        self.errors.append(Diagnostic(span, message, "error", hint))

    def warn(self, span: Span, message: str, hint: str | None = None) -> None:
        """Record a warning."""
        self.warnings.append(Diagnostic(span, message, "warning", hint))

    def declare(self, name: str, span: Span, what: str) -> bool:
        """Claim `name` for a declaration of kind `what`; report a bad or duplicate name. True if valid."""
        problem = name_problem(name)
        if problem:
            self.error(span, f"`{name}` cannot be used as {article(what)} name", problem)
            self.failed.add(name)
            return False
        earlier = self.declared.get(name)
        if earlier is not None and self.kinds.get(name) == "kernel":
            # the later line keeps the name, so its uses check quietly: the clash is the one error
            message = f"`{name}` is already the kernel's name (line {earlier.line})"
            hint = (f"the kernel's name shares one namespace with the dims, inputs, params and values: "
                    f"rename one, e.g. `kernel {name}_op`")  # fmt: skip
            self.error(span, message, hint)
        elif earlier is not None:
            self.error(
                span, f"`{name}` is already declared at line {earlier.line}", "every name is declared once"
            )
            return False
        self.declared[name] = span
        self.kinds[name] = what
        return True

    def fixed_dims(self) -> dict[str, int]:
        """The dims declared with a value (`HC = 4`)."""
        return {name: d.value for name, d in self.dims.items() if d.value is not None}

    def add_node(
        self,
        op: str,
        args: tuple[int, ...],
        attrs: tuple[tuple[str, ir.AttrValue], ...],
        shape: ir.Shape,
        dtype: str,
        span: Span,
        name: str | None = None,
    ) -> int:
        """Append a node and return its id."""
        node = ir.Node(len(self.nodes), op, args, attrs, shape, dtype, span, name)
        self.nodes.append(node)
        return node.id

    def add_leaf(self, op: str, key: str, value: ir.AttrValue, span: Span) -> int:
        """A scalar `const` or `dim` node, shared by every use of the same value."""
        cached = self._leaves.get((op, value))
        if cached is None:
            cached = self.add_node(op, (), ((key, value),), (), ir.COMPUTE_DTYPE, span)
            self._leaves[(op, value)] = cached
        return cached

    def name_node(self, node_id: int, name: str) -> None:
        """Give a computed node the statement name that binds it (leaves and declarations keep theirs)."""
        node = self.nodes[node_id]
        if node.name is None and node.op not in ("const", "dim"):
            self.nodes[node_id] = replace(node, name=name)

    def unknown_name(self, span: Span, name: str, what: str = "name") -> None:
        """Report a name that means nothing here, suggesting the closest known one."""
        known = [*self.scope, *self.dims, *self.pending]
        self.error(span, f"unknown {what} `{name}`", self.suggest(name, known))

    def suggest(self, name: str, candidates: Iterable[str]) -> str | None:
        """did_you_mean, for errors that will be shown: past the report's limit a hint is not worth the
        cost (thousands of unknown names against thousands of candidates would be quadratic)."""
        return did_you_mean(name, candidates) if len(self.errors) < SpecError.max_errors else None
