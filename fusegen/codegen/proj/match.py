"""The projection family's matcher: one or more matmuls of one operand (an input [R, K], or a row-wise
prologue of one), each an output width N of its own, then an elementwise epilogue per projection.
Matches IR structure only, never names.
"""

from __future__ import annotations

from dataclasses import dataclass

from fusegen.codegen.family import SCALAR_LEAVES, Mismatch, leave, shape_is
from fusegen.codegen.fp8 import weight_dtype_fits
from fusegen.codegen.matmul_match import epilogue_shapes, row_prologue, stage_nodes, weight_columns
from fusegen.dsl.ir import Dim, KernelIR, Node

FAMILY = "proj"
#: Row statistics need a whole output row; the projection streams its outputs in column blocks.
STATISTICS = frozenset(("sum", "mean", "max", "layernorm", "rmsnorm"))
STATISTIC_REASON = (
    "a row statistic of a projection's output (a norm, or a per-token amax / scale [R, 1]) cannot be "
    "taken: the proj family streams each output in column blocks and never holds a whole row; normalise "
    "before the projection, or return the output and take the statistic in a row-wise kernel (per-token "
    "quantisation of an FFN's output is fused: examples/swiglu_fp8_quant.spec)"
)


@dataclass(frozen=True)
class Projection:
    """One matmul of the shared operand: its weight input (or columns of one), width and epilogue."""

    matmul: Node
    weight: Node  # the input the weight's columns come from
    first: Dim  # its first column (0 for a whole input)
    width: Dim  # N: the output columns
    outputs: tuple[int, ...]  # indices into ir.outputs computed from this matmul
    epi_nodes: tuple[int, ...]  # nodes after the matmul, topological


@dataclass(frozen=True)
class ProjMatch:
    """The matched structure: the projected operand, its source and prologue, the projections."""

    x: Node  # the matmuls' left operand: an input [R, K], or the prologue's cast of one
    source: Node  # the [R, K] input the kernel reads
    prologue_nodes: tuple[int, ...]
    projections: tuple[Projection, ...]
    rows: Dim
    hidden: Dim


def match_proj(ir: KernelIR) -> ProjMatch:
    """The projection roles of `ir`'s nodes, or raise Mismatch at the first node that does not fit."""
    matmuls = [n for n in ir.nodes if n.op == "matmul"]
    if not matmuls:
        reason = "there is no matmul (`@`) to project with"
        raise Mismatch(FAMILY, ir.outputs[0].span, reason, relevant=False)
    x = ir.node(matmuls[0].args[0])
    if x.op not in ("input", "cast") or len(x.shape) != 2:
        raise leave(
            FAMILY, x, "the projected operand must be a 2-D input [R, K], or a cast of a row-wise prologue"
        )
    rows, hidden = x.shape
    for mm in matmuls:
        if mm.args[0] != x.id:
            # a matmul of a matmul's result is the ffn family's structure, not a projection of one operand
            chained = any(n.op == "matmul" for n in _upstream(ir, mm.args[0]))
            reason = (f"every matmul must multiply the same operand `{x.name or x.op}` (one projection of "
                      "one input; a matmul of a matmul's result is the ffn family's)")  # fmt: skip
            miss = leave(FAMILY, mm, reason)
            raise Mismatch(FAMILY, miss.span, miss.reason, relevant=not chained)
    source, prologue = row_prologue(FAMILY, ir, x, rows, hidden)
    owners = _owners(ir, matmuls)
    projections = tuple(_projection(ir, mm, x, owners, rows) for mm in matmuls)
    return ProjMatch(x, source, prologue, projections, rows, hidden)


def _upstream(ir: KernelIR, nid: int) -> list[Node]:
    """The nodes `nid` is computed from, itself included."""
    seen: dict[int, Node] = {}
    todo = [nid]
    while todo:
        node = ir.node(todo.pop())
        if node.id not in seen:
            seen[node.id] = node
            todo.extend(node.args)
    return list(seen.values())


def _owners(ir: KernelIR, matmuls: list[Node]) -> dict[int, int]:
    """Each output's matmul: the one its value is computed from (exactly one)."""
    ids = {mm.id for mm in matmuls}
    owners = {}
    for index, out in enumerate(ir.outputs):
        if out.optional:
            raise Mismatch(FAMILY, out.span, "optional outputs are not supported by the proj family")
        nodes = stage_nodes(FAMILY, ir, ir.node(out.node), stops=ids, what="epilogue")
        used = sorted(ids & nodes)
        if len(used) != 1:
            raise Mismatch(FAMILY, out.span, "every output must be computed from exactly one projection "
                           f"(this one reads {len(used)})")  # fmt: skip
        owners[index] = used[0]
    return owners


def _projection(ir: KernelIR, mm: Node, x: Node, owners: dict[int, int], rows: Dim) -> Projection:
    weight = ir.node(mm.args[1])
    columns = weight_columns(ir, weight)
    hidden, width = weight.shape
    if columns is None or len(weight.shape) != 2:
        raise leave(FAMILY, weight, f"a projection weight must be an input [{hidden}, N] or columns of one")
    if not weight_dtype_fits(weight.dtype, x.dtype):
        raise leave(FAMILY, weight, f"a projection weight must be {x.dtype} (the projected operand's dtype) "
                    "or, beside a bf16/f16 operand, fp8 (scale its product in the epilogue)")  # fmt: skip
    outputs = tuple(i for i, owner in owners.items() if owner == mm.id)
    if not outputs:
        raise leave(FAMILY, mm, "every projection must feed an output")
    epi: set[int] = set()
    for i in outputs:
        epi |= stage_nodes(FAMILY, ir, ir.node(ir.outputs[i].node), stops={mm.id}, what="epilogue")
    _check_epilogue(ir, epi, outputs, rows, width)
    return Projection(mm, columns[0], columns[1], width, outputs, tuple(sorted(epi)))


def _check_epilogue(ir: KernelIR, epi: set[int], outputs: tuple[int, ...], rows: Dim, width: Dim) -> None:
    one = Dim.const(1)
    for nid in sorted(epi):
        node = ir.node(nid)
        if node.op in STATISTICS:
            raise leave(FAMILY, node, STATISTIC_REASON)
        if node.op == "input" and not shape_is(
            node.shape, (width,), (one, width), (rows, width), (rows, one)
        ):
            raise leave(
                FAMILY, node, f"the epilogue may read [{rows}, {width}], [{width}] or [{rows}, 1] inputs"
            )
        if (
            node.op not in SCALAR_LEAVES
            and node.op != "input"
            and node.shape not in epilogue_shapes(rows, width)
        ):
            raise leave(
                FAMILY, node, f"values in the epilogue must be [{rows}, {width}], [{width}] or [{rows}, 1]"
            )
    for i in outputs:
        out = ir.outputs[i]
        if out.shape != (rows, width):
            raise Mismatch(FAMILY, out.span, f"proj outputs must be [{rows}, {width}], one row per input row")
