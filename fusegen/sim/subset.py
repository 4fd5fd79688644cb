"""The NKI language subset: an AST check of a kernel body and the same-module helpers it calls.

NKI specializes a kernel by interpreting a Python subset (GUIDE "Compilation Model", "NKI Values",
"Control Flow"); constructs outside it run on CPU simulators but do not compile. Checked here (rules.py):
generators (`yield`, `yield from`, `next(...)`, `async`/`await`), `is` / `is not`, and a keyword-only `*`
in the kernel's own signature. The check runs once
per kernel function (cached) at its first launch; it follows calls to functions defined in the kernel's own
module by name, and nested functions are part of the body that defines them.
"""

from __future__ import annotations

import ast
import functools
import linecache
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

#: (rule name, file, line, detail)
Finding = tuple[str, str, int, str]

# Python 3.11's AST constructor counts its recursion depth in interpreter-wide state, so two threads parsing
# at once (kernels first launched from a thread pool) can fail with "SystemError: AST constructor recursion
# depth mismatch" (CPython gh-106905; reproduced here on 3.11.7 with two parsing threads and a finalizer).
# The lock covers fusegen's parses at run time (`parse`); a parse elsewhere in the process is not covered.
_PARSE_LOCK = threading.Lock()


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """ast.parse, one thread at a time (see _PARSE_LOCK)."""
    with _PARSE_LOCK:
        return ast.parse(source, filename)


def _module_functions(filename: str) -> dict[int, ast.FunctionDef | ast.AsyncFunctionDef]:
    """Every function definition of a source file as it is now, keyed by the line co_firstlineno reports: a
    file rewritten at the same path (a kernel rebuilt in one process) is read and parsed again, not checked
    by the old file's functions at the same lines."""
    linecache.checkcache(filename)
    return _functions_in("".join(linecache.getlines(filename)), filename)


@functools.lru_cache(maxsize=64)
def _functions_in(source: str, filename: str) -> dict[int, ast.FunctionDef | ast.AsyncFunctionDef]:
    """The function definitions of `source` by first line (cached: a kernel's file is parsed once)."""
    if not source:
        return {}
    try:
        tree = parse(source, filename)
    except SyntaxError:
        return {}
    found: dict[int, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            found[first] = node
    return found


def _definition(fn: types.FunctionType) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The AST of a Python function, if its source file is readable."""
    code = fn.__code__
    return _module_functions(code.co_filename).get(code.co_firstlineno)


def _node_findings(node: ast.AST, filename: str) -> Iterator[Finding]:
    """Constructs outside the subset within one function body (nested functions included)."""
    for sub in ast.walk(node):
        line = getattr(sub, "lineno", 0)
        if isinstance(sub, ast.Yield | ast.YieldFrom):
            yield "lang-no-generator", filename, line, "`yield` makes a generator"
        elif isinstance(sub, ast.Await | ast.AsyncFunctionDef | ast.AsyncFor | ast.AsyncWith):
            yield "lang-no-generator", filename, line, "async code is not traced"
        elif isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id == "next":
            yield "lang-no-generator", filename, line, "`next(...)` steps an iterator or generator"
        elif isinstance(sub, ast.Compare) and any(isinstance(op, ast.Is | ast.IsNot) for op in sub.ops):
            yield "lang-no-is", filename, line, "`is` / `is not` comparison"


def _signature_findings(node: ast.FunctionDef | ast.AsyncFunctionDef, filename: str) -> Iterator[Finding]:
    """The kernel's own signature: no keyword-only parameters (MIG: the 0.3.0 compiler rejects `*`)."""
    if node.args.kwonlyargs:
        names = ", ".join(a.arg for a in node.args.kwonlyargs)
        yield "lang-no-kwonly", filename, node.lineno, f"keyword-only parameter(s) {names} after `*`"


def _called_helpers(node: ast.AST, fn: types.FunctionType) -> Iterator[types.FunctionType]:
    """Functions of fn's own module that the body calls by name."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name):
            target: Any = fn.__globals__.get(sub.func.id)
            target = getattr(target, "fn", target)  # a @nki.jit Kernel wraps its function
            if (
                isinstance(target, types.FunctionType)
                and target.__code__.co_filename == fn.__code__.co_filename
            ):
                yield target


def findings(fn: Callable[..., Any]) -> tuple[Finding, ...]:
    """Every subset violation in `fn` and the same-module helpers it reaches (cached per function)."""
    if not isinstance(fn, types.FunctionType):
        return ()
    return _findings(fn)


@functools.lru_cache(maxsize=256)
def _findings(fn: types.FunctionType) -> tuple[Finding, ...]:
    """Uncached findings, walking the call graph breadth-first."""
    out: list[Finding] = []
    seen: set[types.CodeType] = set()
    todo = [fn]
    while todo:
        current = todo.pop(0)
        if current.__code__ in seen:
            continue
        seen.add(current.__code__)
        node = _definition(current)
        if node is None:
            continue
        found = list(_node_findings(node, current.__code__.co_filename))
        if current is fn:
            found.extend(_signature_findings(node, current.__code__.co_filename))
        out.extend(sorted(found, key=lambda f: f[2]))
        todo.extend(_called_helpers(node, current))
    return tuple(out)
