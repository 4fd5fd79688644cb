"""Core-to-core exchange of an LNC=2 launch: `sendrecv` and `sendrecv_compute`.

Each call sends this core's `src` to core `send_to_rank` and receives core `recv_from_rank`'s `src` into
`dst` (sendrecv_compute: `dst = reduce_op(src, peer's src)`, computed in fp32 by the DMA engine and rounded
to dst's dtype). Calls pair positionally: the n-th exchange of one core meets the n-th of the other [ISA
sendrecv]. The interpreter makes the pairing a rendezvous on the launch's core barrier, counted with the
core_barriers (so a peer that waits at a `core_barrier` where this core exchanges, before or after, or
has finished, is reported instead of hanging or pairing the wrong calls), and then checks that the two
calls agree: the same instruction and reduce_op, ranks that point at each other, and the peer's src of
dst's shape and dtype. The exchange orders nothing else: shared-HBM accesses around it stay in one race
epoch (only a `core_barrier` on a tensor starts a new one, for that tensor), as nothing documents it as a
barrier for other data.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .conformance import violation
from .errors import BarrierError, DtypeError, InvalidArgumentError, RaceError, ShapeMismatchError
from .instr import Instr
from .memory import Alloc, MemoryRegion
from .ops import Op
from .ops import dma_engine as DmaEngine
from .tensor import NkiTensor

#: reductions sendrecv_compute's DMA engine applies [ISA sendrecv_compute]
REDUCE_OPS = ("add", "maximum", "minimum")
#: dma_engine=gpsimd_dma: most bytes per partition, by element size in bytes [ISA sendrecv]
GPSIMD_DMA_BYTES = {4: 1024, 2: 512, 1: 256}


@dataclass(frozen=True)
class _Post:
    """What one core brings to its n-th exchange."""

    op: str
    value: torch.Tensor  # a copy of its src, in src's dtype
    send_to: int
    reduce: str
    site: tuple[str, int]
    data: Alloc | None = None  # a core_barrier's data tensor


def sendrecv(
    src: NkiTensor,
    dst: NkiTensor,
    send_to_rank: int,
    recv_from_rank: int,
    pipe_id: object = None,
    dma_engine: object = DmaEngine.dma,
    name: object = None,
    priority: object = None,
) -> None:
    """Send src to core send_to_rank while receiving core recv_from_rank's src into dst (SBUF to SBUF).

    `pipe_id` (required by NKI 0.6's stub, ignored since) is accepted and ignored."""
    ins = Instr("sendrecv", "dma")
    s, d = _operands(ins, src, dst, allow_private_hbm=False)
    if not isinstance(dma_engine, DmaEngine):
        raise ins.fail(InvalidArgumentError, f"dma_engine must be an nisa.dma_engine, got {dma_engine!r}")
    if dma_engine is DmaEngine.gpsimd_dma:
        limit = GPSIMD_DMA_BYTES.get(s.dtype.itemsize, 0)
        if s.free_size * s.dtype.itemsize > limit:
            violation(ins, "sendrecv-gpsimd-dma-size",
                      f"{s.free_size * s.dtype.itemsize} B per partition of {s.dtype}")  # fmt: skip
        if priority is not None:
            raise ins.fail(InvalidArgumentError, "priority must be None with dma_engine=gpsimd_dma")
    _exchange(ins, s, d, send_to_rank, recv_from_rank, None)


def sendrecv_compute(
    src: NkiTensor,
    dst: NkiTensor,
    send_to_rank: int,
    recv_from_rank: int,
    reduce_op: Op,
    name: object = None,
    priority: object = None,
) -> None:
    """Send src to core send_to_rank, receive core recv_from_rank's src, write reduce_op(src, peer) to dst."""
    ins = Instr("sendrecv_compute", "dma")
    if not isinstance(reduce_op, Op) or reduce_op.name not in REDUCE_OPS:
        raise ins.fail(InvalidArgumentError, f"reduce_op must be one of nl.{', nl.'.join(REDUCE_OPS)}, "
                                             f"got {reduce_op!r}")  # fmt: skip
    s, d = _operands(ins, src, dst, allow_private_hbm=True)
    _exchange(ins, s, d, send_to_rank, recv_from_rank, reduce_op)


def _operands(ins: Instr, src: object, dst: object, allow_private_hbm: bool) -> tuple[NkiTensor, NkiTensor]:
    """src and dst: one memory space (rules), one shape and dtype, no shared element."""
    s, d = ins.tensor(src, "src"), ins.tensor(dst, "dst")
    spaces = {MemoryRegion.sbuf, MemoryRegion.private_hbm} if allow_private_hbm else {MemoryRegion.sbuf}
    if s.alloc.region is not d.alloc.region or s.alloc.region not in spaces:
        violation(ins, "sendrecv-memory", f"src in {s.alloc.region.value}, dst in {d.alloc.region.value}")
    if s.shape != d.shape:
        raise ins.fail(ShapeMismatchError, f"src {s.shape} and dst {d.shape} must have the same shape")
    if s.dtype != d.dtype:
        raise ins.fail(DtypeError, f"src {s.dtype} and dst {d.dtype} must have the same dtype")
    if s.alloc is d.alloc and _overlap(s, d):
        raise ins.fail(RaceError, f"dst shares elements with src in {d.alloc.label()}: the peer's data "
                                  "lands in dst while src is still being sent")  # fmt: skip
    return s, d


def _overlap(a: NkiTensor, b: NkiTensor) -> bool:
    """Whether two views of one allocation address a common element."""
    index = torch.arange(a.alloc.numel)
    first = torch.as_strided(index, a.shape, a.strides, a.offset).reshape(-1)
    second = torch.as_strided(index, b.shape, b.strides, b.offset).reshape(-1)
    return bool(torch.isin(first, second).any())


def _exchange(
    ins: Instr, s: NkiTensor, d: NkiTensor, send_to: int, recv_from: int, reduce: Op | None
) -> None:
    """Post src, meet the peer's matching call, write dst, record the transfer."""
    ctx = ins.ctx
    launch = ctx.launch
    ranks = (send_to, recv_from)
    if launch.target.nc_version < 3 or launch.grid != 2 or any(r not in (0, 1) for r in ranks):
        violation(ins, "sendrecv-lnc", f"send_to_rank={send_to}, recv_from_rank={recv_from} in a "
                                       f"{launch.grid}-instance launch on {launch.target.name}")  # fmt: skip
    if any(not isinstance(r, int) or not 0 <= r < launch.grid for r in ranks):
        raise ins.fail(InvalidArgumentError, f"ranks {ranks} are not cores of this {launch.grid}-core launch")
    post = _Post(ins.op, ins.read(s, "src").clone(), send_to, reduce.name if reduce else "", ins.site)
    n, peer = _rendezvous(ins, post, recv_from)
    _check_pair(ins, n, post, peer, recv_from, d)
    assert peer is not None
    value = peer.value
    if reduce is not None:  # the DMA engine computes in fp32 (ISA dma_compute)
        value = reduce.fn(post.value.float(), value.float())
    ins.write(d, value)
    if reduce is not None:  # the engine reads the peer's tile as well as this core's
        ins.bytes[d.alloc.level] += d.numel * d.dtype.itemsize
    ins.finish(d.partitions, d.free_size)


def _rendezvous(ins: Instr, post: _Post, peer_core: int) -> tuple[int, _Post | None]:
    """Post this core's n-th rendezvous (an exchange or a core_barrier: both meet on the launch's barrier),
    wait for every core, and collect `peer_core`'s n-th post."""
    ctx = ins.ctx
    box = ctx.launch.barrier.mailbox
    with box.lock:
        n = box.count.get(ctx.core, 0)
        box.count[ctx.core] = n + 1
        box.posts[ctx.core, n] = post
    try:
        ctx.launch.barrier.wait(ctx.core, ins)  # both posted once every core is past it
    except BarrierError as exc:
        raise ins.fail(BarrierError, f"{post.op} #{n} of core {ctx.core} has no partner: {exc}") from None
    with box.lock:
        peer = box.posts.pop((peer_core, n), None)
    assert peer is None or isinstance(peer, _Post)
    return n, peer


def barrier(ins: Instr, data: Alloc) -> None:
    """core_barrier's rendezvous: the next core's matching one (around the cycle of cores, so all agree) must
    be a core_barrier too (an exchange it meets instead would deadlock or pair the wrong calls on hardware),
    on the same data tensor (the barrier orders that tensor only: race.py counts its epochs per tensor)."""
    core = ins.ctx.core
    other = (core + 1) % ins.ctx.grid
    n, peer = _rendezvous(ins, _Post("core_barrier", torch.empty(0), other, "", ins.site, data), other)
    if peer is None:
        return
    where = f"core {other}'s {peer.op} at {peer.site[0]}:{peer.site[1]}"
    if peer.op != "core_barrier":
        raise ins.fail(BarrierError, f"core_barrier #{n} of core {core} meets {where}")
    if peer.data is not data:
        assert peer.data is not None
        raise ins.fail(BarrierError, f"core_barrier #{n} of core {core} on {data.label()} meets {where} "
                                     f"on {peer.data.label()}")  # fmt: skip


def _check_pair(ins: Instr, n: int, mine: _Post, peer: _Post | None, recv_from: int, d: NkiTensor) -> None:
    """The peer's n-th exchange must be the same instruction, aimed at this core, of dst's shape and dtype."""
    core = ins.ctx.core
    if peer is None or peer.op == "core_barrier":
        detail = (f"core {recv_from} reached a core_barrier at {peer.site[0]}:{peer.site[1]} instead" if peer
                  else f"core {recv_from} made a different number of exchanges and barriers")  # fmt: skip
        raise ins.fail(BarrierError, f"exchange #{n} of core {core} has no partner: {detail}")
    where = f"core {recv_from}'s exchange #{n} at {peer.site[0]}:{peer.site[1]}"
    if peer.send_to != core:
        raise ins.fail(InvalidArgumentError, f"{where} sends to core {peer.send_to}, not to core {core}")
    if (peer.op, peer.reduce) != (mine.op, mine.reduce):
        theirs, ours = (f"{p.op}({p.reduce})" if p.reduce else p.op for p in (peer, mine))
        raise ins.fail(InvalidArgumentError, f"{where} is {theirs}, this call is {ours}")
    if tuple(peer.value.shape) != d.shape or peer.value.dtype != d.dtype:
        raise ins.fail(ShapeMismatchError, f"{where} sends {tuple(peer.value.shape)} {peer.value.dtype}, "
                                           f"dst here is {d.shape} {d.dtype}")  # fmt: skip
