"""Deferred matmul groups, recycled storage and concurrent instances behave like eager execution."""

from __future__ import annotations

import re
import threading
import time
from types import SimpleNamespace

import pytest
import torch

import fusegen.sim as sim
from fusegen.sim.barrier import CoreBarrier
from fusegen.sim.deferred import MatmulQueue

with sim.installed():
    import nki
    import nki.isa as nisa
    import nki.language as nl


def _load(t):
    """SBUF copy of an HBM tensor."""
    sb = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=sb, src=t)
    return sb


def _scaled(t, i):
    """SBUF copy of t[i] times 2 (exact): not the input's bytes any more, so stacked when multiplied."""
    sb = nl.ndarray((128, t.shape[2]), dtype=t.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=sb, src=t[i, 0:128, 0 : t.shape[2]])
    nisa.tensor_scalar(dst=sb, data=sb, op0=nl.multiply, operand0=2.0)
    return sb


def _evict(ps):
    """shared_hbm fp32 copy of a PSUM tile (via SBUF)."""
    sb = nl.ndarray(ps.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=sb, src=ps)
    out = nl.ndarray(ps.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=sb)
    return out


def _close(out, ref):
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4)


def test_operands_rewritten_after_a_matmul_do_not_change_it():
    a, b = torch.randn(128, 64).bfloat16(), torch.randn(128, 96).bfloat16()

    @nki.jit
    def kernel(a_hbm, b_hbm):
        sa, sb = _load(a_hbm), _load(b_hbm)
        ps = nl.ndarray((64, 96), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=sa, moving=sb)
        nisa.activation(dst=sa, op=nl.square, data=sa)  # new operand values before the PSUM is read
        nisa.tensor_scalar(dst=sb, data=sb, op0=nl.multiply, operand0=-2.0)
        nisa.nc_matmul(dst=ps, stationary=sa, moving=sb)
        return _evict(ps)

    af, bf = a.float(), b.float()
    a2 = (af * af).bfloat16().float()
    _close(kernel(a, b), af.t() @ bf + a2.t() @ (-2 * bf))


def test_operand_tiles_dropped_before_the_gemm_keep_their_data():
    """Operands are stacked only when the GEMM runs: a dropped operand tile's storage must not be recycled
    (and overwritten) by later allocations before then."""
    a, b = torch.randn(128, 64).bfloat16(), torch.randn(128, 96).bfloat16()

    @nki.jit
    def kernel(a_hbm, b_hbm):
        ps = nl.ndarray((64, 96), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=_load(a_hbm), moving=_load(b_hbm))  # both tiles dropped at once
        for _ in range(4):  # same-shaped tiles that would take the freed storage, written
            junk = nl.ndarray((128, 96), dtype=nl.bfloat16, buffer=nl.sbuf)
            nisa.memset(dst=junk, value=7.0)
            other = nl.ndarray((128, 64), dtype=nl.bfloat16, buffer=nl.sbuf)
            nisa.memset(dst=other, value=-3.0)
        return _evict(ps)

    _close(kernel(a, b), a.float().t() @ b.float())


def test_long_accumulations_and_reads_between_matmuls():
    a, b = torch.randn(128, 12 * 128).bfloat16(), torch.randn(128, 12 * 512).bfloat16()

    @nki.jit
    def kernel(a_hbm, b_hbm):
        sa, sb = _load(a_hbm), _load(b_hbm)
        ps = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        outs = []
        for k in range(12):  # 1536 contraction rows: more than one stacked group
            st, mv = sa[:, k * 128 : (k + 1) * 128], sb[:, k * 512 : (k + 1) * 512]
            nisa.nc_matmul(dst=ps, stationary=st, moving=mv)
            if k in (0, 7):
                outs.append(_evict(ps))  # a read in the middle of the accumulation
        return (*outs, _evict(ps))

    af, bf = a.float(), b.float()
    blocks = [af[:, k * 128 : (k + 1) * 128].t() @ bf[:, k * 512 : (k + 1) * 512] for k in range(12)]
    first, mid, last = kernel(a, b)
    _close(first, blocks[0])
    _close(mid, sum(blocks[:8]))
    _close(last, sum(blocks))


