"""Instruction selection: stage expressions to NKI instructions, fusing what one instruction can do.

Patterns, tried from the consumer down (an operand pattern is recomputed inside every instruction
that fuses it, which is free: a bias, a scale or a second scalar op costs no extra pass):
- `act(t * s + b)`                       -> nisa.activation (Scalar engine; s scalar/[P,1], b [P,1];
                                            select_affine.py)
- `exp(u) / sum(exp(..))` (full width)     -> one nisa.activation(op=nl.exp) with log of the sum in its bias
                                            (select_folds.py)
- `t * s ± b` (full width, with a load)  -> nisa.activation(op=nl.copy) when the Scalar engine is the less
                                            loaded of the two (`EngineLoad`); `t - b` is a bias of -b
- `sum(act(t * s + b))`                  -> nisa.activation_reduce
- `act(c * s + b)` on a row stage's [P,1] column c -> one activation (the same, for per-row chains)
- `x + g * v` (bf16 row loads, g a column) -> matmuls into PSUM and one eviction (select_pe.py)
- `(t op0 s0) op1 s1`                    -> nisa.tensor_scalar (s scalar or [P,1]; select_alu.py)
- `(t op0 s) op1 u`                      -> nisa.scalar_tensor_tensor (u a tile; select_alu.py)
- `t op u`                               -> nisa.tensor_tensor
- `max(t)`                               -> nisa.tensor_reduce; `max(t * s)`, s a scalar, reduces t itself
                                            (select_folds.py)
- `recip(t)` (stage.py's form of a divisor) -> nisa.reciprocal (division is no hardware instruction)
- `pow(t, p)`, p not an integer            -> nisa.tensor_tensor(op=nl.power) on GpSimd, p memset into a tile
With a `span` (select_span.py) the per-row prefix is emitted once over a token tile's heads.
Engines come from engines.py: `[P, 1]` work goes to GpSimd only where the documented table allows the
instruction and op there, and never with a PSUM operand (a column chain of scalar steps is rewritten
for that by select_columns.py), and full-width work likewise where a stage asks (`tile_engine`: the FFN's
add of the other core's sums, after the exchange); `tensor_scalar` operands and an activation's scale are
fp32 (a column in another dtype is copied to fp32 first).
Each materialised value gets a fresh SBUF tile named after a counter; its dtype is f32 unless the
consumer (a cast, an output, a matmul operand) asks for its own dtype, which the engines write at no cost.
A value already held in f32 that a consumer wants in another dtype is rounded by an identity activation
on the Scalar engine instead of being computed again.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Self

from fusegen.codegen import select_affine as affine
from fusegen.codegen import select_alu as alu
from fusegen.codegen import select_columns as columns
from fusegen.codegen import select_folds, select_pe
from fusegen.codegen.engines import GPSIMD, gpsimd_allows
from fusegen.codegen.select_span import HEAD, RANGE, Span, call_line
from fusegen.codegen.select_tables import (
    ACTIVATIONS,
    ALU,
    CALL_COST,
    NL_DTYPE,
    EngineLoad,
)
from fusegen.codegen.stage import Expr, Operand


class SelectError(Exception):
    """An expression no instruction pattern covers."""


@dataclass(frozen=True)
class Layout:
    """Source text for a stage's tile extent: live partitions/free elements and allocation size."""

    part: str  # e.g. "ph"
    free: str  # e.g. "rw"
    free_alloc: str  # allocation free size, e.g. "512" or "K"


