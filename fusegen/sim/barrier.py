"""Instance scheduling: a turn lock, a core barrier that fails instead of hanging, worker threads."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import TypeVar

from .errors import BarrierError, Located

T = TypeVar("T")


class Mailbox:
    """Per launch: each core's rendezvous so far (exchanges and core_barriers, isa_lnc.py) and the posts
    their receivers have not collected yet."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count: dict[int, int] = {}
        self.posts: dict[tuple[int, int], object] = {}


class CoreBarrier:
    """A reusable barrier that fails (instead of hanging) when an instance errors or exits early.

    Instances take turns holding `turn`: only the holder runs interpreter code, so interpreter state is
    never touched concurrently, and threads do not fight over the GIL at every small torch call (each
    releases it; free-running threads measured much slower). An instance hands the turn over while it
    waits here and while it runs long GIL-free torch ops (`off_turn`: deferred GEMMs), which then
    overlap another instance's Python work on the other core.
    """

    def __init__(self, parties: int) -> None:
        self.parties = parties
        self.turn = threading.Lock()
        self.cond = threading.Condition()
        self.arrived = 0
        self.generation = 0
        self.broken: str | None = None
        self.finished: list[int] = []
        self.mailbox = Mailbox()  # what the cores bring to each rendezvous on this barrier

    def off_turn(self, fn: Callable[[], T], idle: Callable[[], bool] | None = None) -> T:
        """Run `fn` (a long torch op that releases the GIL) while another instance takes the turn; then, if
        it succeeded and the turn is still taken, call `idle` (more such work of this instance) until it
        returns False, instead of leaving this core idle. Errors propagate with the turn taken back."""
        self.turn.release()
        taken = False
        try:
            result = fn()
            # idle work only after success: none after a failure, whose error stays the one raised
            while idle is not None and not (taken := self.turn.acquire(blocking=False)):
                idle = idle if idle() else None
            return result
        finally:  # the turn is taken back whatever failed
            if not taken:
                self.turn.acquire()

    def wait(self, core: int, ins: Located) -> None:
        """Block until all parties arrive."""
        self.off_turn(lambda: self._wait(core, ins))

    def _wait(self, core: int, ins: Located) -> None:
        """The condition-variable part of wait()."""
        with self.cond:
            gen = self.generation
            self.arrived += 1
            if self.arrived == self.parties:
                self.arrived, self.generation = 0, gen + 1
                self.cond.notify_all()
                return
            while self.generation == gen and self.broken is None and not self.finished:
                self.cond.wait()
            if self.generation != gen:
                return
            why = self.broken or f"core(s) {self.finished} finished without reaching it"
            raise ins.fail(BarrierError, f"core {core} waits at barrier #{gen}, but {why}")

    def abort(self, reason: str) -> None:
        """Release every waiter with an error."""
        with self.cond:
            self.broken = self.broken or reason
            self.cond.notify_all()

    def finish(self, core: int) -> None:
        """An instance returned; anyone still waiting can never be released."""
        with self.cond:
            self.finished.append(core)
            self.cond.notify_all()


class _Worker:
    """A daemon thread that runs submitted calls, reused across launches."""

    def __init__(self, index: int) -> None:
        self.jobs: queue.SimpleQueue[tuple[Callable[[int], None], int, threading.Event]] = queue.SimpleQueue()
        threading.Thread(target=self._loop, name=f"nki-core{index}", daemon=True).start()

    def _loop(self) -> None:
        """Run queued jobs forever (daemon thread)."""
        while True:
            fn, arg, event = self.jobs.get()
            try:
                fn(arg)
            finally:
                event.set()

    def submit(self, fn: Callable[[int], None], arg: int) -> threading.Event:
        """Queue fn(arg); the event is set when it returns."""
        event = threading.Event()
        self.jobs.put((fn, arg, event))
        return event


_WORKERS: dict[int, _Worker] = {}
_WORKERS_LOCK = threading.Lock()


def worker(index: int) -> _Worker:
    """The worker thread serving program instance `index`."""
    with _WORKERS_LOCK:
        if index not in _WORKERS:
            _WORKERS[index] = _Worker(index)
        return _WORKERS[index]