def test_interleaved_groups_over_column_ranges_of_shared_tiles():
    w, x = torch.randn(128, 1024).bfloat16(), torch.randn(128, 1280).bfloat16()

    @nki.jit
    def kernel(w_hbm, x_hbm):
        sw, sx = _load(w_hbm), _load(x_hbm)
        outs = []
        for j in range(2):
            ps = [nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum) for _ in range(3)]
            for i in range(3):  # three pending groups reading other columns of the same rows
                n = 512 if i < 2 else 256
                st, mv = sw[:, j * 128 : (j + 1) * 128], sx[:, i * 512 : i * 512 + n]
                nisa.nc_matmul(dst=ps[i][:, 0:n], stationary=st, moving=mv)
            outs += [_evict(ps[i][:, 0 : 512 if i < 2 else 256]) for i in range(3)]
        return tuple(outs)

    outs = kernel(w, x)
    for j in range(2):
        for i in range(3):
            n = 512 if i < 2 else 256
            ref = w[:, j * 128 : (j + 1) * 128].float().t() @ x[:, i * 512 : i * 512 + n].float()
            _close(outs[3 * j + i], ref)


def test_recycled_storage_still_counts_as_never_written():
    x = torch.randn(128, 64)

    @nki.jit
    def kernel(x_hbm):
        for _ in range(3):
            _load(x_hbm)  # written, then dropped: its storage is recycled below
        fresh = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=fresh)
        return out

    with pytest.raises(sim.UninitializedReadError):
        kernel(x)
    with pytest.warns(sim.UninitializedReadWarning):
        out = sim.run(kernel, x, strict=False).outputs
    assert torch.isnan(out).all()


def test_outputs_of_successive_launches_are_independent():
    @nki.jit
    def kernel(x_hbm):
        return _evict(_load(x_hbm))

    x = torch.randn(64, 32)
    first = kernel(x)
    second = kernel(x * 2)
    assert torch.equal(first, x) and torch.equal(second, x * 2)


@nki.jit
def two_core_matmul(a_hbm, b_hbm):
    """Each core multiplies its half of b's columns, publishes it, and reads the other core's half."""
    me = nl.program_id(0)
    sa = _load(a_hbm)
    sb = nl.ndarray((128, 256), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=sb, src=b_hbm[:, me * 256 : (me + 1) * 256])
    ps = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.psum)
    for k in range(4):
        nisa.nc_matmul(dst=ps, stationary=sa[:, k * 128 : (k + 1) * 128], moving=sb)
    board = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    mine = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=mine, src=ps)
    nisa.dma_copy(dst=board[:, me * 256 : (me + 1) * 256], src=mine)
    nisa.core_barrier(data=board, cores=(0, 1))
    theirs = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=theirs, src=board[:, (1 - me) * 256 : (2 - me) * 256])
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out[:, me * 256 : (me + 1) * 256], src=theirs)
    return out


def test_concurrent_instances_exchange_matmul_results():
    a, b = torch.randn(128, 512).bfloat16(), torch.randn(128, 512).bfloat16()
    ref = sum(a[:, k * 128 : (k + 1) * 128].float().t() @ b.float() for k in range(4))
    for _ in range(3):
        out = two_core_matmul[2](a, b)
        _close(out, torch.cat([ref[:, 256:], ref[:, :256]], dim=1))


def test_errors_of_concurrent_instances_are_reported_deterministically():
    def failing(x_hbm):
        me = nl.program_id(0)
        return x_hbm[0:4, 10 + me]  # out of range on every core: the lowest core's error is reported

    def racy(x_hbm):
        out = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        sb = _load(x_hbm)
        nisa.dma_copy(dst=out, src=sb)
        return out

    cases = ((failing, sim.OutOfBoundsError, "index 10 "), (racy, sim.RaceError, "core 1 writes"))
    for kernel, error, needle in cases:
        messages = set()
        for _ in range(4):
            with pytest.raises(error) as info:
                sim.run(kernel, torch.zeros(128, 8), grid=2)
            messages.add(re.sub(r"#\d+", "#", str(info.value)))  # allocation ids differ per launch
        assert len(messages) == 1 and needle in messages.pop()


