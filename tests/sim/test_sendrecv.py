"""sendrecv / sendrecv_compute: exact semantics between the two cores of LNC 2, and each conformance rule."""

from __future__ import annotations

import pytest
import torch

import fusegen.sim as sim
from fusegen.perf.schedule import schedule

from .conftest import assert_located

with sim.installed():
    import nki.isa as nisa
    import nki.language as nl

F32 = nl.float32


def expect(error, marker, kernel, *args, grid=2, **kwargs):
    """Run and check the error class and its source location."""
    with pytest.raises(error) as info:
        sim.run(kernel, *args, grid=grid, **kwargs)
    assert_located(info.value, __file__, marker)
    return str(info.value)


def _load(x, rows):
    """This core's rows of x in SBUF."""
    t = nl.ndarray((rows, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x[0:rows, 0:x.shape[1]])
    return t


def _swap_kernel(x):
    """Each core sends its half of x's rows to the other; both write what they received."""
    half, cols = x.shape[0] // 2, x.shape[1]
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    pid = nl.program_id(0)
    mine = nl.ndarray((half, cols), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=mine, src=x[pid * half:(pid + 1) * half, 0:cols])
    got = nl.ndarray((half, cols), dtype=x.dtype, buffer=nl.sbuf)
    nisa.sendrecv(src=mine, dst=got, send_to_rank=1 - pid, recv_from_rank=1 - pid, pipe_id=0)
    nisa.dma_copy(dst=out[pid * half:(pid + 1) * half, 0:cols], src=got)
    return out


def test_sendrecv_swaps_the_cores_tiles_bit_exactly():
    x = torch.randn(8, 16).bfloat16()
    out = sim.run(_swap_kernel, x, grid=2).outputs
    assert torch.equal(out, torch.cat([x[4:], x[:4]]))


@pytest.mark.parametrize(
    ("op", "fn"), [("add", torch.add), ("maximum", torch.maximum), ("minimum", torch.minimum)]
)
def test_sendrecv_compute_reduces_both_cores_tiles_in_fp32(op, fn):
    def kernel(x):
        rows, cols = x.shape[1], x.shape[2]
        out = nl.ndarray((2, rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
        pid = nl.program_id(0)
        mine = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=mine, src=x[pid, 0:rows, 0:cols])
        red = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.sbuf)
        nisa.sendrecv_compute(src=mine, dst=red, send_to_rank=1 - pid, recv_from_rank=1 - pid,
                              reduce_op=getattr(nl, op))
        nisa.dma_copy(dst=out[pid, 0:rows, 0:cols], src=red)
        return out

    x = torch.randn(2, 8, 16).bfloat16()
    out = sim.run(kernel, x, grid=2).outputs
    want = fn(x[0].float(), x[1].float()).bfloat16()  # one rounding of the fp32 result
    assert torch.equal(out[0], want) and torch.equal(out[1], want)


def test_exchanges_pair_by_program_order_and_are_traced_as_dma():
    def kernel(x):
        rows, cols = x.shape[1], x.shape[2]
        out = nl.ndarray((2, 2, rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
        pid = nl.program_id(0)
        for n in range(2):  # the n-th call of core 0 meets the n-th of core 1
            mine = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=mine, src=x[(pid + n) % 2, 0:rows, 0:cols])
            got = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.sbuf)
            nisa.sendrecv(src=mine, dst=got, send_to_rank=1 - pid, recv_from_rank=1 - pid, pipe_id=0)
            nisa.dma_copy(dst=out[pid, n, 0:rows, 0:cols], src=got)
        return out

    x = torch.randn(2, 4, 8)
    result = sim.run(kernel, x, grid=2)
    # core 0 sent x[0] then x[1]; core 1 sent x[1] then x[0]
    assert torch.equal(result.outputs[0, 0], x[1]) and torch.equal(result.outputs[0, 1], x[0])
    assert torch.equal(result.outputs[1, 0], x[0]) and torch.equal(result.outputs[1, 1], x[1])
    exchanges = [r for r in result.trace if r.op == "sendrecv"]
    assert len(exchanges) == 4 and {r.engine for r in exchanges} == {"dma"}
    assert all(r.sbuf_read == r.sbuf_write == 4 * 8 * 4 and r.epoch == 0 for r in exchanges)
    spans = [s for s in schedule(result.trace, sim.get_target("trn2")).spans if s.record.op == "sendrecv"]
    by_pair = {}
    for s in spans:  # the two calls of one pair start together (a rendezvous)
        by_pair.setdefault(s.record.index, set()).add(s.start_ns)
    assert all(len(starts) == 1 for starts in by_pair.values())


def test_a_peer_that_never_exchanges_is_an_error_not_a_hang():
    def kernel(x):
        t = _load(x, 4)
        if nl.program_id(0) == 0:
            nisa.sendrecv(src=t, dst=_load(x, 4), send_to_rank=1, recv_from_rank=1, pipe_id=0)  # <-alone

    msg = expect(sim.BarrierError, "<-alone", kernel, torch.zeros(4, 4))
    assert "no partner" in msg


def test_a_peer_at_a_core_barrier_is_a_mismatch():
    def kernel(x):
        t = _load(x, 4)
        if nl.program_id(0) == 0:
            nisa.sendrecv(src=t, dst=_load(x, 4), send_to_rank=1, recv_from_rank=1, pipe_id=0)  # <-waits
        else:
            nisa.core_barrier(data=x, cores=(0, 1))

    msg = expect(sim.BarrierError, "<-waits", kernel, torch.zeros(4, 4))
    assert "core_barrier" in msg


def test_an_exchange_and_a_barrier_in_swapped_order_are_a_mismatch():
    """Core 0 exchanges then waits at the barrier, core 1 the other way round: the barrier must not release
    the exchange (on hardware the calls deadlock or pair wrongly), whichever core reports it."""

    def kernel(x):
        t, d = _load(x, 4), _load(x, 4)
        if nl.program_id(0) == 0:
            nisa.sendrecv(src=t, dst=d, send_to_rank=1, recv_from_rank=1, pipe_id=0)  # <-swapped
            nisa.core_barrier(data=x, cores=(0, 1))
        else:
            nisa.core_barrier(data=x, cores=(0, 1))  # <-swapped
            nisa.sendrecv(src=t, dst=d, send_to_rank=0, recv_from_rank=0, pipe_id=0)

    for _ in range(5):  # the cores' interleaving varies from run to run
        with pytest.raises(sim.BarrierError) as info:
            sim.run(kernel, torch.zeros(4, 4), grid=2)
        assert "core_barrier" in str(info.value) and "#0" in str(info.value)


def test_a_peer_with_another_shape_is_a_mismatch():
    def kernel(x):
        pid = nl.program_id(0)
        rows = 4 if pid == 0 else 2
        t, d = _load(x, rows), _load(x, rows)
        nisa.sendrecv(src=t, dst=d, send_to_rank=1 - pid, recv_from_rank=1 - pid, pipe_id=0)  # <-shape

    msg = expect(sim.ShapeMismatchError, "<-shape", kernel, torch.zeros(4, 4))
    assert "exchange #0" in msg


def test_a_peer_with_another_reduce_op_is_a_mismatch():
    def kernel(x):
        pid = nl.program_id(0)
        op = nl.add if pid == 0 else nl.maximum
        nisa.sendrecv_compute(src=_load(x, 4), dst=_load(x, 4), send_to_rank=1 - pid,  # <-op
                              recv_from_rank=1 - pid, reduce_op=op)

    msg = expect(sim.InvalidArgumentError, "<-op", kernel, torch.zeros(4, 4))
    assert "maximum" in msg


def test_lnc1_and_trn1_have_no_exchange():
    def kernel(x):
        nisa.sendrecv(src=_load(x, 4), dst=_load(x, 4), send_to_rank=0, recv_from_rank=0, pipe_id=0)  # <-lnc

    assert "sendrecv-lnc" in expect(sim.InvalidArgumentError, "<-lnc", kernel, torch.zeros(4, 4), grid=1)
    assert "sendrecv-lnc" in expect(sim.InvalidArgumentError, "<-lnc", kernel, torch.zeros(4, 4), grid=1,
                                    target="trn1")


def test_operands_in_sbuf_of_one_shape_and_dtype():
    def hbm_src(x):
        pid = nl.program_id(0)
        nisa.sendrecv(src=x, dst=_load(x, 4), send_to_rank=1 - pid, recv_from_rank=1, pipe_id=0)  # <-hbm

    def other_dtype(x):
        pid = nl.program_id(0)
        d = nl.ndarray((4, 4), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.sendrecv(src=_load(x, 4), dst=d, send_to_rank=1 - pid, recv_from_rank=1 - pid, pipe_id=0)  # <-dt

    def other_shape(x):
        pid = nl.program_id(0)
        nisa.sendrecv(src=_load(x, 4), dst=_load(x, 2), send_to_rank=1 - pid, recv_from_rank=1,  # <-rows
                      pipe_id=0)

    assert "sendrecv-memory" in expect(sim.InvalidArgumentError, "<-hbm", hbm_src, torch.zeros(4, 4))
    expect(sim.DtypeError, "<-dt", other_dtype, torch.zeros(4, 4))
    expect(sim.ShapeMismatchError, "<-rows", other_shape, torch.zeros(4, 4))


def test_dst_sharing_elements_with_src_is_a_race():
    def kernel(x):
        pid = nl.program_id(0)
        t = _load(x, 4)
        nisa.sendrecv(src=t[0:4, 0:3], dst=t[0:4, 1:4], send_to_rank=1 - pid,  # <-alias
                      recv_from_rank=1 - pid, pipe_id=0)

    expect(sim.RaceError, "<-alias", kernel, torch.zeros(4, 4))


def test_dst_is_written_as_by_any_instruction():
    def kernel(x):  # a dst element the exchange did not write is still unwritten
        pid = nl.program_id(0)
        d = nl.ndarray((4, 8), dtype=F32, buffer=nl.sbuf)
        nisa.sendrecv(src=_load(x, 4), dst=d[0:4, 0:4], send_to_rank=1 - pid, recv_from_rank=1 - pid,
                      pipe_id=0)
        out = nl.ndarray((4, 8), dtype=F32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=d)  # <-unwritten
        return out

    expect(sim.UninitializedReadError, "<-unwritten", kernel, torch.zeros(4, 4))


def test_gpsimd_dma_limits_bytes_per_partition():
    def kernel(x):
        pid = nl.program_id(0)
        nisa.sendrecv(src=_load(x, 4), dst=_load(x, 4), send_to_rank=1 - pid, recv_from_rank=1 - pid,  # <-big
                      pipe_id=0, dma_engine=nisa.dma_engine.gpsimd_dma)

    sim.run(kernel, torch.zeros(4, 256), grid=2)  # 1024 B of fp32 per partition: the limit
    assert "gpsimd-dma-size" in expect(sim.InvalidArgumentError, "<-big", kernel, torch.zeros(4, 257))


def test_exchange_time_follows_its_assumed_factor():
    """No core-to-core rate is published: an exchange costs a DMA of its bytes times exchange_factor."""
    from fusegen.perf.cost import DMA_FIXED_NS, assume, dma_cost, record_cost

    x = torch.randn(128, 512)
    result = sim.run(_swap_kernel, x, grid=2)
    (rec, *_) = [r for r in result.trace if r.op == "sendrecv"]
    trn2 = sim.get_target("trn2")
    plain = dma_cost(trn2, 64 * 512 * 4, 64)
    assert record_cost(trn2, rec).busy_ns == pytest.approx(plain.busy_ns)
    with assume(exchange_factor=1.5):
        slow = record_cost(trn2, rec)
    assert slow.busy_ns == pytest.approx(1.5 * plain.busy_ns)
    assert slow.latency_ns == pytest.approx(slow.busy_ns + DMA_FIXED_NS)
