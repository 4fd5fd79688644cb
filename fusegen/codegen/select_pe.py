"""Full-width two-tile work of a forward row stage moved onto the idle Tensor engine, through PSUM.

The Vector engine runs `tensor_tensor` in 2N cycles with both inputs in SBUF but in N with one in PSUM,
and Scalar/Vector read PSUM like SBUF (shared/reference/nki.md §6, §5). The Tensor engine writes PSUM:
an identity matmul (stationary I[pt, pt], moving a bf16 row chunk of at most 512 columns) puts the row
into PSUM as fp32 exactly (1.0 * x plus zeros, fp32 accumulation), in max(64, N) PE cycles at 2.4 GHz;
an accumulating second matmul adds another row with the fp32 rounding of a Vector fp32 add. So:
- `a + b` of two bf16 row loads: two matmuls, no Vector work at all;
- `a op t` with `a` a bf16 row load: `a` staged into PSUM by one matmul, the tensor_tensor at N (an fp32
  result overwrites the staged row, so a following two-tile step reads PSUM too);
- `((x ± b) * s) op u` (a scalar_tensor_tensor, 2N) whose `x ± b` the Scalar engine computes anyway (an
  affine activation, e.g. layernorm's centring): `* s` folds into that activation (scale s, bias ±b*s),
  which writes PSUM, and `op u` reads it there (N). No Tensor-engine work; no extra Scalar pass;
- `x + g * v` of two bf16 row loads and a column g (a scalar_tensor_tensor, 2N): formed in PSUM per
  512-column chunk by four matmuls, I·x + Σ diag(g_i)·v over g's three bf16 parts (g_1 = bf16(g), each
  next the rounded residual: g to 2^-24), and evicted by one copy (N). The diagonals are per-row work (Scalar
  activations scaling the identity), so they run with the per-row math, ahead of the epilogue.
A stage stages one tile, and only when its allocation fits the PSUM banks (tested when NKI traces the
kernel: `HB` or the width is known then); a wider one takes the SBUF form in the `else` branch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fusegen.codegen import select_affine as affine
from fusegen.codegen.select_span import LOOP, ONE
from fusegen.codegen.select_tables import NL_DTYPE
from fusegen.codegen.stage import Expr, Operand

if TYPE_CHECKING:
    from fusegen.codegen.select import Selector

HALF = ("bf16", "f16")
#: fp32 columns of all PSUM banks, as NKI names them (nl.tile_size, shared/reference/nki.md §3)
PSUM_COLUMNS = "nl.tile_size.psum_bank_fmax * nl.tile_size.psum_num_banks"
IDENTITY = "pe_identity"  # the launch-wide [_P, _P] identity in the rows' dtype
#: bf16 parts of the column in a PE-formed `x + g*v`: three carry g's 24 bits (two carry 16, and round
#: 0.07% of the outputs to the other bf16 neighbour, past TileKernels' bar: docs/performance.md)
G_PARTS = 3
#: PSUM banks of a chunk-by-chunk accumulation: two, so a chunk's matmuls need not wait for the previous
#: chunk's eviction
ACC_BANKS = 2


def identity_bytes(constants: tuple[str, ...]) -> int:
    """SBUF bytes per partition of the launch-wide identities among `constants` (one per rows' dtype) and
    the offsets they are built from; 0 without any."""
    built = sum(1 for line in constants if line.startswith(f"{IDENTITY}") and "nl.ndarray" in line)
    return built * 128 * 2 + (128 * 4 if built else 0)


def identity_line(line: str) -> bool:
    """Whether a launch-wide constant line builds the identity (not a [P, 1] constant column)."""
    return "pe_offsets" in line or IDENTITY in line


def _row_load(x: Operand) -> bool:
    return x.kind == "tile" and x.memory == "sbuf" and x.dtype in HALF and x.code.endswith("]")


def tensor_tensor(sel: Selector, x: Operand, y: Operand, op: str, kind: str, dtype: str) -> Operand | None:
    """`x op y` (ALU name `op`) with PE help, or None when neither form applies to this stage; a sum of two
    rows is returned in fp32 whatever `dtype` is asked for."""
    if not sel.rows_on_pe or sel.pe_staged or kind != "tile" or "psum" in (x.memory, y.memory):
        return None
    both = _row_load(x) and _row_load(y) and x.dtype == y.dtype and op == "add"
    if not both and not _row_load(x) and not _row_load(y):
        return None
    if not both and op not in ("add", "sub", "mul", "maximum", "minimum"):
        return None
    sel.pe_staged = True
    staged = x if _row_load(x) else y
    identity = _identity(sel, staged.dtype)
    other = y if staged is x else x
    rows = [staged, other] if both else [staged]
    dst = _alloc(sel)
    # an fp32 product overwrites the staged row in place (only this instruction reads it), so it stays in
    # PSUM and the next two-tile step that reads it runs at N as well
    out = dst if both or dtype == "f32" else sel._alloc(kind, dtype)
    part, free = sel.layout.part, sel.layout.free
    with sel.block(f"if {sel.layout.free_alloc} <= {PSUM_COLUMNS}:", "tile", "pe"):
        with sel.block(f"for q0 in range(0, {free}, _F_MOV):", "tile", "pe"):
            sel.raw(f"qw = min(_F_MOV, {free} - q0)", "tile", "pe")
            for i, row in enumerate(rows):
                sel.raw(f"nisa.nc_matmul(dst={_sub(dst.code)}, stationary={identity}[0:{part}, 0:{part}], "
                        f"moving={_sub(row.code)}, accumulate={i > 0})", "tile", "pe")  # fmt: skip
        if not both:
            first, second = (dst, other) if staged is x else (other, dst)
            sel._emit("tensor_tensor", (first, second), dst=out.code, data1=first.code, data2=second.code,
                      op=f"nl.{_NL[op]}")  # fmt: skip
    # too wide for PSUM: the step straight from the two SBUF rows (2N), not the row staged into SBUF first,
    # which would add a full-width Scalar copy for nothing
    with sel.block("else:", "tile", "pe"):
        sel.raw(f"nisa.tensor_tensor(dst={out.code}, data1={x.code}, data2={y.code}, op=nl.{_NL[op]})",
                "tile", "dve")  # fmt: skip
    return out if not both else dst  # a sum stays fp32: the caller rounds it, and may read it again


def scaled_affine_then_row(sel: Selector, e: Expr, inner: Expr, t: Expr, s: Expr, other: Expr, dtype: str
                           ) -> Operand | None:  # fmt: skip
    """`(t * s) op other` with t a full-width `x ± b` the Scalar engine would compute: one activation
    (scale s, bias ±b*s) into PSUM and a tensor_tensor reading it there; None otherwise."""
    if not sel.pe_staging or sel.pe_staged or sel.load is None or inner.op != "mul" or e.op not in _NL:
        return None
    # t's own pass (`x ± b`, one activation or tensor_scalar) takes `* s` as well; on the Scalar engine its
    # result may go to PSUM
    x, scale, bias, negate = affine.split(sel, t)
    if x is t or scale is not None or bias is None or x.kind != "tile":
        return None
    sel.pe_staged = True
    signed = Expr("neg", (bias,), kind=bias.kind) if negate else bias
    bias_col = sel.value(Expr("mul", (signed, s), kind="vec"))
    scale_op = sel._fp32(sel.value(s))
    data = sel.value(x)
    dst = _alloc(sel)
    sel._emit("activation", (data, scale_op, bias_col), dst=dst.code, op="nl.copy", data=data.code,
              bias=bias_col.code, scale=scale_op.code)  # fmt: skip
    row = sel.value(other)
    first, second = (dst, row) if e.args[0] is inner else (row, dst)
    out = dst if dtype == "f32" else sel._alloc(e.kind, dtype)
    sel._emit("tensor_tensor", (first, second), dst=out.code, data1=first.code, data2=second.code,
              op=f"nl.{_NL[e.op]}")  # fmt: skip
    return out


def row_plus_scaled_row(sel: Selector, e: Expr, dtype: str) -> Operand | None:
    """`x + g * v` (x, v bf16 row loads of one dtype, g a column) formed in PSUM by the Tensor engine;
    None when `e` is not of that form or the stage takes no PE help."""
    if not sel.rows_on_pe or e.op != "add" or e.kind != "tile":
        return None
    for row, product in (e.args, e.args[::-1]):
        parts = _column_times_row(product)
        x = sel.value(row) if parts is not None and row.op == "leaf" else None
        if parts is None or x is None or not _row_load(x):
            continue
        g, v = sel.value(parts[0]), sel.value(parts[1])
        if _row_load(v) and v.dtype == x.dtype:
            return _formed_in_psum(sel, x, _fp32_column(sel, g), v, dtype)
    return None


def _column_times_row(e: Expr) -> tuple[Expr, Expr] | None:
    """(column, row load) of `column * row`, else None."""
    if e.op != "mul" or e.kind != "tile" or len(e.args) != 2:
        return None
    a, b = e.args
    column, row = (a, b) if a.kind == "vec" else (b, a)
    return (column, row) if column.kind == "vec" and row.op == "leaf" else None


def _fp32_column(sel: Selector, g: Operand) -> Operand:
    """An activation's scale is fp32 ([ISA] activation)."""
    return g if g.dtype == "f32" else sel.copy(g, "vec", "f32")


def _formed_in_psum(sel: Selector, x: Operand, g: Operand, v: Operand, dtype: str) -> Operand:
    """out = I·x + Σ diag(g_i)·v over the bf16 parts g_i of g, chunk by chunk in one PSUM bank, evicted
    into `dtype`."""
    identity = _identity(sel, x.dtype)
    part = sel.layout.part
    diagonals = [_diagonal(sel, column, x.dtype) for column in _parts(sel, g, x.dtype)]
    dst = sel._alloc("tile", dtype)
    acc = f"{dst.code.split('[')[0]}_acc"
    sel.psum_banks += ACC_BANKS
    free = sel.layout.free
    with sel.block(f"for q0 in range(0, {free}, _F_MOV):", "tile", "pe"):
        sel.raw(f"qw = min(_F_MOV, {free} - q0)", "tile", "pe")
        sel.raw(f"{acc} = nl.ndarray((_P, _F_MOV), dtype=nl.float32, buffer=nl.psum)", "tile", "pe")
        terms = [(f"{identity}[0:{part}, 0:{part}]", x)] + [(d, v) for d in diagonals]
        for i, (stationary, row) in enumerate(terms):
            sel.raw(f"nisa.nc_matmul(dst={acc}[0:{part}, 0:qw], stationary={sel.at(stationary)}, "
                    f"moving={_sub(row.code)}, accumulate={i > 0})", "tile", "pe")  # fmt: skip
        _evict(sel, _sub(dst.code), f"{acc}[0:{part}, 0:qw]")
    if sel.load is not None:
        sel.load.add("dve", 1)
    return dst


def _evict(sel: Selector, dst: str, src: str) -> None:
    """A chunk's eviction from PSUM on the Vector engine; the last chunk's on the Scalar engine where
    `sel.share_when` holds (trace-time), after the Vector engine's chunks: its write then waits for none of
    theirs and its store for little. Only with the per-tile chain, which leaves the Scalar engine that time;
    per head it was slower in every split measured (docs/performance.md)."""
    copy = f"nisa.tensor_copy(dst={dst}, src={src})"
    if not sel.share_when:
        sel.raw(copy, "tile", "dve")
        return
    with sel.block(f"if {sel.share_when} and q0 + qw == {sel.layout.free}:", "tile", "act"):
        sel.raw(f"nisa.activation(dst={dst}, op=nl.copy, data={src})", "tile", "act")
    with sel.block("else:", "tile", "dve"):
        sel.raw(copy, "tile", "dve")


def _parts(sel: Selector, g: Operand, dtype: str) -> list[Operand]:
    """fp32 columns whose `dtype` roundings sum to g within 2^-24 relative: g, then the residuals
    r_{i+1} = r_i - bf16(r_i) (exact, Sterbenz), each rounded by its diagonal. All on the Scalar engine,
    which wrote g (no hand-off between engines)."""
    parts = [g]
    for _ in range(G_PARTS - 1):
        rounded = sel._alloc("vec", dtype)
        sel._emit("activation", (parts[-1],), dst=rounded.code, op="nl.copy", data=parts[-1].code)
        residual = sel._alloc("vec", "f32")
        sel._emit("activation", (rounded, parts[-1]), dst=residual.code, op="nl.copy", data=rounded.code,
                  bias=parts[-1].code, scale="-1.0")  # fmt: skip
        parts.append(residual)
    return parts


def _diagonal(sel: Selector, column: Operand, dtype: str) -> str:
    """diag(column) as a [_P, _P] stationary in `dtype`: the identity scaled per row (one Scalar pass); in
    a span's chain one per head of the range, appended to the tile's list."""
    name = f"{sel.prefix}{len(sel.tiles)}"
    sel.tiles.append((name, "diag", dtype))
    part = sel.layout.part
    diagonal = f"{name}[0:{part}, 0:{part}]"
    alloc = f"nl.ndarray((_P, _P), dtype={NL_DTYPE[dtype]}, buffer=nl.sbuf)"
    scaled = f"op=nl.copy, data={identity_name(dtype)}[0:{part}, 0:{part}]"
    if sel.span is None or not sel.span.open:
        sel.raw(f"{name} = {alloc}", "vec", "")
        sel.raw(f"nisa.activation(dst={diagonal}, {scaled}, scale={sel.at(column.code)})", "vec", "act")
        return diagonal
    sel.span.diagonal(name)
    with sel.block(LOOP, "vec", "act"):
        sel.raw(f"{name}_j = {alloc}", "vec", "act")
        sel.raw(f"nisa.activation(dst={name}_j[0:{part}, 0:{part}], {scaled}, "
                f"scale={sel.at(column.code, ONE)})", "vec", "act")  # fmt: skip
        sel.raw(f"{name}.append({name}_j)", "vec", "act")
    return diagonal


_NL = {"add": "add", "sub": "subtract", "mul": "multiply", "maximum": "maximum", "minimum": "minimum"}


def _alloc(sel: Selector) -> Operand:
    """An fp32 tile in PSUM when it fits the banks, else in SBUF (the `else` branch's form)."""
    name = f"{sel.prefix}{len(sel.tiles)}"
    sel.tiles.append((name, "tile", "f32"))
    alloc = sel.layout.free_alloc
    sel.raw(f"{name} = nl.ndarray((_P, {alloc}), dtype=nl.float32, "
            f"buffer=nl.psum if {alloc} <= {PSUM_COLUMNS} else nl.sbuf)", "tile", "")  # fmt: skip
    sel.register(name, "tile")
    return Operand("tile", f"{name}[0:{sel.layout.part}, 0:{sel.layout.free}]", memory="psum")


def _sub(code: str) -> str:
    """`name[part, a:b]` narrowed to the columns `a + q0 : a + q0 + qw` of the current 512-column chunk."""
    head, columns = code[:-1].rsplit(", ", 1)
    start = columns.split(":", 1)[0].strip()
    lo = "q0" if start == "0" else f"{start} + q0"
    return f"{head}, {lo}:{lo} + qw]"


def identity_name(dtype: str) -> str:
    """The launch-wide identity of a rows' dtype: one per dtype, since a matmul's stationary and moving
    operands share theirs (rows of bf16 and f16 in one kernel need both)."""
    return IDENTITY if dtype == "bf16" else f"{IDENTITY}_{dtype}"


def _identity(sel: Selector, dtype: str) -> str:
    """I as a [_P, _P] tile of the rows' dtype, built once per launch: iota of p - j, compared with 0; its
    name."""
    nl_dtype = {"bf16": "nl.bfloat16", "f16": "nl.float16"}[dtype]
    name = identity_name(dtype)
    lines = [
        "pe_offsets = nl.ndarray((_P, _P), dtype=nl.int32, buffer=nl.sbuf)",
        "nisa.iota(dst=pe_offsets[0:_P, 0:_P], pattern=[[-1, _P]], offset=0, channel_multiplier=1)",
        f"{name} = nl.ndarray((_P, _P), dtype={nl_dtype}, buffer=nl.sbuf)",
        f"nisa.tensor_scalar(dst={name}[0:_P, 0:_P], data=pe_offsets[0:_P, 0:_P], op0=nl.equal, "
        "operand0=0.0)",
    ]
    sel.constants.extend(line for line in lines if line not in sel.constants)
    return name
