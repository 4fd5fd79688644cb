"""A hand-scheduled engram_gate forward: an experiment, not a product kernel.

fusegen generates engram_gate from examples/engram_gate.spec. This kernel exists to measure how close the
documented cost model lets a kernel come to the HBM roofline when every step is placed by hand
(`bench/engram_hand.py` runs it; docs/performance.md reports it). Scope: trn2, whole rows in SBUF, H a
multiple of 512, save=False. Per token tile of 128 rows and head (a *unit*):
- the sums of squares on the Scalar engine; x*k*W on the Vector engine, x staged in PSUM by an identity
  matmul so each product reads one PSUM operand (N cycles, not 2N);
- the sum of x*k*W split by columns between the Vector and Scalar engines (`vector_sum_cols`);
- the per-row math once per token tile, for all heads at once ([P, HC] columns);
- out = x + g*v formed in PSUM by three matmuls (I*x + diag(g_hi)*v + diag(g_lo)*v, g_hi + g_lo = g to
  ~2^-17), evicted by the Vector (`vector_evictions` of the 512-column chunks) or Scalar engine;
- a unit's epilogue runs interleaved chunk by chunk with a later unit's passes, two units after its tile's
  per-row math was issued, so the in-order engine queues never wait on that math; loads run a unit ahead.
"""

import nki
import nki.isa as nisa
import nki.language as nl

P = 128  # tokens per tile (partitions)
CH = 512  # columns per PSUM bank (fp32)
DELAY = 2  # units between a tile's per-row math and its first epilogue


