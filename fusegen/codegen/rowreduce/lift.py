"""Lifting a 2-D row-wise spec ([T, H] data: fused add + RMSNorm, LayerNorm, ...) to [T, 1, H].

The row-reduction family lowers [T, G, H] data with the heads G looped. A spec over [T, H] is the same
computation with one head, so instead of a second family it is lifted: every value whose first axis is
the token axis T gets a size-1 head axis after it ([T, H] -> [T, 1, H], a per-row [T] -> [T, 1]),
weights [H] become [1, H] (one head's weight), reductions and indexes shift past the new axis, and a
kept-dim [T, 1] output is read back through `[:, :, 0]`. The host function unsqueezes the lifted inputs
and squeezes the lifted outputs, so users call the kernel with their own shapes.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from fusegen.codegen.family import Mismatch, describe
from fusegen.dsl.ir import AttrValue, Dim, IndexItem, KernelIR, Node, OutputDecl, Shape, TensorDecl

ONE = Dim.const(1)
_AXIS_OPS = frozenset(("sum", "mean", "max"))


@dataclass(frozen=True)
class Lifted:
    """The [T, 1, H] form of a 2-D spec and how the host converts between the two."""

    ir: KernelIR
    flat: KernelIR  # the spec's own IR
    row_inputs: tuple[str, ...]  # [T, ...] inputs: `.unsqueeze(1)` on the way in
    weight_inputs: tuple[str, ...]  # [H] inputs: `.unsqueeze(0)`
    squeezed_outputs: tuple[str, ...]  # outputs that come back with the head axis: `.squeeze(1)`


def lift_rows(ir: KernelIR) -> Lifted | None:
    """The lifted form of a 2-D row-wise spec; None when `ir` is not one (a 3-D input, a matmul)."""
    if any(len(i.shape) > 2 for i in ir.inputs) or any(n.op == "matmul" for n in ir.nodes):
        return None
    data = next((i for i in ir.inputs if len(i.shape) == 2), None)
    if data is None:
        return None
    lift = _Lift(data.shape[0], data.shape[-1])
    nodes = tuple(lift.node(n, ir) for n in ir.nodes)
    extra: list[Node] = []
    outputs = tuple(_output(o, nodes, extra) for o in ir.outputs)
    lifted = dataclasses.replace(
        ir, nodes=nodes + tuple(extra), outputs=outputs, inputs=tuple(lift.decl(i) for i in ir.inputs)
    )
    squeezed = tuple(o.name for o, new in zip(ir.outputs, outputs, strict=True) if new.shape != o.shape)
    return Lifted(
        lifted,
        ir,
        row_inputs=tuple(i.name for i in ir.inputs if lift.is_row(i.shape)),
        weight_inputs=tuple(i.name for i in ir.inputs if lift.is_weight(i.shape)),
        squeezed_outputs=squeezed,
    )


#: The value a `leave()` reason ends with: (`name` is f32[T, 1, H]).
_DESCRIBED = re.compile(r"\(`([^`]+)` is \w+\[[^\]]*\]\)$")


def as_written(miss: Mismatch, lifted: Lifted) -> Mismatch:
    """`miss`, found on the lifted IR, told in the spec's own terms: the value with the shape the spec gives
    it (a [T] value is not a [T, 1] one), and the lifting named where the reason speaks of heads."""
    reason = miss.reason
    found = _DESCRIBED.search(reason)
    same = [n for n in lifted.flat.nodes if found and n.span == miss.span and (n.name or n.op) == found[1]]
    if found and same:
        reason = f"{reason[: found.start()]}({describe(same[0])})"
    if "[T, G" in reason:
        reason += "; a spec over [T, H] data is read as [T, 1, H] (one head)"
    return dataclasses.replace(miss, reason=reason)


@dataclass(frozen=True)
class _Lift:
    """The shape rule: token-axis values gain a head axis, width-only weights a leading one."""

    rows: Dim
    width: Dim

    def is_row(self, shape: Shape) -> bool:
        return len(shape) >= 1 and shape[0] == self.rows

    def is_weight(self, shape: Shape) -> bool:
        return shape == (self.width,) and self.width != self.rows

    def shape(self, shape: Shape) -> Shape:
        if self.is_row(shape):
            return (shape[0], ONE, *shape[1:])
        return (ONE, *shape) if self.is_weight(shape) else shape

    def decl(self, decl: TensorDecl) -> TensorDecl:
        return dataclasses.replace(decl, shape=self.shape(decl.shape))

    def node(self, node: Node, ir: KernelIR) -> Node:
        """`node` with its shape lifted and its axis / index attributes moved past the head axis."""
        operand = ir.node(node.args[0]) if node.args else None
        attrs = node.attrs
        if operand is not None and self.is_row(operand.shape):
            if node.op in _AXIS_OPS and int(node.attr("axis")) >= 1:  # type: ignore[arg-type]
                attrs = _with(attrs, "axis", int(node.attr("axis")) + 1)  # type: ignore[arg-type]
            if node.op in ("index", "unindex"):  # unindex: a spec's `s[:, None]`
                items: tuple[IndexItem, ...] = node.attr("index")  # type: ignore[assignment]
                attrs = _with(attrs, "index", (items[0], IndexItem("slice", Dim.const(0), ONE), *items[1:]))
        return dataclasses.replace(node, shape=self.shape(node.shape), attrs=attrs)


Attrs = tuple[tuple[str, AttrValue], ...]


def _with(attrs: Attrs, key: str, value: AttrValue) -> Attrs:
    return tuple((k, value if k == key else v) for k, v in attrs)


def _output(out: OutputDecl, nodes: tuple[Node, ...], extra: list[Node]) -> OutputDecl:
    """The output over the lifted graph: [T, 1] stays [T, 1] through a `[:, :, 0]` index of [T, 1, 1]."""
    node = nodes[out.node]
    if len(node.shape) == 3 and out.shape == (node.shape[0], ONE) and node.shape == (node.shape[0], ONE, ONE):
        items = (IndexItem("slice", Dim.const(0), node.shape[0]), IndexItem("slice", Dim.const(0), ONE),
                 IndexItem("at", Dim.const(0)))  # fmt: skip
        drop = dataclasses.replace(
            node, id=len(nodes) + len(extra), op="index", args=(node.id,), attrs=(("index", items),),
            shape=out.shape, name=None,
        )  # fmt: skip
        extra.append(drop)
        return dataclasses.replace(out, node=drop.id)
    return dataclasses.replace(out, shape=node.shape)
