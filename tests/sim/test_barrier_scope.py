"""core_barrier orders accesses to its `data` tensor only [ISA core_barrier: "the shared data that all cores
need to synchronize on"]: another shared tensor exchanged across the same barrier is still a race."""

from __future__ import annotations

import pytest
import torch

import fusegen.sim as sim

from .conftest import assert_located, line_of

with sim.installed():
    import nki.isa as nisa
    import nki.language as nl

F32 = nl.float32
R, D = 256, 32
HALF = R // 2


def _squared_half(src_hbm, me):
    """This core's half of src, squared, in SBUF."""
    t = nl.ndarray((HALF, D), dtype=F32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=src_hbm[me * HALF : (me + 1) * HALF, 0:D])
    nisa.activation(dst=t, op=nl.square, data=t)
    return t


def _fetch(out, board, me):
    """The other core's half of the board into this core's half of out."""
    other = 1 - me
    t = nl.ndarray((HALF, D), dtype=F32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=board[other * HALF : (other + 1) * HALF, 0:D])
    nisa.dma_copy(dst=out[me * HALF : (me + 1) * HALF, 0:D], src=t)


def two_boards(a_hbm, b_hbm, barrier_on):
    """Each core publishes its half of a and of b on two shared boards, meets the other at a barrier on the
    boards named in `barrier_on`, and reads back the other core's halves of both."""
    me = nl.program_id(0)
    board_a = nl.ndarray((R, D), dtype=F32, buffer=nl.shared_hbm, name="board_a")
    board_b = nl.ndarray((R, D), dtype=F32, buffer=nl.shared_hbm, name="board_b")
    out_a = nl.ndarray((R, D), dtype=F32, buffer=nl.shared_hbm)
    out_b = nl.ndarray((R, D), dtype=F32, buffer=nl.shared_hbm)
    mine = slice(me * HALF, (me + 1) * HALF)
    nisa.dma_copy(dst=board_a[mine, 0:D], src=_squared_half(a_hbm, me))
    nisa.dma_copy(dst=board_b[mine, 0:D], src=_squared_half(b_hbm, me))  # <-write-b
    boards = {"a": board_a, "b": board_b, "a-slice": board_a[0:1, 0:D]}
    for name in barrier_on:
        nisa.core_barrier(data=boards[name], cores=(0, 1))
    _fetch(out_a, board_a, me)
    other = 1 - me
    t = nl.ndarray((HALF, D), dtype=F32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=board_b[other * HALF : (other + 1) * HALF, 0:D])  # <-read-b
    nisa.dma_copy(dst=out_b[me * HALF : (me + 1) * HALF, 0:D], src=t)
    return out_a, out_b


def _swapped_squares(x):
    """What two_boards computes of x: the halves swapped, squared."""
    sq = x * x
    return torch.cat([sq[HALF:], sq[:HALF]])


def _run(*barrier_on):
    a, b = torch.randn(R, D), torch.randn(R, D)
    out_a, out_b = sim.run(two_boards, a, b, barrier_on, grid=2, target="trn2", rules="error").outputs
    return (a, b), (out_a, out_b)


@pytest.mark.parametrize("barrier_on", [("a", "b"), ("b", "a"), ("a-slice", "b")])
def test_a_barrier_on_each_exchanged_tensor_orders_both(barrier_on):
    """A barrier on a view orders its whole tensor (the allocation the view belongs to)."""
    (a, b), (out_a, out_b) = _run(*barrier_on)
    assert torch.equal(out_a, _swapped_squares(a))
    assert torch.equal(out_b, _swapped_squares(b))


def test_a_barrier_on_another_tensor_does_not_order_this_one():
    """The barrier on board_a is passed by both cores, yet board_b's halves cross it unordered: a race
    (before, every core_barrier ordered every shared tensor, and this ran)."""
    with pytest.raises(sim.RaceError) as info:
        _run("a")
    msg = str(info.value)  # named from core 1's side: its write, or its read
    assert f":{_line('<-read-b')}" in msg and f":{_line('<-write-b')}" in msg
    assert "'board_b'" in msg and "no core_barrier on this tensor" in msg


def _line(marker):
    return line_of(__file__, marker)


def late_writer(x_hbm):
    """Core 1 writes a shared tensor before a barrier on another tensor, core 0 writes them after
    that barrier: nothing orders the two writes."""
    me = nl.program_id(0)
    shared = nl.ndarray((HALF, D), dtype=F32, buffer=nl.shared_hbm)
    flag = nl.ndarray((1, D), dtype=F32, buffer=nl.shared_hbm)
    t = nl.ndarray((HALF, D), dtype=F32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x_hbm)
    if me == 1:
        nisa.dma_copy(dst=shared, src=t)  # <-early-write
    nisa.core_barrier(data=flag, cores=(0, 1))
    if me == 0:
        nisa.dma_copy(dst=shared, src=t)  # <-late-write
    return shared


def test_writes_on_both_sides_of_a_barrier_on_another_tensor_race():
    with pytest.raises(sim.RaceError) as info:
        sim.run(late_writer, torch.randn(HALF, D), grid=2, target="trn2", rules="error")
    msg = str(info.value)
    assert f":{_line('<-early-write')}" in msg and f":{_line('<-late-write')}" in msg


def mismatched_barriers(x_hbm):
    """The two cores meet at barriers on different tensors."""
    me = nl.program_id(0)
    first = nl.ndarray((1, D), dtype=F32, buffer=nl.shared_hbm, name="first")
    second = nl.ndarray((1, D), dtype=F32, buffer=nl.shared_hbm, name="second")
    nisa.core_barrier(data=first if me == 0 else second, cores=(0, 1))  # <-mismatch


def test_cores_meeting_at_barriers_on_different_tensors_disagree():
    with pytest.raises(sim.BarrierError, match=r"'first'.*'second'|'second'.*'first'") as info:
        sim.run(mismatched_barriers, torch.zeros(1, D), grid=2, target="trn2", rules="error")
    assert_located(info.value, __file__, "<-mismatch")