def _cdiv(n, d):
    """Ceiling division."""
    return -(-n // d)


def _column(width, dtype=nl.float32):
    """A [P, width] SBUF tile for per-row values."""
    return nl.ndarray((P, width), dtype=dtype, buffer=nl.sbuf)


def _constant(value, width):
    """A [P, width] fp32 column filled with `value` (GpSimd, off the busy engines)."""
    tile = _column(width)
    nisa.memset(dst=tile[0:P, 0:width], value=value, engine=nisa.engine.gpsimd)
    return tile


def _identity():
    """The bf16 [P, P] identity (iota of p - j compared with 0)."""
    offsets = nl.ndarray((P, P), dtype=nl.int32, buffer=nl.sbuf)
    nisa.iota(dst=offsets[0:P, 0:P], pattern=[[-1, P]], offset=0, channel_multiplier=1)
    ident = nl.ndarray((P, P), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=ident[0:P, 0:P], data=offsets[0:P, 0:P], op0=nl.equal, operand0=0.0)
    return ident


def _weights(h, w_h_hbm, w_e_hbm, ones):
    """Head h's fp32 w_h*w_e as [P, H]: rows broadcast on the PE, one Vector product per chunk."""
    width = w_h_hbm.shape[1]
    prepared = nl.ndarray((P, width), dtype=nl.float32, buffer=nl.sbuf)
    for c0 in range(0, width, CH):
        rows = []
        for w_hbm in (w_h_hbm, w_e_hbm):
            row = nl.ndarray((1, CH), dtype=nl.bfloat16, buffer=nl.sbuf)
            nisa.dma_copy(dst=row[0:1, 0:CH], src=w_hbm[h : h + 1, c0 : c0 + CH])
            spread = nl.ndarray((P, CH), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_matmul(
                dst=spread[0:P, 0:CH], stationary=ones[0:1, 0:P], moving=row[0:1, 0:CH], accumulate=False
            )
            rows.append(spread)
        w_e_sb = nl.ndarray((P, CH), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=w_e_sb[0:P, 0:CH], op=nl.copy, data=rows[1][0:P, 0:CH])
        nisa.tensor_tensor(
            dst=prepared[0:P, c0 : c0 + CH], data1=rows[0][0:P, 0:CH], data2=w_e_sb[0:P, 0:CH], op=nl.multiply
        )
    return prepared


def _load(t0, pt, h, x_hbm, kv_hbm):
    """The unit's x and k rows (bf16 [P, H])."""
    width = x_hbm.shape[2]
    x = nl.ndarray((P, width), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=x[0:pt, 0:width], src=x_hbm[t0 : t0 + pt, h, 0:width])
    k = nl.ndarray((P, width), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=k[0:pt, 0:width], src=kv_hbm[t0 : t0 + pt, h, 0:width])
    return x, k


def _load_v(t0, pt, kv_hbm):
    """The tile's v row, shared by its heads."""
    heads, width = kv_hbm.shape[1] - 1, kv_hbm.shape[2]
    v = nl.ndarray((P, width), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=v[0:pt, 0:width], src=kv_hbm[t0 : t0 + pt, heads, 0:width])
    return v


def _squares(pt, h, x, k, stats):
    """Σx² and Σk² of the unit on the Scalar engine, into column h of the tile's statistics."""
    width = x.shape[1]
    scratch = nl.ndarray((P, width), dtype=nl.bfloat16, buffer=nl.sbuf)
    for row, into in ((x, stats[0]), (k, stats[1])):
        nisa.activation_reduce(
            dst=scratch[0:pt, 0:width], op=nl.square, data=row[0:pt, 0:width], reduce_op=nl.add,
            reduce_res=into[0:pt, h:h + 1],
        )  # fmt: skip


def _product_chunk(pt, c0, x, k, w, q, ident):
    """q[:, chunk] = x*k*W: x staged in PSUM, each product reading one PSUM operand."""
    staged = nl.ndarray((P, CH), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(
        dst=staged[0:pt, 0:CH], stationary=ident[0:pt, 0:pt], moving=x[0:pt, c0 : c0 + CH], accumulate=False
    )
    nisa.tensor_tensor(
        dst=staged[0:pt, 0:CH], data1=staged[0:pt, 0:CH], data2=k[0:pt, c0 : c0 + CH], op=nl.multiply
    )
    nisa.tensor_tensor(
        dst=q[0:pt, c0 : c0 + CH], data1=staged[0:pt, 0:CH], data2=w[0:pt, c0 : c0 + CH], op=nl.multiply
    )


def _dot(pt, h, q, stats, vector_cols):
    """Σ x*k*W into column h: `vector_cols` columns on Vector, the rest on Scalar, added on GpSimd
    (0 < vector_cols < H)."""
    width = q.shape[1]
    scratch = nl.ndarray((P, width), dtype=nl.bfloat16, buffer=nl.sbuf)
    on_vector, on_scalar = _column(1), _column(1)
    nisa.tensor_reduce(dst=on_vector[0:pt, 0:1], op=nl.add, data=q[0:pt, 0:vector_cols], axis=(1,))
    nisa.activation_reduce(dst=scratch[0:pt, vector_cols:width], op=nl.copy, data=q[0:pt, vector_cols:width],
                           reduce_op=nl.add, reduce_res=on_scalar[0:pt, 0:1])  # fmt: skip
    nisa.tensor_tensor(
        dst=stats[2][0:pt, h:h + 1], data1=on_scalar[0:pt, 0:1], data2=on_vector[0:pt, 0:1], op=nl.add,
        engine=nisa.engine.gpsimd,
    )  # fmt: skip


def _gate(pt, stats, consts):
    """The tile's gates for all heads ([P, HC]), as bf16-exact hi and residual lo fp32 columns."""
    sx, sk, sq = stats
    w = sx.shape[1]
    inv_h, eps, scale, clamp, neg_clamp, minus_one = consts
    gp = nisa.engine.gpsimd

    def gp_op(dst, a, b, op):
        nisa.tensor_tensor(dst=dst[0:pt, 0:w], data1=a[0:pt, 0:w], data2=b[0:pt, 0:w], op=op, engine=gp)

    def act(dst, src, op, **kw):
        nisa.activation(dst=dst[0:pt, 0:w], op=op, data=src[0:pt, 0:w], **kw)

    rstd = []
    for sums in (sx, sk):
        mean = _column(w)
        gp_op(mean, sums, inv_h, nl.multiply)
        gp_op(mean, mean, eps, nl.add)
        r = _column(w)
        act(r, mean, nl.rsqrt)
        rstd.append(r)
    s = _column(w)
    gp_op(s, sq, rstd[0], nl.multiply)
    gp_op(s, s, rstd[1], nl.multiply)
    gp_op(s, s, scale, nl.multiply)
    sign, mag, g = _column(w), _column(w), _column(w)
    act(sign, s, nl.sign)
    act(mag, s, nl.abs)
    act(mag, mag, nl.relu, bias=neg_clamp[0:pt, 0:1])  # max(|s|, clamp) = relu(|s| - clamp) + clamp
    gp_op(mag, mag, clamp, nl.add)
    act(mag, mag, nl.sqrt)
    gp_op(mag, mag, sign, nl.multiply)
    act(g, mag, nl.sigmoid)
    g_bf16, hi, lo = _column(w, nl.bfloat16), _column(w), _column(w)
    nisa.tensor_copy(dst=g_bf16[0:pt, 0:w], src=g[0:pt, 0:w], engine=gp)
    nisa.tensor_copy(dst=hi[0:pt, 0:w], src=g_bf16[0:pt, 0:w], engine=gp)
    gp_op(lo, hi, minus_one, nl.multiply)
    gp_op(lo, g, lo, nl.add)
    return hi, lo


def _diagonals(pt, j, hi, lo, ident):
    """diag(g_hi), diag(g_lo) of head j as bf16 [P, P] stationaries (Scalar: the identity scaled per row)."""
    out = []
    for part in (hi, lo):
        d = nl.ndarray((P, P), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.activation(dst=d[0:pt, 0:pt], op=nl.copy, data=ident[0:pt, 0:pt], scale=part[0:pt, j : j + 1])
        out.append(d)
    return out


def _out_chunk(pt, i, c0, x, v, diags, o, ident, vector_evictions):
    """o[:, chunk] = bf16(x + g*v): three matmuls into one PSUM bank, evicted by Vector or Scalar."""
    acc = nl.ndarray((P, CH), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(
        dst=acc[0:pt, 0:CH], stationary=ident[0:pt, 0:pt], moving=x[0:pt, c0 : c0 + CH], accumulate=False
    )
    for d in diags:
        nisa.nc_matmul(
            dst=acc[0:pt, 0:CH], stationary=d[0:pt, 0:pt], moving=v[0:pt, c0 : c0 + CH], accumulate=True
        )
    if i < vector_evictions:
        nisa.tensor_copy(dst=o[0:pt, c0 : c0 + CH], src=acc[0:pt, 0:CH])
    else:
        nisa.activation(dst=o[0:pt, c0 : c0 + CH], op=nl.copy, data=acc[0:pt, 0:CH])


@nki.jit
def engram_gate_hand(x_hbm, kv_hbm, w_h_hbm, w_e_hbm, eps, clamp, vector_evictions, vector_sum_cols):
    """out = x + gate*v (see examples/engram_gate.spec), one core's token tiles, scheduled by hand."""
    rows, heads, width = x_hbm.shape
    out_hbm = nl.ndarray((rows, heads, width), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    ones = nl.ndarray((1, P), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.memset(dst=ones[0:1, 0:P], value=1.0)
    weights = [_weights(h, w_h_hbm, w_e_hbm, ones) for h in range(heads)]
    ident = _identity()
    consts = (_constant(1.0 / width, heads), _constant(eps, heads), _constant(width ** -0.5, heads),
              _constant(clamp, heads), _constant(-clamp, 1), _constant(-1.0, heads))  # fmt: skip
    share = min(rows, _cdiv(_cdiv(rows, P), nl.num_programs()) * P)  # whole tiles per core, ragged last
    t_begin = min(rows, nl.program_id(0) * share)
    t_end = min(rows, t_begin + share)
    units = [(t0, h) for t0 in range(t_begin, t_end, P) for h in range(heads)]
    tiles = []  # per token tile: (v, statistics, x rows kept for the epilogues, gates), None once stored
    ready = []  # epilogues (t0, h, unit index from which they may run)
    stores, queued = [], []
    ahead = [_load(units[0][0], min(P, t_end - units[0][0]), 0, x_hbm, kv_hbm)] if len(units) > 0 else []
    for n, (t0, h) in enumerate(units):
        pt = min(P, t_end - t0)
        if h == 0:
            tiles.append((_load_v(t0, pt, kv_hbm), (_column(heads), _column(heads), _column(heads)), [], []))
        x, k = ahead.pop(0)
        if n + 1 < len(units):
            t1, h1 = units[n + 1]
            ahead.append(_load(t1, min(P, t_end - t1), h1, x_hbm, kv_hbm))
        for dst, src in queued:  # a store waiting for its eviction must not hold a load up in the DMA queues
            nisa.dma_copy(dst=dst, src=src)
        queued, stores = stores, []
        tile = tiles[(t0 - t_begin) // P]
        # at most one epilogue per unit, its diagonals and output tile made before the unit's passes
        epilogue = (
            [_epilogue(ready.pop(0), tiles, t_begin, t_end, ident)]
            if len(ready) > 0 and ready[0][2] <= n
            else []
        )
        _squares(pt, h, x, k, tile[1])
        q = nl.ndarray((P, width), dtype=nl.float32, buffer=nl.sbuf)
        for i, c0 in enumerate(range(0, width, CH)):
            _product_chunk(pt, c0, x, k, weights[h], q, ident)
            for e_pt, x_e, v_e, diags, o, _ in epilogue:
                _out_chunk(e_pt, i, c0, x_e, v_e, diags, o, ident, vector_evictions)
        _dot(pt, h, q, tile[1], vector_sum_cols)
        tile[2].append(x)
        for e_pt, _, _, _, o, (e0, eh, _) in epilogue:
            stores.append((out_hbm[e0 : e0 + e_pt, eh, 0:width], o[0:e_pt, 0:width]))
            if eh == heads - 1:
                tiles[(e0 - t_begin) // P] = None  # its rows are no longer needed
        if h == 0 and t0 > t_begin:  # the previous tile's statistics are complete: its gates, once
            _gates_of(t0 - P, tiles, t_begin, t_end, consts, ready, n + DELAY, heads)
    if len(units) > 0:
        _gates_of(units[-1][0], tiles, t_begin, t_end, consts, ready, 0, heads)
    for e_pt, x_e, v_e, diags, o, (e0, eh, _) in [_epilogue(r, tiles, t_begin, t_end, ident) for r in ready]:
        for i, c0 in enumerate(range(0, width, CH)):
            _out_chunk(e_pt, i, c0, x_e, v_e, diags, o, ident, vector_evictions)
        stores.append((out_hbm[e0 : e0 + e_pt, eh, 0:width], o[0:e_pt, 0:width]))
    for dst, src in queued + stores:
        nisa.dma_copy(dst=dst, src=src)
    return out_hbm


def _gates_of(t0, tiles, t_begin, t_end, consts, ready, start, heads):
    """Tile t0's per-row math; its heads' epilogues may run from unit `start` on."""
    tile = tiles[(t0 - t_begin) // P]
    tile[3].append(_gate(min(P, t_end - t0), tile[1], consts))
    ready.extend((t0, h, start) for h in range(heads))


def _epilogue(entry, tiles, t_begin, t_end, ident):
    """An epilogue's rows, x, v, diagonals and output tile: (pt, x, v, diagonals, out, entry)."""
    e0, eh, _ = entry
    pt, (v, _, xs, gates) = min(P, t_end - e0), tiles[(e0 - t_begin) // P]
    out = nl.ndarray((P, v.shape[1]), dtype=nl.bfloat16, buffer=nl.sbuf)
    return pt, xs[eh], v, _diagonals(pt, eh, *gates[0], ident), out, entry
