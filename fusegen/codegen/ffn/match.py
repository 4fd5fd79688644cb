"""The FFN family's matcher: projections of one input over K, an elementwise combine, a down-projection
back to K, then an elementwise / row-wise epilogue. Matches IR structure only, never names.
"""

from __future__ import annotations

from dataclasses import dataclass

from fusegen.codegen.family import SCALAR_LEAVES, Mismatch, leave, shape_is
from fusegen.codegen.fp8 import weight_dtype_fits
from fusegen.codegen.matmul_match import ROW_WISE, epilogue_shapes, row_prologue, stage_nodes, weight_columns
from fusegen.dsl.ir import FP8_DTYPES, Dim, KernelIR, Node

FAMILY = "ffn"


@dataclass(frozen=True)
class FfnMatch:
    """The matched structure: which nodes play which role."""

    x: Node  # the projected operand: an input [R, K], or the prologue's cast of one
    source: Node  # the [R, K] input whose rows the kernel reads (x itself without a prologue)
    prologue_nodes: tuple[int, ...]  # nodes computing x from source, topological; () without a prologue
    ups: tuple[Node, ...]  # x @ W, one (plain MLP) or two (gated)
    down: Node  # combine @ W2
    combine: Node  # the down-projection's left operand
    rows: Dim
    hidden: Dim
    inter: Dim
    mid_nodes: tuple[int, ...]  # nodes of the combine, topological
    epi_nodes: tuple[int, ...]  # nodes after the down-projection, topological


def match_ffn(ir: KernelIR) -> FfnMatch:
    """The FFN roles of `ir`'s nodes, or raise Mismatch at the first node that does not fit."""
    matmuls = [n for n in ir.nodes if n.op == "matmul"]
    if not matmuls:
        reason = "there is no matmul (`@`) to project with"
        raise Mismatch(FAMILY, ir.outputs[0].span, reason, relevant=False)
    down = matmuls[-1]
    ups = tuple(matmuls[:-1])
    if not ups:
        reason = "an FFN projects up, then down: one or two projections of the input, then a down-projection"
        raise leave(FAMILY, down, f"{reason}; this is the only matmul")
    if len(ups) > 2:
        raise leave(FAMILY, ups[2], "expected one or two projections of the input, then a down-projection")
    x, hidden, inter, rows = _check_ups(ir, ups)
    source, prologue = row_prologue(FAMILY, ir, x, rows, hidden)
    weight = ir.node(down.args[1])
    if weight.op != "input" or not shape_is(weight.shape, (inter, hidden)):
        raise leave(FAMILY, weight, f"the down-projection's weight must be an input [{inter}, {hidden}]")
    combine = ir.node(down.args[0])
    if combine.dtype != x.dtype or not weight_dtype_fits(weight.dtype, x.dtype):
        where = combine if combine.dtype != x.dtype else weight
        raise leave(FAMILY, where, f"the down-projection must be {x.dtype} @ {x.dtype} (or an fp8 weight)")
    mid = stage_nodes(FAMILY, ir, combine, stops={u.id for u in ups}, what="combine")
    for up in ups:
        if up.id not in mid:
            raise leave(FAMILY, up, "every projection must feed the combine")
    _check_mid(ir, mid, rows, inter)
    epi = _epilogue(ir, down, rows, hidden)
    return FfnMatch(
        x, source, prologue, ups, down, combine, rows, hidden, inter, tuple(sorted(mid)), tuple(sorted(epi))
    )


def _check_ups(ir: KernelIR, ups: tuple[Node, ...]) -> tuple[Node, Dim, Dim, Dim]:
    x = ir.node(ups[0].args[0])
    if x.op not in ("input", "cast") or len(x.shape) != 2:
        raise leave(
            FAMILY, x, "the projected operand must be a 2-D input [R, K], or a cast of a row-wise prologue"
        )
    if x.dtype in FP8_DTYPES:
        raise leave(FAMILY, x, "the projected operand must be bf16, f16 or f32 (fp8 is for the weights)")
    rows, hidden = x.shape
    inter = ir.node(ups[0].args[1]).shape[-1]
    for up in ups:
        lhs, weight = ir.node(up.args[0]), ir.node(up.args[1])
        if lhs.id != x.id:
            raise leave(FAMILY, lhs, f"every projection must multiply the same operand `{x.name or x.op}`")
        if weight_columns(ir, weight) is None or not shape_is(weight.shape, (hidden, inter)):
            raise leave(
                FAMILY, weight, f"a projection weight must be an input [{hidden}, {inter}] or columns of one"
            )
        if weight.dtype != ir.node(ups[0].args[1]).dtype or not weight_dtype_fits(weight.dtype, x.dtype):
            raise leave(FAMILY, weight, f"projection weights must share one dtype: {x.dtype}, or an fp8 one")
    return x, hidden, inter, rows


def _check_mid(ir: KernelIR, mid: set[int], rows: Dim, inter: Dim) -> None:
    for nid in sorted(mid):
        node = ir.node(nid)
        if node.op in ROW_WISE:
            raise leave(FAMILY, node, "the combine must be elementwise (the intermediate is never whole)")
        if node.op == "input" and not shape_is(node.shape, (inter,), (Dim.const(1), inter)):
            raise leave(
                FAMILY, node, f"the combine may read only the projections, [{inter}] vectors and scalars"
            )
        if node.op not in SCALAR_LEAVES and node.op != "input" and node.shape not in ((rows, inter), ()):
            raise leave(FAMILY, node, f"values in the combine must be [{rows}, {inter}]")


def _epilogue(ir: KernelIR, down: Node, rows: Dim, hidden: Dim) -> set[int]:
    epi: set[int] = set()
    for out in ir.outputs:
        root = ir.node(out.node)
        if out.optional:
            raise Mismatch(FAMILY, out.span, "optional outputs are not supported by the ffn family")
        nodes = stage_nodes(FAMILY, ir, root, stops={down.id}, what="epilogue")
        if down.id not in nodes:
            raise Mismatch(FAMILY, out.span, "every output must be computed from the down-projection")
        epi |= nodes
    one = Dim.const(1)
    for nid in sorted(epi):
        node = ir.node(nid)
        if node.op == "input" and not shape_is(
            node.shape, (hidden,), (one, hidden), (rows, hidden), (rows, one)
        ):
            raise leave(
                FAMILY, node, f"the epilogue may read [{rows}, {hidden}], [{hidden}] or [{rows}, 1] inputs"
            )
        if node.op in ("sum", "mean", "max") and (node.attr("axis") != 1 or not node.attr("keepdim")):
            raise leave(FAMILY, node, "epilogue reductions must be over the last axis with keepdim=true")
        if (
            node.op not in SCALAR_LEAVES
            and node.op != "input"
            and node.shape not in epilogue_shapes(rows, hidden)
        ):
            raise leave(
                FAMILY, node, f"values in the epilogue must be [{rows}, {hidden}], [{hidden}] or [{rows}, 1]"
            )
    for out in ir.outputs:
        if out.shape not in ((rows, hidden), (rows, one)):
            reason = f"ffn outputs must be [{rows}, {hidden}] or per-token [{rows}, 1]"
            raise Mismatch(FAMILY, out.span, reason)
    return epi
