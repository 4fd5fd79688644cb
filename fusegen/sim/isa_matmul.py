"""nc_matmul: dst[M,N] (+)= stationary[K,M].T @ moving[K,N] on the Tensor engine, with PSUM flags."""

from __future__ import annotations

import torch

from .conformance import violation
from .errors import AccumulateError, DtypeError, MatmulShapeError, UnsupportedError
from .instr import Instr
from .memory import MemoryRegion
from .ops import matmul_perf_mode
from .tensor import NkiTensor

_FP32_ONLY_WITH = (torch.float32,)
#: the Tensor engine's input formats (ISA nc_matmul "Data types": fp8 e4m3/e5m2, bf16, fp16, tf32, fp32,
#: e4m3fn from NeuronCore-v4; tf32 is stored as fp32 here, legacy e4m3 as torch's e4m3fnuz): no integers
_OCP_E4M3, _LEGACY_E4M3 = torch.float8_e4m3fn, torch.float8_e4m3fnuz
_MATMUL_INPUTS = (_LEGACY_E4M3, _OCP_E4M3, torch.float8_e5m2, torch.bfloat16, torch.float16, torch.float32)
# Narrower products are computed at once: K-stacking gains nothing there (MKL runs tall-skinny GEMMs
# slowly), and they are cheap.
_DEFER_MIN_N = 64
#: Operand layouts whose checks passed, with the dst's PSUM bank, keyed by everything the checks read:
#: the target and, per dst / stationary / moving, its memory, dtype, partition row length and view.
#: Only under rules="error", where every broken rule raises: a combination that passed passes again.
_PASSED: dict[tuple[object, ...], int] = {}


def _checked_bank(ins: Instr, d: NkiTensor, st: NkiTensor, mv: NkiTensor) -> int:
    """_check_operands, remembered per operand layout (kernels repeat a few hundred of them)."""
    if not ins.ctx.rules_error:  # warn mode: every call warns (once per rule and line) and runs on
        return _check_operands(ins, d, st, mv)
    da, sa, ma = d.alloc, st.alloc, mv.alloc
    key = (ins.ctx.target, da.region, da.dtype, da.pstride, d.key, sa.region, sa.dtype, sa.pstride,
           st.key, ma.region, ma.dtype, ma.pstride, mv.key)  # fmt: skip
    bank = _PASSED.get(key)
    if bank is None:
        bank = _check_operands(ins, d, st, mv)
        if len(_PASSED) > 4096:  # never grows unbounded
            _PASSED.clear()
        _PASSED[key] = bank
    return bank


def _check_operands(ins: Instr, d: NkiTensor, st: NkiTensor, mv: NkiTensor) -> int:
    """Memories, PE-array limits, dtypes; returns the dst's PSUM bank within its tile."""
    for t, role in ((st, "stationary"), (mv, "moving")):
        if t.alloc.region is not MemoryRegion.sbuf:
            violation(ins, "tensor-engine-memories", f"{role} in {t.alloc.region.value}, not SBUF")
    if d.alloc.region is not MemoryRegion.psum:
        violation(ins, "tensor-engine-memories", f"dst in {d.alloc.region.value}, not PSUM")
    ins.on_chip((st, "stationary"), (mv, "moving"), (d, "dst"))  # start-partition rule
    tgt = ins.ctx.target
    k, m, n = st.partitions, st.free_size, mv.free_size
    if mv.partitions != k or k > tgt.matmul_k_max:
        raise ins.fail(
            MatmulShapeError,
            f"contraction (partition) sizes stationary {k}, moving "
            f"{mv.partitions}: must be equal and <= {tgt.matmul_k_max}",
        )
    if m > tgt.matmul_m_max:
        raise ins.fail(MatmulShapeError, f"stationary free size {m} > {tgt.matmul_m_max}")
    if n > tgt.matmul_n_max:
        raise ins.fail(MatmulShapeError, f"moving free size {n} > {tgt.matmul_n_max}")
    if d.partitions != m or d.free_size != n:
        raise ins.fail(MatmulShapeError, f"dst {d.shape} must be [M={m}, N={n}]")
    if d.dtype != torch.float32 and not (tgt.nc_version >= 4 and d.dtype == torch.bfloat16):
        raise ins.fail(DtypeError, f"dst dtype {d.dtype}: PSUM matmul output is fp32")
    for t, role in ((st, "stationary"), (mv, "moving")):
        if t.dtype not in _MATMUL_INPUTS:
            raise ins.fail(DtypeError, f"{role} dtype {t.dtype}: the Tensor engine takes fp8, bf16, fp16, "
                           "tf32 or fp32 inputs")  # fmt: skip
    if (st.dtype in _FP32_ONLY_WITH) != (mv.dtype in _FP32_ONLY_WITH):
        raise ins.fail(
            DtypeError, f"fp32 inputs only pair with fp32: stationary {st.dtype}, moving {mv.dtype}"
        )
    _check_e4m3fn(ins, st, mv)
    return check_bank(ins, d)


def _check_e4m3fn(ins: Instr, st: NkiTensor, mv: NkiTensor) -> None:
    """rules.py matmul-fp8-e4m3fn: OCP e4m3fn inputs from NeuronCore-v4 only, never beside legacy e4m3."""
    dtypes = (st.dtype, mv.dtype)
    if _OCP_E4M3 not in dtypes:
        return
    if ins.ctx.target.nc_version < 4:
        role = "stationary" if st.dtype == _OCP_E4M3 else "moving"
        violation(ins, "matmul-fp8-e4m3fn", f"{role} is float8_e4m3fn on {ins.ctx.target.name}")
    elif _LEGACY_E4M3 in dtypes:
        violation(ins, "matmul-fp8-e4m3fn", "float8_e4m3 (legacy) and float8_e4m3fn in one matmul")


