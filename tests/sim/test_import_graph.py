"""fusegen/sim's modules import each other without circles (type-only imports included)."""

from __future__ import annotations

import ast
from pathlib import Path

import fusegen.sim

PACKAGE = Path(fusegen.sim.__file__).parent


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that `path` imports anywhere (under TYPE_CHECKING and in functions too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:  # from .x import y / from . import x
                names = [node.module] if node.module else [a.name for a in node.names]
            elif node.level == 0 and node.module and node.module.startswith("fusegen.sim."):
                names = [node.module.removeprefix("fusegen.sim.")]
            else:
                continue
        elif isinstance(node, ast.Import):
            names = [
                a.name.removeprefix("fusegen.sim.") for a in node.names if a.name.startswith("fusegen.sim.")
            ]
        else:
            continue
        found.update(name.split(".")[0] for name in names)
    return found & modules


def import_graph() -> dict[str, set[str]]:
    """Module name -> the package modules it imports."""
    paths = {p.stem: p for p in PACKAGE.glob("*.py")}
    return {name: _imports(path, set(paths)) for name, path in paths.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as [a, b, ..., a], or None (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_sim_import_graph_is_acyclic() -> None:
    graph = import_graph()
    assert {"launch", "context", "instr", "barrier", "liveness"} <= set(graph)
    assert "context" in graph["launch"] and "instr" in graph["isa"]  # the walk sees imports at all
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_find_cycle_reports_a_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
