"""The row-reduction weight prep: weight rows broadcast over partitions by a ones-matmul per 512-column
chunk and combined in fp32 into width-long prepared tiles, once per launch (or per token tile and head)."""

from __future__ import annotations

from collections.abc import Callable

from fusegen.codegen.engines import GPSIMD
from fusegen.codegen.family import kernel_arg
from fusegen.codegen.rowreduce.loads import Load
from fusegen.codegen.rowreduce.match import RowReduceMatch
from fusegen.codegen.select import Layout, Selector
from fusegen.codegen.select_tables import NL_DTYPE
from fusegen.codegen.stage import Operand, StageBuilder
from fusegen.dsl.ir import KernelIR, Node


def root_copies(prep: Selector, resident: dict[int, str], on_scalar: bool) -> list[tuple[str, str]]:
    """(prepared root's chunk access, the copy instruction's format) per root: on the engine that computed
    the root (no hand-off between the engines per chunk), and a root still in PSUM (a broadcast weight) on
    the Scalar engine when `on_scalar`."""
    copies = []
    for code in resident.values():
        writer = prep.writers.get(code.split("[")[0], "act" if on_scalar else "dve")
        copies.append((code, _ACT_COPY if writer == "act" else _DVE_COPY))
    return copies


_ACT_COPY = "nisa.activation(dst={dst}, op=nl.copy, data={src})"
_DVE_COPY = "nisa.tensor_copy(dst={dst}, src={src})"


def prepare_body(loads: tuple[Load, ...], lines: list[str], roots: list[tuple[str, str]], width: str
                  ) -> tuple[str, ...]:  # fmt: skip
    """Head h's prepared weights: per 512-column PSUM chunk, each weight row's chunk DMA'd into one
    partition and broadcast to all partitions by a ones-matmul (1.0 * w is exact in PSUM; a stride-0 DMA
    would read the row from HBM once per partition), the prep lines, each root copied into an fp32 tile.
    Only the chunk of a weight row is in SBUF at a time, so the prep never holds more than the prepared
    weights themselves."""
    dtypes = sorted({ld.nl_dtype for ld in loads})
    body = [f"ones_{_short(dt)} = nl.ndarray((1, _P), dtype={dt}, buffer=nl.sbuf)" for dt in dtypes]
    # on the idle GpSimd engine: in the Vector queue each head's memset waited for the previous head's prep
    body += [f"nisa.memset(dst=ones_{_short(dt)}[0:1, 0:_P], value=1.0, engine={GPSIMD})" for dt in dtypes]
    names = [prep_name(i) for i in range(len(roots))]
    body += [f"{r} = nl.ndarray((_P, {width}), dtype=nl.float32, buffer=nl.sbuf)" for r in names]
    body.append(f"for q0 in range(0, {width}, _F_MOV):")
    chunk = [f"qw = min(_F_MOV, {width} - q0)"]
    for ld in loads:
        chunk.append(f"{_row(ld)} = nl.ndarray((1, _F_MOV), dtype={ld.nl_dtype}, buffer=nl.sbuf)")
        chunk.append(f"nisa.dma_copy(dst={_row(ld)}[0:1, 0:qw], src={ld.source})")
    for ld in loads:
        ones = f"ones_{_short(ld.nl_dtype)}[0:1, 0:_P]"
        chunk.append(f"{ld.tile} = nl.ndarray((_P, _F_MOV), dtype=nl.float32, buffer=nl.psum)")
        chunk.append(f"nisa.nc_matmul(dst={ld.tile}[0:_P, 0:qw], stationary={ones}, "
                     f"moving={_row(ld)}[0:1, 0:qw], accumulate=False)")  # fmt: skip
    chunk += lines
    copies = zip(names, roots, strict=True)
    chunk += [copy.format(dst=f"{r}[0:_P, q0:q0 + qw]", src=code) for r, (code, copy) in copies
              if code != f"{r}[0:_P, q0:q0 + qw]"]  # a root written in place needs no copy
    body += ["    " + line for line in chunk]
    body.append(f"return ({', '.join(names)},)")
    return tuple(body)


def _row(load: Load) -> str:
    return load.tile.removesuffix("_bc") + "_row"


def _short(nl_dtype: str) -> str:
    return nl_dtype.removeprefix("nl.")


def row_kind(m: RowReduceMatch) -> Callable[[Node], str]:
    """A node's kind in a stage: a width-long tile, a per-row [P, 1] column, or a trace-time scalar."""

    def kind_of(node: Node) -> str:
        if node.shape == ():
            return "scalar"
        return "vec" if node.shape[-1] != m.width else "tile"

    return kind_of


def lower_prep(
    ir: KernelIR, m: RowReduceMatch, width: str, on_scalar: bool = False
) -> tuple[Selector, tuple[Load, ...], dict[int, str]]:
    """Weight rows and the prep nodes over one 512-column chunk; root id -> the access holding it (PSUM
    operands evicted by the Scalar engine when `on_scalar`)."""
    leaves, loads = {}, []
    for w in m.weights:
        tile = f"{w.name}_bc"  # the row broadcast over partitions, in PSUM
        offset = f"h * {width}" if len(w.shape) == 2 and w.shape[0] == m.heads else "0"
        source = f"{kernel_arg(str(w.name))}.ap(pattern=[[{width}, 1], [1, qw]], offset={offset} + q0)"
        loads.append(Load(tile, NL_DTYPE[w.dtype], source))
        leaves[w.id] = Operand("tile", f"{tile}[0:_P, 0:qw]", memory="psum")
    builder = StageBuilder(ir, leaves, row_kind(m), free_size=lambda n: m.width)
    sel = Selector(Layout(part="_P", free="qw", free_alloc="_F_MOV"), prefix="w", evict_on_scalar=on_scalar)
    # each root written straight into its chunk of the prepared tile where its last step can (else copied)
    exprs = {root: builder.expr(root) for root in m.prep_roots}
    sel.into = {id(e): Operand("tile", f"{prep_name(i)}[0:_P, q0:q0 + qw]")
                for i, e in enumerate(exprs.values())}  # fmt: skip
    resident = {root: sel.value(e).code for root, e in exprs.items()}
    return sel, tuple(loads), resident


def prep_name(i: int) -> str:
    """The i-th prepared weight's width-long tile in `prepare_weights`."""
    return f"prep{i}"