def check_bank(ins: Instr, d: NkiTensor) -> int:
    """The dst must sit inside one 2 KiB PSUM bank; returns the bank index within its tile."""
    bank_bytes = ins.ctx.target.psum_bank_bytes
    lo, hi = d.free_byte_range()
    if lo // bank_bytes != hi // bank_bytes:
        raise ins.fail(
            MatmulShapeError,
            f"dst bytes {lo}..{hi} of each partition straddle a "
            f"{bank_bytes}-byte PSUM bank boundary ({d.alloc.label()})",
        )
    return lo // bank_bytes


def _flag_state(d: NkiTensor) -> str:
    """'clear', 'set' or 'mixed': do the dst elements hold matmul data?"""
    alloc = d.alloc
    if not alloc.mm_any:
        return "clear"
    if d.key in alloc.mm_full:
        return "set"
    flags = d.materialize(alloc.matmul_flags())
    if bool(flags.all()):
        return "set"
    return "mixed" if bool(flags.any()) else "clear"


def _other_writes(d: NkiTensor) -> torch.Tensor | None:
    """Mask over `d` of elements a non-matmul instruction wrote (written, holding no matmul data), or None.
    The first write to a PSUM location overwrites, later ones accumulate (MIG 0.3.0, ISA nc_matmul)."""
    alloc = d.alloc
    if alloc.all_written:
        other = torch.ones(d.shape, dtype=torch.bool)
    elif alloc.has_writes():
        other = d.materialize(alloc.written_mask()).clone()
    else:
        return None  # the common case: a fresh tile
    if alloc.mm_any:
        other &= ~d.materialize(alloc.matmul_flags())
    return other if bool(other.any()) else None


def _accumulate(ins: Instr, d: NkiTensor, st: NkiTensor, mv: NkiTensor, accumulate: object) -> bool:
    """Overwrite / add per the 'holds matmul data' flags (nki.md §4); True if PSUM was read."""
    alloc = d.alloc
    if accumulate not in (None, True, False):
        raise ins.fail(UnsupportedError, f"accumulate={accumulate!r}: use None, True or False")
    state = "clear" if accumulate is False else _flag_state(d)
    if accumulate is True and state != "set":
        flags = d.materialize(alloc.matmul_flags())
        raise ins.fail(
            AccumulateError,
            f"accumulate=True onto {int((~flags).sum())} PSUM elements no "
            f"matmul has written since they were last overwritten ({alloc.label()})",
        )
    if accumulate is None and state != "set":
        other = _other_writes(d)
        if other is not None and ins.ctx.target.nc_version < 4:
            raise ins.fail(
                AccumulateError,
                f"accumulate=None onto {int(other.sum())} PSUM elements a non-matmul instruction wrote "
                f"({alloc.label()}): the compiler accumulates onto any earlier write, which NeuronCore-v2/v3 "
                "leave undefined (ISA nc_matmul); start the group with accumulate=False",
            )
        if other is not None:
            state = "written"  # NeuronCore-v4 accumulates onto the earlier write
    out = d.materialize()
    deferrable = alloc.dtype is torch.float32 and len(d.shape) == 2  # a GEMM adds into fp32 storage only
    if state in ("clear", "set") and deferrable and mv.free_size >= _DEFER_MIN_N:  # the common case
        ins.ctx.matmuls.add(d, out, st, mv, 1.0 if state == "set" else 0.0)
    else:
        if alloc.pending or alloc.readers:  # the paths below use and change the tile's current contents
            ins.ctx.matmuls.flush(alloc)
        fresh = (st.matrix().float().t() @ mv.matrix().float()).reshape(out.shape)
        if state == "mixed":
            out.copy_(torch.where(d.materialize(alloc.matmul_flags()), out + fresh, fresh))
        elif state == "written" and not alloc.all_written:  # (an all-written tile keeps no mask)
            out.copy_(torch.where(d.materialize(alloc.written_mask()), out + fresh, fresh))
        elif state in ("set", "written"):
            out.add_(fresh)
        else:
            out.copy_(fresh)
    if d.key not in alloc.mm_full:
        alloc.mm_pending.append(d.key)  # set in the flags when they are next read (Alloc.matmul_flags)
        alloc.mm_any = True
        alloc.mm_full.add(d.key)
    ins.mark_written(d)
    return state != "clear"


def nc_matmul(
    dst: NkiTensor,
    stationary: NkiTensor,
    moving: NkiTensor,
    is_stationary_onezero: bool = False,
    is_moving_onezero: bool = False,
    is_transpose: bool = False,
    accumulate: object = None,
    tile_position: object = (),
    tile_size: object = (),
    perf_mode: object = matmul_perf_mode.none,
    name: object = None,
) -> None:
    """dst[M,N] (+)= stationary[K,M].T @ moving[K,N], fp32 accumulation in PSUM."""
    ins = Instr("nc_matmul", "tensor")
    d, st, mv = ins.tensor(dst, "dst"), ins.tensor(stationary, "stationary"), ins.tensor(moving, "moving")
    if is_transpose or tile_position or tile_size or perf_mode not in (None, matmul_perf_mode.none):
        raise ins.fail(UnsupportedError, "is_transpose/tile_position/tile_size/perf_mode are not modelled")
    bank = _checked_bank(ins, d, st, mv)
    ins.check_read(st, "stationary")
    ins.check_read(mv, "moving")
    # bf16/fp16 products are exact in fp32, so an fp32 matmul on upcast operands is faithful
    if _accumulate(ins, d, st, mv, accumulate):
        ins.bytes[4] += d.numel * d.dtype.itemsize  # accumulation reads PSUM
    ins.account(d, "w", 1)
    ins.finish(d.partitions, mv.free_size, psum_bank=bank)
