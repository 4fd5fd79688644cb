"""Hand-written kernels in the new API (seed style) checked against torch."""

from __future__ import annotations

import json

import pytest
import torch

import fusegen.sim as sim

from .conftest import close, line_of

with sim.installed():
    import nki
    import nki.isa as nisa
    import nki.language as nl

P = 128


@nki.jit
def tiled_matmul(a_t_hbm, b_hbm, style):
    """C[M,N] = A @ B with A given transposed ([K, M]); style picks the accumulation idiom."""
    K, M = a_t_hbm.shape
    _, N = b_hbm.shape
    TN = 512
    c_hbm = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    n_k = K // P
    a_t = []
    b_t = []
    for kt in range(n_k):
        at = nl.ndarray((P, M), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(dst=at, src=a_t_hbm[kt * P : (kt + 1) * P, 0:M])
        a_t.append(at)
        bt = nl.ndarray((P, N), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(dst=bt, src=b_hbm[kt * P : (kt + 1) * P, 0:N])
        b_t.append(bt)
    reused = nl.ndarray((P, TN), dtype=nl.float32, buffer=nl.psum)
    for m in range(M // P):
        for n in range(N // TN):
            res = nl.ndarray((P, TN), dtype=nl.float32, buffer=nl.sbuf)
            ps = reused if style == "explicit" else nl.ndarray((P, TN), dtype=nl.float32, buffer=nl.psum)
            for kt in nl.affine_range(n_k):
                st = a_t[kt][0:P, m * P : (m + 1) * P]
                mv = b_t[kt][0:P, n * TN : (n + 1) * TN]
                if style == "implicit":
                    nisa.nc_matmul(dst=ps, stationary=st, moving=mv)
                elif style == "explicit":
                    nisa.nc_matmul(dst=ps, stationary=st, moving=mv, accumulate=(kt > 0))
                else:  # sbuf: every matmul overwrites; the sum is kept in SBUF
                    nisa.nc_matmul(dst=ps, stationary=st, moving=mv, accumulate=False)
                    if kt == 0:
                        nisa.tensor_copy(dst=res, src=ps)
                    else:
                        nisa.tensor_tensor(dst=res, data1=res, data2=ps, op=nl.add)
            if style != "sbuf":
                nisa.tensor_copy(dst=res, src=ps)
            nisa.dma_copy(dst=c_hbm[m * P : (m + 1) * P, n * TN : (n + 1) * TN], src=res)
    return c_hbm


@pytest.mark.parametrize("style", ["implicit", "explicit", "sbuf"])
def test_tiled_matmul_accumulation_styles(style):
    a = torch.randn(256, 384).bfloat16()
    b = torch.randn(384, 1024).bfloat16()
    out = tiled_matmul(a.t().contiguous(), b, style)
    ref = a.float() @ b.float()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4)
    ops = tiled_matmul.last_run.trace.op_counts()
    assert ops["nc_matmul"] == 2 * 2 * 3


@nki.jit
def rms_norm_lnc(x_hbm, eps):
    """Rows split across cores; each core writes its rows of the shared output."""
    R, D = x_hbm.shape
    out = nl.ndarray((R, D), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    rows = R // nl.num_programs()
    base = nl.program_id(0) * rows
    for t in range(rows // P):
        r0 = base + t * P
        xt = nl.ndarray((P, D), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x_hbm[r0 : r0 + P, 0:D])
        sq = nl.ndarray((P, D), dtype=nl.float32, buffer=nl.sbuf)
        ss = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(dst=sq, op=nl.square, data=xt, reduce_op=nl.add, reduce_res=ss)
        rstd = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=rstd, data=ss, op0=nl.multiply, operand0=1.0 / D, op1=nl.add, operand1=eps)
        nisa.activation(dst=rstd, op=nl.rsqrt, data=rstd)
        y = nl.ndarray((P, D), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y, data=xt, op0=nl.multiply, operand0=rstd)
        nisa.dma_copy(dst=out[r0 : r0 + P, 0:D], src=y)
    return out


def test_rms_norm_on_two_cores_writes_shared_hbm():
    x = torch.randn(512, 256)
    out = rms_norm_lnc[2](x, 1e-6)
    ref = x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + 1e-6)
    assert out.dtype == torch.bfloat16 and close(out, ref)
    run = rms_norm_lnc.last_run
    assert {r.core for r in run.trace} == {0, 1}
    assert run.trace.totals()["dma"]["hbm_write"] == 512 * 256 * 2


@nki.jit
def online_softmax(x_hbm, chunk):
    """Row softmax over chunks: running max and rescaled running sum, then a normalising pass."""
    R, D = x_hbm.shape
    out = nl.ndarray((R, D), dtype=nl.float32, buffer=nl.shared_hbm)
    m = nl.full((R, 1), -3.0e38, dtype=nl.float32)
    s = nl.zeros((R, 1), dtype=nl.float32)
    for c in range(D // chunk):
        xc = nl.ndarray((R, chunk), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=xc, src=x_hbm[0:R, c * chunk : (c + 1) * chunk])
        cmax = nl.ndarray((R, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=cmax, op=nl.maximum, data=xc, axis=(1,))
        m_new = nl.ndarray((R, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=m_new, data1=m, data2=cmax, op=nl.maximum)
        neg = nl.ndarray((R, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=neg, data=m_new, op0=nl.multiply, operand0=-1.0)
        alpha = nl.ndarray((R, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=alpha, op=nl.exp, data=m, bias=neg)
        e = nl.ndarray((R, chunk), dtype=nl.float32, buffer=nl.sbuf)
        csum = nl.ndarray((R, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(dst=e, op=nl.exp, data=xc, reduce_op=nl.add, reduce_res=csum, bias=neg)
        nisa.scalar_tensor_tensor(dst=s, data=s, op0=nl.multiply, operand0=alpha, op1=nl.add, operand1=csum)
        nisa.tensor_copy(dst=m, src=m_new)
    inv = nl.ndarray((R, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=inv, data=s)
    negm = nl.ndarray((R, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=negm, data=m, op0=nl.multiply, operand0=-1.0)
    for c in range(D // chunk):
        xc = nl.ndarray((R, chunk), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=xc, src=x_hbm[0:R, c * chunk : (c + 1) * chunk])
        nisa.activation(dst=xc, op=nl.exp, data=xc, bias=negm)
        nisa.tensor_scalar(dst=xc, data=xc, op0=nl.multiply, operand0=inv)
        nisa.dma_copy(dst=out[0:R, c * chunk : (c + 1) * chunk], src=xc)
    return out


def test_online_softmax():
    x = torch.randn(128, 2048) * 4
    torch.testing.assert_close(online_softmax(x, 512), torch.softmax(x, dim=1), rtol=1e-5, atol=1e-6)


@nki.jit
def exchange(x_hbm, use_barrier):
    """Each core publishes its half through shared HBM and reads back the other core's half."""
    R, D = x_hbm.shape
    half = R // 2
    me = nl.program_id(0)
    other = 1 - me
    board = nl.ndarray((R, D), dtype=nl.float32, buffer=nl.shared_hbm)
    out = nl.ndarray((R, D), dtype=nl.float32, buffer=nl.shared_hbm)
    mine = nl.ndarray((half, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=mine, src=x_hbm[me * half : (me + 1) * half, 0:D])
    nisa.activation(dst=mine, op=nl.square, data=mine)
    nisa.dma_copy(dst=board[me * half : (me + 1) * half, 0:D], src=mine)  # <-publish
    if use_barrier:
        nisa.core_barrier(data=board, cores=(0, 1))
    theirs = nl.ndarray((half, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=theirs, src=board[other * half : (other + 1) * half, 0:D])  # <-fetch
    nisa.dma_copy(dst=out[me * half : (me + 1) * half, 0:D], src=theirs)
    return out


def test_exchange_through_shared_hbm_with_barrier():
    x = torch.randn(256, 64)
    out = exchange[2](x, True)
    sq = x * x
    assert torch.equal(out, torch.cat([sq[128:], sq[:128]]))
    assert exchange.last_run.trace.op_counts()["core_barrier"] == 2


def test_exchange_without_barrier_is_a_race_naming_both_lines():
    with pytest.raises(sim.RaceError) as info:
        exchange[2](torch.randn(256, 64), False)
    msg = str(info.value)
    assert f"test_kernels.py:{line_of(__file__, '<-fetch')}" in msg
    assert f"test_kernels.py:{line_of(__file__, '<-publish')}" in msg


def test_two_cores_writing_the_same_rows_is_a_race():
    def kernel(x_hbm):
        out = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        sb = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=sb, src=x_hbm)
        nisa.dma_copy(dst=out, src=sb)
        return out

    with pytest.raises(sim.RaceError, match="writes"):
        sim.run(kernel, torch.zeros(128, 8), grid=2)


def test_trace_records_export_and_psum_banks(tmp_path):
    a = torch.randn(256, 256).bfloat16()
    b = torch.randn(256, 1024).bfloat16()
    run = sim.run(tiled_matmul, a.t().contiguous(), b, "implicit")
    mm = [r for r in run.trace if r.op == "nc_matmul"]
    assert all(r.engine == "tensor" and r.elems == 512 and r.partitions == 128 for r in mm)
    assert all(r.psum_bank is not None and 0 <= r.psum_bank < 8 for r in mm)
    assert {r.psum_bank for r in mm} == {0}  # one PSUM tile live at a time ('reused' is never touched)
    assert all(r.file.endswith("test_kernels.py") for r in run.trace)
    assert mm[0].sbuf_read == 2 * (128 * 128 + 128 * 512) and mm[0].psum_write == 128 * 512 * 4
    assert "tensor" in run.trace.summary() and run.trace.totals()["tensor"]["count"] == len(mm)
    path = tmp_path / "trace.json"
    run.trace.to_chrome_json(path)
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]
    assert len(events) == len(run.trace) and events[0]["args"]["line"] > 0
    assert [e["ts"] for e in events if e["pid"] == 0] == sorted(e["ts"] for e in events if e["pid"] == 0)