def test_groups_pending_after_a_partial_flush_keep_their_operands():
    a, b = torch.randn(3, 128, 128).bfloat16(), torch.randn(3, 128, 256).bfloat16()

    @nki.jit
    def kernel(a_hbm, b_hbm):
        outs, ps = [], [nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.psum) for _ in range(3)]
        for i in range(3):
            if i == 2:
                outs.append(_evict(ps[0]))  # runs the first group only; the second stays pending
            nisa.nc_matmul(dst=ps[i], stationary=_load(a_hbm[i]), moving=_load(b_hbm[i]))
        return (*outs, _evict(ps[1]), _evict(ps[2]))

    for i, out in enumerate(kernel(a, b)):
        _close(out, a[i].float().t() @ b[i].float())


def test_pending_groups_over_a_shared_first_block_each_read_their_own_blocks():
    """Three accumulations pending at once, each over a shared first block and its own second one (the
    stack holding their first block would serve all three, each planning its second block at the same
    place): each GEMM reads its own blocks (operands scaled in SBUF, so stacked)."""
    torch.manual_seed(3)
    w, x = torch.randn(4, 128, 64).bfloat16(), torch.randn(2, 128, 96).bfloat16()

    @nki.jit
    def kernel(w_hbm, x_hbm):
        ws, xs = [_scaled(w_hbm, i) for i in range(4)], [_scaled(x_hbm, i) for i in range(2)]
        outs = []
        for j in range(3):
            ps = nl.ndarray((64, 96), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_matmul(dst=ps, stationary=ws[0], moving=xs[0], accumulate=False)
            nisa.nc_matmul(dst=ps, stationary=ws[1 + j], moving=xs[1], accumulate=True)
            outs.append(ps)
        return tuple(_evict(ps) for ps in outs)

    wf, xf = 2 * w.float(), 2 * x.float()
    for j, out in enumerate(kernel(w, x)):
        _close(out, wf[0].t() @ xf[0] + wf[1 + j].t() @ xf[1])


def test_an_older_pending_group_grows_with_blocks_a_later_group_planned():
    """Accumulations into two tiles, interleaved: both start on one block, the second tile's group then
    plans a block the first tile's group takes next. The first group runs first, so it must copy that
    block itself, not count on the second group's copy (which runs after it)."""
    w, x = torch.randn(3, 128, 64).bfloat16(), torch.randn(3, 128, 96).bfloat16()

    @nki.jit
    def kernel(w_hbm, x_hbm):
        ws, xs = [_scaled(w_hbm, i) for i in range(3)], [_scaled(x_hbm, i) for i in range(3)]
        ps = [nl.ndarray((64, 96), dtype=nl.float32, buffer=nl.psum) for _ in range(2)]
        for tile, i in ((0, 0), (1, 0), (1, 1), (0, 1), (0, 2), (1, 2)):
            nisa.nc_matmul(dst=ps[tile], stationary=ws[i], moving=xs[i], accumulate=i > 0)
        return _evict(ps[0]), _evict(ps[1])

    wf, xf = 2 * w.float(), 2 * x.float()
    ref = sum(wf[i].t() @ xf[i] for i in range(3))
    for out in kernel(w, x):
        _close(out, ref)


def test_k_blocks_accumulated_i_tile_by_i_tile():
    """An FFN's down projection: per I-tile, one matmul into each K-block's PSUM tile (so each tile's
    accumulation interleaves with the others'), with an operand tile rewritten between I-tiles."""
    h, w = torch.randn(6, 128, 128).bfloat16(), torch.randn(6, 128, 1280).bfloat16()
    blocks = [(0, 512), (512, 512), (1024, 256)]

    @nki.jit
    def kernel(h_hbm, w_hbm):
        ps = [nl.ndarray((128, n), dtype=nl.float32, buffer=nl.psum) for _, n in blocks]
        g = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.sbuf)
        for i in range(6):
            nisa.dma_copy(dst=g, src=h_hbm[i, 0:128, 0:128])  # the same tile, rewritten per I-tile
            wd = _scaled(w_hbm, i)
            for ko, (k0, n) in enumerate(blocks):
                nisa.nc_matmul(dst=ps[ko], stationary=g, moving=wd[:, k0 : k0 + n], accumulate=i > 0)
        return tuple(_evict(p) for p in ps)

    hf, wf = h.float(), 2 * w.float()
    for out, (k0, n) in zip(kernel(h, w), blocks, strict=True):
        _close(out, sum(hf[i].t() @ wf[i][:, k0 : k0 + n] for i in range(6)))


