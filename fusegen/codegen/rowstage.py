"""Rows-on-partitions stage pieces the matmul families share: a stage's inputs by how the kernel holds
them, its leaves and block loads, the row-wise prologue lowered into K-block passes that end in x^T, and
the PE transposes that build x^T.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fusegen.codegen.blocks import BlockedStage, BlockLoad, BlockSelector, emit_blocked
from fusegen.codegen.budget_base import F_MOV, P
from fusegen.codegen.family import kernel_arg
from fusegen.codegen.select import Layout, Selector
from fusegen.codegen.select_tables import NL_DTYPE
from fusegen.codegen.stage import Expr, Operand, StageBuilder
from fusegen.dsl.ir import DTYPE_BYTES, Dim, KernelIR, Node, OutputDecl


@dataclass(frozen=True)
class OutputWrite:
    """One kernel output: HBM tensor name, nl dtype, the SBUF operand holding it and its shape's source
    (a per-token [R, 1] output is written once per row tile, from a [P, 1] column)."""

    name: str
    nl_dtype: str
    value: Operand
    shape: str = "(R, K)"

    @property
    def source(self) -> str:
        """The access expression the write reads."""
        return self.value.code

    @property
    def tile(self) -> str:
        """The tile (or column) the write reads."""
        return self.value.name

    def line(self) -> str:
        """The DMA writing the current row tile's block of this output (of a per-token output, its column)."""
        return dma_write(self.name, "k0:k0 + nb" if self.shape == "(R, K)" else "0:1", self.source)


def dma_write(dst: str, cols: str, src: str) -> str:
    """The DMA writing `src` into rows r0:r0 + pr, columns `cols` of the HBM tensor `dst`."""
    return f"nisa.dma_copy(dst={dst}[r0:r0 + pr, {cols}], src={src})"


def stage_inputs(ir: KernelIR, ids: tuple[int, ...]) -> list[Node]:
    """The input nodes among `ids`."""
    return [ir.node(i) for i in ids if ir.node(i).op == "input"]


def row_stage_inputs(
    ir: KernelIR, nodes: tuple[int, ...], rows: Dim, width: Dim
) -> dict[str, tuple[str, ...]]:
    """A rows-on-partitions stage's inputs by how the kernel holds them: [width] rows, row tiles, columns."""
    groups: dict[str, list[str]] = {"row": [], "tile": [], "vec": []}
    for node in stage_inputs(ir, nodes):
        if node.shape == (rows, width):
            groups["tile"].append(kernel_arg(str(node.name)))
        elif node.shape[-1] == width:
            groups["row"].append(kernel_arg(str(node.name)))
        else:
            groups["vec"].append(kernel_arg(str(node.name)))
    return {k: tuple(v) for k, v in groups.items()}


def row_leaves(
    ir: KernelIR, nodes: tuple[int, ...], inputs: dict[str, tuple[str, ...]], skip: str | None
) -> tuple[dict[int, Operand], dict[str, BlockLoad]]:
    """Leaf operands of a rows-on-partitions stage over one K-block (rows r0.., columns k0..k0+nb),
    and the block loads that fill them: [R, K] row blocks, [K] vectors broadcast, [R, 1] columns."""
    leaves, loads = {}, {}
    for node in stage_inputs(ir, nodes):
        name = kernel_arg(str(node.name))
        if name in inputs["tile"] and name != skip:
            leaves[node.id] = Operand("tile", f"{name}_tile[0:pr, 0:nb]")
            src = f"{name}[r0:r0 + pr, k0:k0 + nb]"
            loads[f"{name}_tile"] = BlockLoad(f"{name}_tile", src, DTYPE_BYTES[node.dtype], broadcast=False)
        elif name in inputs["row"]:
            leaves[node.id] = Operand("tile", f"{name}_row[0:pr, 0:nb]")
            src = f"{name}.ap(pattern=[[0, pr], [1, nb]], offset=k0)"
            loads[f"{name}_row"] = BlockLoad(f"{name}_row", src, DTYPE_BYTES[node.dtype], broadcast=True)
        elif name in inputs["vec"]:
            leaves[node.id] = Operand("vec", f"{name}_tile[0:pr, 0:1]")
    return leaves, loads


def row_builder(ir: KernelIR, width: Dim, leaves: dict[int, Operand]) -> StageBuilder:
    """A StageBuilder for a rows-on-partitions stage over `width` columns: [R, 1] values are columns."""
    one = Dim.const(1)

    def kind_of(node: Node) -> str:
        return "scalar" if node.shape == () else ("vec" if node.shape[-1] == one else "tile")

    return StageBuilder(ir, leaves, kind_of, free_size=lambda n: width)