@dataclass
class Selector:
    """Emits NKI source lines for stage expressions, memoising materialised values."""

    layout: Layout
    prefix: str
    column_engine: str = ""  # `engine=` of [P, 1] work where engines.py allows it (off the Vector queue)
    tile_engine: str = ""  # the same for full-width work (GpSimd where it idles, e.g. after an exchange)
    load: EngineLoad | None = None  # shared by a kernel's stages: balance affine steps Scalar/Vector
    pe_staging: bool = False  # two-tile work may go through PSUM on the Tensor engine (select_pe.py)
    rows_on_pe: bool = False  # ... also rows, by identity matmuls: finite row inputs only (0 x inf = nan)
    pe_staged: bool = False  # this stage has used its one PSUM-staged tile
    evict_on_scalar: bool = False  # PSUM operands are copied to SBUF by the Scalar engine, not the Vector
    psum_banks: int = 0  # banks of the PSUM accumulators this stage's PE-formed values rotate through
    into: dict[int, Operand] = field(default_factory=dict)  # id(expr) -> where its value is to be written
    span: Span | None = None  # the per-row prefix emitted over a token tile's heads (select_span.py)
    share_when: str = ""  # trace-time condition: the Scalar engine evicts a PE-formed output's last chunk
    lines: list[str] = field(default_factory=list)
    line_kinds: list[str] = field(default_factory=list)  # kind of the tile each line allocates or writes
    line_engines: list[str] = field(default_factory=list)  # "act" | "dve" | "gpsimd"; "" for allocations
    constants: list[str] = field(default_factory=list)  # launch-wide lines: constant columns, memset once
    tiles: list[tuple[str, str, str]] = field(default_factory=list)  # (name, kind, dtype) allocated
    calls: list[tuple[str, str, int]] = field(default_factory=list)  # (call, destination kind, passes)
    _kinds: dict[str, str] = field(default_factory=dict)  # tile name -> kind
    writers: dict[str, str] = field(default_factory=dict)  # tile name -> engine of its last writer
    _memo: dict[tuple[int, str], Operand] = field(default_factory=dict)
    constant_columns: dict[str, Operand] = field(default_factory=dict)  # by value source (select_columns)
    _memo_neg: dict[tuple[int, str], Expr] = field(default_factory=dict)
    _seen: dict[tuple[str, tuple[int, ...], str], Expr] = field(default_factory=dict)  # (op, args, kind)
    _depth: int = 0  # trace-time blocks (`if`, `for`) the lines emitted now are inside
    _units: int = 0  # of which branches that stay one unit of the per-row prefix (their Vector steps in it)

    def fork(self) -> Self:
        """A copy to emit into on trial: what either emits later leaves the other as it was. Its lists, dicts
        and sets are copied, their Exprs and Operands shared (memo keys are Expr ids); the engine tally
        and the span, changed in place by emitting, are copied whole; the rest is immutable."""
        twin = copy.copy(self)
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, list | dict | set):
                setattr(twin, f.name, copy.copy(value))
        twin.load, twin.span = copy.deepcopy(self.load), copy.deepcopy(self.span)
        return twin

    def intern(self, op: str, args: tuple[Expr, ...], kind: str) -> Expr:
        """`op(args)` as an Expr: the one already materialised with the same op and operands, else new."""
        return self._seen.get((op, tuple(id(a) for a in args), kind)) or Expr(op, args, kind=kind)

    def value(self, e: Expr, dtype: str = "f32") -> Operand:
        """An operand holding `e` (a scalar expression, a leaf, or a freshly computed tile)."""
        if e.kind == "scalar":
            return Operand("scalar", e.code, memory="")
        if e.op == "leaf" and e.leaf is not None and (dtype == e.leaf.dtype or dtype == "f32"):
            return e.leaf
        key = (id(e), dtype)
        if key not in self._memo:
            held = self._memo.get((id(e), "f32"))
            # already computed: round it, don't recompute (a statistic a pass finished would be recomputed
            # from the last pass's one block)
            if held is not None and held.kind in ("tile", "vec"):
                self._memo[key] = self.convert(held, dtype)
            else:
                self._memo[key] = self._materialise(e, dtype)
                if e.op not in ("leaf", "cast", "scalar"):
                    self._seen.setdefault((e.op, tuple(id(a) for a in e.args), e.kind), e)
        return self._memo[key]

    # ---- emission ----------------------------------------------------------------------------

    def _alloc(self, kind: str, dtype: str) -> Operand:
        name = f"{self.prefix}{len(self.tiles)}"
        self.tiles.append((name, kind, dtype))
        self._kinds[name] = kind
        free_alloc, free = ("1", "1") if kind == "vec" else (self.layout.free_alloc, self.layout.free)
        self._enter(kind, "")
        if self.span is not None and self.span.open and kind == "vec":
            self.span.column(name, NL_DTYPE[dtype])  # allocated per token tile, over its heads
        else:
            line = f"{name} = nl.ndarray((_P, {free_alloc}), dtype={NL_DTYPE[dtype]}, buffer=nl.sbuf)"
            self._append([line], kind, "")
        return Operand(kind, f"{name}[0:{self.layout.part}, 0:{free}]", dtype=dtype)

    def _dst(self, e: Expr, dtype: str) -> Operand:
        """Where `e`'s value goes: the caller's destination for it (`into`, when of `dtype`), else a fresh
        tile."""
        dst = self.into.get(id(e))
        if dst is None or dst.dtype != dtype:
            return self._alloc(e.kind, dtype)
        self._kinds[dst.code.split("[")[0]] = e.kind
        return dst

    def _emit(self, call: str, reads: tuple[Operand, ...] = (), **kwargs: str) -> None:
        """One instruction writing `dst` and reading `reads`; `engine=` where the choice is ours."""
        kind = self._kinds[kwargs["dst"].split("[")[0]]
        ops = tuple(kwargs[k] for k in ("op", "op0", "op1") if k in kwargs) or ("",)
        engine = self.column_engine if kind == "vec" else self.tile_engine
        if call == "tensor_tensor" and ops == ("nl.power",):
            kwargs["engine"] = GPSIMD  # the only engine with power (engines.py); operands are in SBUF
        elif engine and gpsimd_allows(call, ops, columns.reads_psum(reads)):
            kwargs["engine"] = engine
        on = "gpsimd" if kwargs.get("engine") == GPSIMD else CALL_COST[call][0]
        chain = self._enter(kind, on)
        span = self.span  # over a token tile's heads: the access of each operand decided there
        lines = span.lines(call, kwargs, chain, self._constant_names()) if span else [call_line(call, kwargs)]
        self._append(lines, kind, on)
        for written in (kwargs["dst"], kwargs.get("reduce_res")):
            if written:  # no reduce_res: nothing more written
                self.writers[written.split("[")[0]] = on
        engine, passes = CALL_COST[call]
        if call == "tensor_tensor" and columns.reads_psum(reads):  # one input in PSUM: N, not 2N (nki.md §6)
            passes = 1
        self.calls.append((call, kind, passes))
        full_width = kind == "tile" or any(r.kind == "tile" for r in reads)  # e.g. a reduction into a column
        if self.load is not None and full_width and "engine" not in kwargs:
            self.load.add(engine, passes)

    def raw(self, line: str, kind: str, engine: str) -> None:
        """A line formatted elsewhere (select_pe.py), with the kind and engine of what it writes."""
        self._enter(kind, engine)
        self._append([line], kind, engine)

    @contextmanager
    def block(self, header: str, kind: str, engine: str = "", unit: bool = False) -> Iterator[None]:
        """Lines emitted inside are the body of the trace-time `header` (`if ...:`, `else:`, `for ...:`);
        with `unit`, a branch whose Vector steps stay in the per-row prefix (one unit of it)."""
        self.raw(header, kind, engine)
        self._depth += 1
        self._units += unit
        try:
            yield
        finally:
            self._depth -= 1
            self._units -= unit

    def at(self, code: str, columns: str = "") -> str:
        """Operand `code` as the line emitted now reads it: over the chain's range (or `columns` of it), or
        at the epilogue's head."""
        if self.span is None:
            return code
        columns = columns or (RANGE if self.span.open else HEAD)
        return self.span.at(code, columns, self._constant_names())

    def _unit_engine(self, engine: str) -> str:
        return "" if self._units and engine == "dve" else engine

    def _enter(self, kind: str, engine: str) -> bool:
        """Before a line writing `kind` on `engine`: whether it is in the span's chain, which a full-width
        or Vector step ends (as `column_prefix` ends the per-row prefix)."""
        if self.span is None or not self.span.open:
            return False
        if kind != "vec" or self._unit_engine(engine) == "dve":
            self.span.close(len(self.lines))
        return self.span.open

    def _append(self, lines: list[str], kind: str, engine: str) -> None:
        engine = self._unit_engine(engine)
        for line in lines:
            self.lines.append("    " * self._depth + line)
            self.line_kinds.append(kind)
            self.line_engines.append(engine)

    def _constant_names(self) -> set[str]:
        return {column.name for column in self.constant_columns.values()}

    def register(self, name: str, kind: str) -> None:
        """A tile allocated by a raw line."""
        self._kinds[name] = kind

    def passes(self, engine: str, start: int = 0) -> int:
        """Full-width passes (instructions weighted by cost) this stage puts on `engine`, from its call
        number `start` on."""
        calls = self.calls[start:]
        return sum(passes for call, kind, passes in calls if kind == "tile" and CALL_COST[call][0] == engine)

    def _materialise(self, e: Expr, dtype: str) -> Operand:
        if e.op == "cast":  # rounded to its own dtype first: bf16(f16(v)) keeps f16's range and rounding
            inner = self.value(e.args[0], e.dtype)
            return inner if dtype in ("f32", e.dtype) else self.convert(inner, dtype)
        if e.op == "leaf":
            return self.copy(self.value(e), e.kind, dtype)
        if e.op in ACTIVATIONS:
            return self._activation(e, dtype)
        if e.op == "sum":
            return self._activation_reduce(e)
        if e.op == "max":
            scaled = select_folds.max_of_scaled(self, e)
            if scaled is not None:
                return scaled
            dst = self._alloc("vec", "f32")
            src = self.value(e.args[0])
            self._emit("tensor_reduce", (src,), dst=dst.code, op="nl.maximum", data=src.code, axis="(1,)")
            return dst
        if e.op == "recip":
            return alu.reciprocal(self, e, dtype)
        if e.op == "pow":
            return alu.power(self, e, dtype)
        if e.op in ("neg", "clamp") or e.op in ALU:
            return self._arith(e, dtype)
        raise SelectError(f"no NKI instruction pattern for `{e.op}`")

    def copy(self, src: Operand, kind: str, dtype: str) -> Operand:
        """A fresh tile holding `src` in `dtype`."""
        dst = self._alloc(kind, dtype)
        self._emit("tensor_copy", (src,), dst=dst.code, src=src.code)
        return dst

    def convert(self, src: Operand, dtype: str) -> Operand:
        """`src` in another dtype by an identity activation: one pass on the Scalar engine, which these
        kernels leave idler than the Vector engine (recomputing a tensor_tensor would take two there)."""
        dst = self._alloc(src.kind, dtype)
        self._emit("activation", (src,), dst=dst.code, op="nl.copy", data=src.code)
        return dst

    def _fp32(self, x: Operand) -> Operand:
        """`x` as a scale / tensor_scalar operand, which must be fp32 ([ISA] activation, tensor_scalar)."""
        if x.kind == "scalar" or x.dtype == "f32":
            return x
        return self.copy(x, x.kind, "f32")

    def _activation(self, e: Expr, dtype: str) -> Operand:
        data, scale, bias = affine.operands(self, e.args[0])
        dst = self._dst(e, dtype)
        kwargs = {"dst": dst.code, "op": ACTIVATIONS[e.op], "data": data.code}
        kwargs.update(affine.keywords(scale, bias))
        self._emit("activation", affine.present(data, scale, bias), **kwargs)
        return dst

    def _activation_reduce(self, e: Expr) -> Operand:
        inner = e.args[0]
        op, arg = (ACTIVATIONS[inner.op], inner.args[0]) if inner.op in ACTIVATIONS else ("nl.copy", inner)
        data, scale, bias = affine.operands(self, arg)
        scratch = self._alloc("tile", "f32")  # the elementwise result is discarded; only the sum is kept
        dst = self._alloc("vec", "f32")
        kwargs = {
            "dst": scratch.code,
            "op": op,
            "data": data.code,
            "reduce_op": "nl.add",
            "reduce_res": dst.code,
        }
        kwargs.update(affine.keywords(scale, bias))
        self._emit("activation_reduce", affine.present(data, scale, bias), **kwargs)
        return dst

    def _arith(self, e: Expr, dtype: str) -> Operand:
        on_scalar = select_folds.normalised_exp(self, e, dtype) or affine.on_scalar(self, e, dtype)
        if on_scalar is not None:
            return on_scalar
        chain = alu.scalar_chain(e)
        if chain is not None:
            base, ops = chain
            return alu.tensor_scalar(self, base, ops, e.kind, dtype)
        a, b = e.args
        if e.op not in ALU:
            raise SelectError(f"`{e.op}` needs a scalar operand")
        formed = select_pe.row_plus_scaled_row(self, e, dtype)
        if formed is not None:
            return formed
        fused = alu.stt(self, e, a, b, dtype) or alu.stt(self, e, b, a, dtype, reverse=True)
        if fused is not None:
            return fused
        x, y = self._not_both_psum(self.value(a), self.value(b))
        on_scalar = columns.on_scalar(self, x, ALU[e.op], y) or columns.on_scalar(self, y, ALU[e.op], x)
        if on_scalar is not None:
            return on_scalar if on_scalar.dtype == dtype else self.copy(on_scalar, "vec", dtype)
        on_pe = select_pe.tensor_tensor(self, x, y, e.op, e.kind, dtype)
        if on_pe is not None and on_pe.dtype != dtype:  # the exact fp32 sum: kept for an fp32 reader
            self._memo[(id(e), on_pe.dtype)] = on_pe
            return self.convert(on_pe, dtype)
        if on_pe is not None:
            return on_pe
        dst = self._dst(e, dtype)
        self._emit("tensor_tensor", (x, y), dst=dst.code, data1=x.code, data2=y.code, op=ALU[e.op])
        return dst

    def _not_both_psum(self, x: Operand, y: Operand) -> tuple[Operand, Operand]:
        """Two-tensor instructions may not read PSUM twice: evict one operand to SBUF first (on the
        Scalar engine when `evict_on_scalar`)."""
        if x.memory == "psum" and y.memory == "psum":
            y = self.convert(y, "f32") if self.evict_on_scalar else self.copy(y, y.kind, "f32")
        return x, y


