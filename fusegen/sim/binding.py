"""Make `import nki`, `nki.isa`, `nki.language` resolve to the interpreter inside a `with` block."""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from . import context, isa, language
from .conformance import DEFAULT_RULES, check_mode
from .errors import SimError
from .launch import Kernel
from .targets import get_target

_module_ids = itertools.count()


def _make_nki_module(target: str, strict: bool, rules: str) -> types.ModuleType:
    """A fresh top-level `nki` module whose jit binds kernels to this configuration."""
    mod = types.ModuleType("nki", "fusegen.sim CPU interpreter of NKI")
    mod.__path__ = []  # a package: nki.isa / nki.language come from sys.modules

    def jit(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
        """Decorator (bare or with options) producing a runnable Kernel."""
        if fn is None:
            return lambda f: Kernel(f, target, strict, options, rules)
        return Kernel(fn, target, strict, options, rules)

    mod.jit = jit  # type: ignore[attr-defined]
    mod.simulate = lambda k: k if isinstance(k, Kernel) else jit(k)  # type: ignore[attr-defined]
    mod.isa = isa  # type: ignore[attr-defined]
    mod.language = language  # type: ignore[attr-defined]
    mod.__fusegen_sim__ = True  # type: ignore[attr-defined]
    return mod


def _real_nki_present() -> bool:
    """True if an `nki` that is not ours is importable."""
    existing = sys.modules.get("nki")
    if existing is not None:
        return not getattr(existing, "__fusegen_sim__", False)
    try:
        return importlib.util.find_spec("nki") is not None
    except (ImportError, ValueError):
        return False


def _is_nki_name(name: str) -> bool:
    """True for 'nki' and its submodules."""
    return name == "nki" or name.startswith("nki.")


@contextlib.contextmanager
def installed(
    target: str = "trn2", force: bool = False, strict: bool = True, rules: str = DEFAULT_RULES
) -> Iterator[types.ModuleType]:
    """Bind `nki` to the interpreter for code imported in the block; sys.modules is restored after.

    A real installed `nki` is never shadowed unless force=True (SimError otherwise). Kernels decorated in
    the block keep their configuration and stay runnable afterwards. strict=False turns reads of
    never-written memory into warnings; rules="error" makes every documented rule (rules.py) an error.
    """
    tgt = get_target(target)
    if not force and _real_nki_present():
        raise SimError("a real `nki` package is importable; pass force=True to shadow it with fusegen.sim")
    saved = {name: mod for name, mod in sys.modules.items() if _is_nki_name(name)}
    module = _make_nki_module(target, strict, check_mode(rules))
    sys.modules.update({"nki": module, "nki.isa": isa, "nki.language": language})
    context.default_target.append(tgt)
    try:
        yield module
    finally:
        context.default_target.pop()
        for name in [n for n in sys.modules if _is_nki_name(n)]:
            del sys.modules[name]
        sys.modules.update(saved)


def load_module(
    path: str | Path,
    target: str = "trn2",
    force: bool = False,
    strict: bool = True,
    rules: str = DEFAULT_RULES,
) -> types.ModuleType:
    """Import a kernel source file under installed() and return the module."""
    path = Path(path)
    name = f"_fusegen_sim_kernels.{path.stem}_{next(_module_ids)}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SimError(f"cannot import kernel file {path}")
    module = importlib.util.module_from_spec(spec)
    with installed(target=target, force=force, strict=strict, rules=rules):
        spec.loader.exec_module(module)
    return module
