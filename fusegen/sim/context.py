"""Per-program-instance interpreter state, reachable from the executing thread."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Protocol

import torch

from .deferred import MatmulQueue
from .errors import SimError, fault
from .targets import TARGETS, Target

if TYPE_CHECKING:
    from .barrier import CoreBarrier
    from .memory import Alloc, Span
    from .pool import StoragePool
    from .trace import Row

_tls = threading.local()
# Target used outside a launch (e.g. nl.tile_size read at import time); set by installed().
default_target: list[Target] = [TARGETS["trn2"]]


class LaunchState(Protocol):
    """What instances use of their launch (launch.Launch; not imported here, so no import circle)."""

    grid: int
    target: Target
    strict: bool
    rules_error: bool
    barrier: CoreBarrier
    contexts: list[Context]
    pool: StoragePool
    deferred: list[tuple[int, SimError]]
    stop_above: int

    def shared_alloc(
        self, ctx: Context, shape: tuple[int, ...], dtype: torch.dtype, name: str, site: tuple[str, int]
    ) -> Alloc:
        """The n-th shared_hbm allocation of every instance is the same tensor."""
        ...


class Context:
    """State of one program instance (one core): trace, barrier epoch, engine registers, allocations."""

    def __init__(self, core: int, launch: LaunchState) -> None:
        self.core = core
        self.launch = launch
        self.target: Target = launch.target
        self.strict: bool = launch.strict
        self.rules_error: bool = launch.rules_error  # rules.py violations raise (else warn)
        self.records: list[Row] = []  # trace records, as rows (trace.py)
        self.sites: list[tuple[str, int]] = []  # source line of every started instruction
        self.ops: list[str] = []  # and its op name
        self.epoch = 0
        self.regs: dict[str, torch.Tensor] = {}
        self.grid = launch.grid
        self.off_turn = launch.barrier.off_turn  # run a long GIL-free torch call while others take turns
        self.matmuls = MatmulQueue(self.off_turn)
        self.spans: list[Span] = []  # of on-chip allocations, for interval liveness
        self.shared_count = 0  # shared_hbm allocations so far (matched across instances by order)

    def reduce_regs(self, engine: str) -> torch.Tensor | None:
        """The engine's 128 fp32 accumulation registers; None until a reduce_cmd resets them (they hold
        whatever an earlier kernel left, like never-written memory)."""
        return self.regs.get(engine)

    def reset_regs(self, engine: str, fill: float = 0.0) -> torch.Tensor:
        """Set the engine's registers to `fill` (a reset; NaN poisons never-reset ones when strict=False)."""
        regs = self.regs.get(engine)
        if regs is None:
            regs = self.regs[engine] = torch.empty(self.target.partitions, dtype=torch.float32)
        return regs.fill_(fill)


def current() -> Context:
    """The running instance's context; an error outside a kernel launch."""
    ctx = getattr(_tls, "ctx", None)
    if ctx is None:
        raise fault(SimError, "nki", "called outside a kernel launched through @nki.jit")
    return ctx


def current_or_none() -> Context | None:
    """The running instance's context, if any."""
    return getattr(_tls, "ctx", None)


def set_current(ctx: Context | None) -> None:
    """Bind (or unbind) this thread to an instance."""
    _tls.ctx = ctx


def active_target() -> Target:
    """The running launch's target, else the installed default."""
    ctx = current_or_none()
    return ctx.target if ctx is not None else default_target[-1]
