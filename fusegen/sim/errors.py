"""Simulator exceptions; each names the kernel source line that caused it."""

from __future__ import annotations

import itertools
import os
import sys
import types
from collections.abc import Callable
from typing import Protocol

_SIM_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


class SimError(Exception):
    """Base class of every fault the interpreter detects."""


class Located(Protocol):
    """Something at a kernel source line that builds its errors (an executing instruction)."""

    def fail(self, cls: type[SimError], detail: str) -> SimError:
        """An exception of class `cls` located at the source line."""
        ...


class PartitionError(SimError):
    """A tile spans more partitions than the hardware has."""


class MatmulShapeError(SimError):
    """nc_matmul operands exceed the PE array or the PSUM bank."""


class EngineMemoryError(SimError):
    """An engine touched a memory it cannot access."""


class OutOfBoundsError(SimError):
    """A view or access reaches outside its allocation."""


class ShapeMismatchError(SimError):
    """Operand element counts do not agree."""


class CapacityError(SimError):
    """SBUF or PSUM usage exceeds the target's capacity."""


class UninitializedReadError(SimError):
    """An instruction read memory that was never written."""


class AccumulateError(SimError):
    """PSUM accumulation onto data no matmul wrote."""


class DtypeError(SimError):
    """An operand dtype the instruction does not accept."""


class RaceError(SimError):
    """Two cores touched the same shared-HBM elements between barriers."""


class InputRangeError(SimError):
    """An instruction input outside its documented valid range (the hardware's result is invalid)."""


class InvalidArgumentError(SimError):
    """A parameter value or combination the API rejects."""


class BarrierError(SimError):
    """Program instances disagree on core_barrier calls."""


class UnsupportedError(SimError):
    """A legal NKI feature this interpreter does not model."""


class UninitializedReadWarning(UserWarning):
    """Non-strict mode: a read of never-written memory."""


#: (id of a code object, bytecode offset) -> (that code object, (file, line)): f_lineno decodes the line
#: table, linearly in the size of the function (a generated kernel is one large function), and every
#: instruction asks for its line. Keyed by id (hashing a code object hashes its constants every time);
#: the entry keeps its code object, so the id cannot be reused while the entry exists.
_SITES: dict[tuple[int, int], tuple[types.CodeType, tuple[str, int]]] = {}


def user_site() -> tuple[str, int]:
    """File and line of the innermost stack frame outside the simulator package."""
    frame = sys._getframe(1)
    while frame.f_code.co_filename.startswith(_SIM_DIR):
        back = frame.f_back
        if back is None:
            break
        frame = back
    code = frame.f_code
    key = (id(code), frame.f_lasti)
    entry = _SITES.get(key)
    if entry is None:
        if len(_SITES) > 100_000:  # kernels loaded over and over (tests): start over, never grow unbounded
            _SITES.clear()
        entry = _SITES[key] = (code, (code.co_filename, frame.f_lineno))
    return entry[1]


def fault(cls: type[SimError], op: str, detail: str, site: tuple[str, int] | None = None) -> SimError:
    """Build an exception whose message starts with 'file:line: op:'."""
    file, line = site if site is not None else user_site()
    return cls(f"{file}:{line}: {op}: {detail}")


#: Python/torch exceptions an instruction's torch code may raise for inputs it cannot handle
_TORCH_FAILURES = (RuntimeError, NotImplementedError, TypeError, ValueError, IndexError, OverflowError)


def instruction_failure(exc: BaseException) -> SimError | None:
    """A raw failure raised inside an interpreter call, as a SimError at the kernel line that made the call
    (UnsupportedError; InvalidArgumentError for a call with wrong arguments); None if not one."""
    if isinstance(exc, SimError) or not isinstance(exc, _TORCH_FAILURES):
        return None
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for caller, callee in itertools.pairwise(frames):
        inside = callee.f_code.co_filename.startswith(_SIM_DIR)
        if inside and not caller.f_code.co_filename.startswith(_SIM_DIR):
            site = (caller.f_code.co_filename, caller.f_lineno)
            detail = f"not modelled by the interpreter ({type(exc).__name__}: {exc})"
            return fault(UnsupportedError, callee.f_code.co_name, detail, site)
    last = frames[-1] if frames else None
    called = str(exc).split("(")[0]
    if isinstance(exc, TypeError) and last is not None and called in API_NAMES:
        return fault(InvalidArgumentError, called, str(exc), (last.f_code.co_filename, last.f_lineno))
    return None


#: nki.isa / nki.language callables, for wrong-argument messages (filled in by isa.py)
API_NAMES: set[str] = set()


def unmodelled_names(module: str, names: frozenset[str]) -> Callable[[str], object]:
    """A module `__getattr__`: each of `names` (legal NKI of AWS's stub the interpreter does not model) is a
    callable raising UnsupportedError at the kernel's line (docs/sim.md); any other name an AttributeError."""

    def getattr_(name: str) -> object:
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")

        def unmodelled(*args: object, **kwargs: object) -> None:
            raise fault(UnsupportedError, name, "not modelled by the interpreter (docs/sim.md, Not modelled)")

        unmodelled.__name__ = name
        return unmodelled

    return getattr_