class _Group:
    """Stands in for deferred._Group: a pending GEMM into `alloc` reading `operand`, failing if told to."""

    def __init__(self, alloc, operand, fail=False):
        self.alloc, self.reads, self.readers, self.fail = alloc, {operand.id}, [operand], fail

    def gemm(self):
        def run():
            if self.fail:
                raise RuntimeError(f"GEMM into tile {self.alloc.id} failed")

        return run


def _queue(fails, off_turn):
    """A MatmulQueue of one pending group per entry of `fails`, each into its own tile, all reading one
    operand; returns the queue, the tiles and the operand."""
    operand = SimpleNamespace(id=99, readers=len(fails))
    tiles = [SimpleNamespace(id=i, pending=True, readers=0) for i in range(len(fails))]
    queue = MatmulQueue(off_turn)
    queue.groups = [_Group(t, operand, fail) for t, fail in zip(tiles, fails, strict=True)]
    return queue, tiles, operand


def test_an_early_gemm_that_raises_leaves_the_queue_consistent():
    queue, tiles, operand = _queue([True, False, False], off_turn=None)
    with pytest.raises(RuntimeError, match="tile 0 failed"):
        queue._early()  # what an instance runs while the other holds the turn
    assert not tiles[0].pending and operand.readers == 2  # the failed group is gone, not half-gone
    assert [g.alloc for g in queue.groups] == tiles[1:]
    queue.off_turn = lambda fn, idle=None: fn()
    queue.flush()  # the rest still run; no error about a pending tile without a group
    assert not any(t.pending for t in tiles) and operand.readers == 0


def test_a_flushed_gemm_that_raises_is_the_error_and_the_later_groups_stay_queued():
    barrier = CoreBarrier(2)
    barrier.turn.acquire()  # held by this instance, as during a launch
    queue, tiles, operand = _queue([True, False, False], barrier.off_turn)
    with pytest.raises(RuntimeError, match="tile 0 failed"):
        queue.flush(tiles[0])
    assert barrier.turn.locked()  # the turn was taken back
    assert not tiles[0].pending and tiles[1].pending and tiles[2].pending and operand.readers == 2


def _other_instance(barrier):
    """A thread that takes the turn as soon as it is free and holds it 0.1 s; returns it and an event set
    once it holds the turn."""
    grabbed = threading.Event()

    def hold():
        with barrier.turn:
            grabbed.set()
            time.sleep(0.1)

    thread = threading.Thread(target=hold)
    thread.start()
    return thread, grabbed


def test_off_turn_runs_idle_work_only_after_success_and_keeps_the_first_error():
    barrier = CoreBarrier(2)
    barrier.turn.acquire()  # held by this instance, as during a launch
    ran = []

    def idle():
        ran.append(1)
        raise AssertionError("idle work")

    other, grabbed = _other_instance(barrier)

    def fail():
        grabbed.wait()  # the other instance holds the turn when this fails
        raise ValueError("the GEMM's error")

    with pytest.raises(ValueError, match="the GEMM's error"):
        barrier.off_turn(fail, idle)
    other.join()
    assert not ran and barrier.turn.locked()
    other, grabbed = _other_instance(barrier)
    with pytest.raises(AssertionError, match="idle work"):  # after a success, idle work runs
        barrier.off_turn(grabbed.wait, idle)
    other.join()
    assert ran == [1] and barrier.turn.locked()
