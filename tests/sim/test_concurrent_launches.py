"""Launches overlapping on several threads (thread pools) leave the process-wide runtime settings (GIL switch
interval, cyclic GC, torch's thread count) as they found them, whatever order they end in."""

from __future__ import annotations

import ast
import gc
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch

import fusegen.sim as sim
from fusegen.sim import launch, subset

with sim.installed():
    import nki
    import nki.isa as nisa
    import nki.language as nl

WAIT_S = 60  # a generous bound: a missed signal fails the test instead of hanging it
_ROLE = threading.local()  # the launching thread's role, naming its hook


@nki.jit
def double(x_hbm):
    x = nl.ndarray(x_hbm.shape, dtype=x_hbm.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=x, src=x_hbm)
    y = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=y, data=x, op0=nl.multiply, operand0=2.0)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=y)
    return out


def _fresh_thread_torch_threads() -> int:
    """torch's thread count as a new thread sees it (the process default)."""
    seen: list[int] = []
    thread = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    return seen[0]


def _settings() -> tuple[float, bool, int, int]:
    """Switch interval, GC state, this thread's and a new thread's torch thread count."""
    return sys.getswitchinterval(), gc.isenabled(), torch.get_num_threads(), _fresh_thread_torch_threads()


@pytest.fixture
def hooks(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Callable[[], None]]]:
    """Calls run inside a launch (after its settings were made), keyed by the launching thread's role; with
    two torch threads and GC on, so that a launch's values differ from the ones to restore."""
    table: dict[str, Callable[[], None]] = {}
    original = launch.Launch.run

    def run(self: launch.Launch, *args: Any) -> launch.RunResult:
        table[_ROLE.name]()
        return original(self, *args)

    monkeypatch.setattr(launch.Launch, "run", run)
    threads, gc_was_enabled = torch.get_num_threads(), gc.isenabled()
    torch.set_num_threads(2)
    gc.enable()
    try:
        yield table
    finally:
        torch.set_num_threads(threads)
        if not gc_was_enabled:
            gc.disable()


def _launch_as(name: str, x: torch.Tensor) -> torch.Tensor:
    """Run `double` on this thread in the given role."""
    _ROLE.name = name
    return double(x)


@pytest.mark.parametrize("first_fails", [False, True])
def test_overlapping_launches_restore_the_settings_after_the_last_ends(
    hooks: dict[str, Callable[[], None]], first_fails: bool
) -> None:
    """The first launch starts, the second starts, the first ends (or raises) while the second still runs,
    then the second ends: the second keeps the quiet settings to its end, and afterwards all are as before
    (with a save and restore per launch, the second saved the first's quiet values and restored those)."""
    before = _settings()
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    during_second: list[tuple[float, bool]] = []

    def first() -> None:
        first_in.set()
        assert second_in.wait(WAIT_S)
        if first_fails:
            raise RuntimeError("first launch failed")

    def second() -> None:
        assert first_in.wait(WAIT_S)
        second_in.set()
        assert first_out.wait(WAIT_S)
        during_second.append((sys.getswitchinterval(), gc.isenabled()))

    hooks.update(first=first, second=second)

    counts: list[int] = []  # each launching thread's torch count once its launch returned

    def run_first(x: torch.Tensor) -> torch.Tensor:
        try:
            return _launch_as("first", x)
        finally:
            counts.append(torch.get_num_threads())
            first_out.set()

    def run_second(x: torch.Tensor) -> torch.Tensor:
        try:
            return _launch_as("second", x)
        finally:
            counts.append(torch.get_num_threads())

    x = torch.randn(128, 64)
    with ThreadPoolExecutor(2) as pool:
        a, b = pool.submit(run_first, x), pool.submit(run_second, x)
        if first_fails:
            with pytest.raises(RuntimeError, match="first launch failed"):
                a.result(WAIT_S)
        else:
            assert torch.equal(a.result(WAIT_S), x * 2)
        assert torch.equal(b.result(WAIT_S), x * 2)
    assert during_second == [(pytest.approx(launch._SWITCH_INTERVAL_S), False)]  # kept in whole µs
    assert _settings() == before and counts == [before[2], before[2]]
    assert launch._quiet_runtime.active == 0


def test_a_launch_that_raises_restores_the_settings(hooks: dict[str, Callable[[], None]]) -> None:
    """An exception inside a launch leaves no launch counted and the settings as before."""
    before = _settings()

    def fail() -> None:
        assert sys.getswitchinterval() == pytest.approx(launch._SWITCH_INTERVAL_S) and not gc.isenabled()
        raise RuntimeError("launch failed")

    hooks.update(only=fail)
    with pytest.raises(RuntimeError, match="launch failed"):
        _launch_as("only", torch.randn(128, 64))
    assert _settings() == before
    assert launch._quiet_runtime.active == 0


def test_two_threads_parse_kernel_sources_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The subset check parses a kernel's source file at its first launch; two parses at once can raise a
    spurious SystemError on Python 3.11 (subset.py), so they take turns. A parse waits up to 0.5 s for a
    second one to start beside it."""
    together, overlapped = threading.Barrier(2), []
    original = ast.parse

    def parse(*args: Any, **kwargs: Any) -> ast.AST:
        try:
            together.wait(timeout=0.5)
            overlapped.append(True)
        except threading.BrokenBarrierError:
            pass  # no second parse started meanwhile
        return original(*args, **kwargs)

    monkeypatch.setattr(ast, "parse", parse)
    subset._functions_in.cache_clear()
    subset._findings.cache_clear()
    with ThreadPoolExecutor(2) as pool:
        found = [f.result(WAIT_S) for f in [pool.submit(subset.findings, double.fn) for _ in range(2)]]
    assert found == [(), ()] and not overlapped
