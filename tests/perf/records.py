"""Synthetic trace records for the perf tests."""

from __future__ import annotations

from fusegen.sim.trace import Operand, Record


def record(engine: str, op: str, operands: tuple[Operand, ...], partitions: int = 128, elems: int = 512, *,
           core: int = 0, index: int = 0, epoch: int = 0, hbm_read: int = 0, sbuf_read: int = 0,
           sbuf_write: int = 0, psum_bank: int | None = None) -> Record:  # fmt: skip
    """A Record with only the fields the cost model and the scheduler read."""
    return Record(index, core, engine, op, operands, partitions, elems, hbm_read, 0, sbuf_read, sbuf_write,
                  0, 0, psum_bank, "synthetic.py", index + 1, epoch)  # fmt: skip


def sbuf(role: str, alloc: int, shape: tuple[int, ...] = (128, 512), dtype: str = "float32") -> Operand:
    """An SBUF operand."""
    return (role, alloc, "sbuf", shape, dtype)


def psum(role: str, alloc: int, shape: tuple[int, ...] = (128, 512)) -> Operand:
    """A PSUM operand (fp32)."""
    return (role, alloc, "psum", shape, "float32")


def hbm(role: str, alloc: int, shape: tuple[int, ...] = (128, 512), dtype: str = "bfloat16") -> Operand:
    """A shared-HBM operand."""
    return (role, alloc, "shared_hbm", shape, dtype)


def matmul(
    dst: int, stationary: int, moving: int, n: int = 512, dtype: str = "bfloat16", **kw: int
) -> Record:
    """nc_matmul: [128, 128] stationary, [128, n] moving, into PSUM."""
    ops = (
        sbuf("r", stationary, (128, 128), dtype),
        sbuf("r", moving, (128, n), dtype),
        psum("w", dst, (128, n)),
    )
    return record("tensor", "nc_matmul", ops, 128, n, **kw)


def dma_in(dst: int, src: int, partitions: int = 128, nbytes: int = 131072, **kw: int) -> Record:
    """dma_copy HBM -> SBUF of `nbytes` over `partitions`."""
    ops = (hbm("r", src), sbuf("w", dst))
    return record("dma", "dma_copy", ops, partitions, nbytes // partitions // 2, hbm_read=nbytes,
                  sbuf_write=nbytes, **kw)  # fmt: skip