def block_selector(prefix: str, tile_engine: str = "") -> BlockSelector:
    """A BlockSelector over one block of `pr` rows and `nb` columns (`tile_engine`: as Selector's)."""
    layout = Layout(part="pr", free="nb", free_alloc="kb")
    return BlockSelector(layout, prefix=prefix, tile_engine=tile_engine)


def lower_prologue(
    ir: KernelIR, x: Node, prologue_nodes: tuple[int, ...], rows: Dim, hidden: Dim
) -> BlockedStage | None:
    """The pre-projection stage on K-blocks of the source's row tiles; each block of its result is cast to
    the weights' dtype and transposed into x^T (a block is F_MOV // P whole K-tiles)."""
    if not prologue_nodes:
        return None
    inputs = row_stage_inputs(ir, prologue_nodes, rows, hidden)
    leaves, loads = row_leaves(ir, prologue_nodes, inputs, skip=None)
    root = row_builder(ir, hidden, leaves).expr(x.id)

    def finish(sel: Selector) -> list[str]:
        result = sel.value(root, dtype=x.dtype)
        if result.dtype != x.dtype or result.memory != "sbuf":
            result = sel.copy(result, "tile", x.dtype)
        return list(transpose_block(result.code.split("[")[0], NL_DTYPE[x.dtype]))

    return emit_blocked(block_selector("p"), [root], loads, finish, writes=F_MOV // P)


def transpose_block(tile: str, nl_dtype: str, alternate: bool = False) -> tuple[str, ...]:
    """Lines transposing K-block `k0` (width `nb`) of row tile `rs`, held in `tile` in the weights' dtype,
    into x^T one K-tile at a time on the PE (through PSUM): a DMA transpose takes 2-byte dtypes and 16-row
    pieces only (../nki-rules: DMA), so the PE serves every dtype. With `alternate` the copies out of PSUM
    alternate between the Vector and the Scalar engine (an exact copy on either), which halves the first
    super-block's wait; the family's budget model must count them so."""
    copy = "    nisa.tensor_copy(dst=xt[kt][0:pk, rs * _P:rs * _P + pr], src=xt_ps[0:pk, 0:pr])"
    copies = (
        ("    if kt % 2:",
         "        nisa.activation(dst=xt[kt][0:pk, rs * _P:rs * _P + pr], op=nl.copy, "
         "data=xt_ps[0:pk, 0:pr])",
         "    else:", "    " + copy)
        if alternate else (copy,)
    )  # fmt: skip
    return (
        "for kt in range(k0 // _P, _cdiv(k0 + nb, _P)):",
        "    pk = min(_P, K - kt * _P)",
        f"    xt_ps = nl.ndarray((_P, _P), dtype={nl_dtype}, buffer=nl.psum)",
        f"    nisa.nc_transpose(dst=xt_ps[0:pk, 0:pr], data={tile}[0:pr, kt * _P - k0:kt * _P - k0 + pk], "
        "engine=nisa.engine.tensor)",
        *copies,
    )


def output_writes(
    outputs: Sequence[OutputDecl], exprs: list[Expr], writes: list[OutputWrite], act_casts: bool = False
) -> Callable[[Selector], list[str]]:
    """The last pass's finish: each output's value in its dtype (collected in `writes`), DMA'd out;
    `act_casts`: a value computed in another dtype is cast on the Scalar engine (`Selector.convert`)."""

    def finish(sel: Selector) -> list[str]:
        for out, expr in zip(outputs, exprs, strict=True):
            if expr.kind == "vec":  # per-token [R, 1]: the f32 column the statistics passes finished
                value = sel.value(expr)
                writes.append(OutputWrite(kernel_arg(out.name), NL_DTYPE[out.dtype], value, "(R, 1)"))
                continue
            # an output nothing else reads is written in its own dtype by the instruction computing it
            value = sel.value(expr, out.dtype if expr.users == 0 else "f32")
            if value.memory == "psum" or (act_casts and value.dtype != out.dtype):  # on the Scalar engine
                value = sel.convert(value, out.dtype)
            elif value.dtype != out.dtype:
                value = sel.copy(value, "tile", out.dtype)
            writes.append(OutputWrite(kernel_arg(out.name), NL_DTYPE[out.dtype], value))
        return [w.line() for w in writes if w.shape == "(R, K)"]

    return finish
