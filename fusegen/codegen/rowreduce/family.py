"""The row-reduction family: match, lower, plan and render a spec into kernel.py (beyond the shared files)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from fusegen.codegen.family import KernelBackward, Mismatch, kernel_arg
from fusegen.codegen.files.reference import dim_bindings
from fusegen.codegen.files.render import header, private_repr, render, vendored
from fusegen.codegen.files.signature import Returned, door_lines, door_source, signature
from fusegen.codegen.plan import TilePlan
from fusegen.codegen.rewrites import expand_norms, rewrite
from fusegen.codegen.rowreduce import budget as rb
from fusegen.codegen.rowreduce.lift import Lifted, as_written, lift_rows
from fusegen.codegen.rowreduce.lower import RowReduceLowering, lower_rowreduce
from fusegen.codegen.rowreduce.match import RowReduceMatch, match_rowreduce
from fusegen.codegen.rowreduce.pipeline import head_helpers, rows_helper
from fusegen.codegen.rowreduce.rowplan import plan_rowreduce
from fusegen.codegen.rowreduce.stream import with_streamed
from fusegen.codegen.rowreduce.tile_math import tiled
from fusegen.codegen.select_tables import NL_DTYPE
from fusegen.codegen.stage import dim_source
from fusegen.dsl.ir import Dim, KernelIR, OutputDecl, Shape
from fusegen.sim.targets import TARGETS, get_target

TEMPLATE = "rowreduce_kernel.py.jinja"
PROLOGUE = "rowreduce_prologue.py.jinja"


@dataclass(frozen=True)
class HostSignature:
    """Pieces of the host functions' source, decided here and formatted by the template."""

    params: str
    returns: str
    width: str  # source of H in the host, e.g. `x.shape[-1]`
    heads: str
    lift_lines: tuple[str, ...]  # a 2-D spec's inputs viewed as [T, 1, H] (row_body)
    prep_lift_lines: tuple[str, ...]
    launch_args: str
    doc: str
    prep_name: str
    prep_params: str  # the weights, e.g. `w_h: torch.Tensor, w_e: torch.Tensor`
    prep_args: str
    prep_kernel_args: str
    prep_dims: tuple[str, ...]
    prep_outputs: tuple[str, ...]
    prep_heads: str  # heads the weight prep builds: the weights' head axis, or 1 if every head shares them
    save_arg: str  # `save`, or `False` when the spec has no optional output
    kernel_returns: str
    saved_returns: str  # every output, when saving ("" without optional outputs)
    door: tuple[str, ...]  # argument checks (signature.py), then an empty call's early return
    prep_door: tuple[str, ...]  # the same for the weight-prep host


@dataclass(frozen=True)
class RowReduceFamily:
    """Per-row reductions over the last axis, per-row scalar math, an elementwise combine with broadcast."""

    name: str = "rowreduce"
    trainable: bool = True
    summary: str = ("[T, G, H] data (or [T, H], as one head): last-axis reductions (chunked passes) -> "
                    "per-row scalar math -> elementwise combine; weights without the token axis prepared "
                    "once; norms spelled out as their reductions")  # fmt: skip
    hooks: tuple[str, ...] = (
        "prep: weights broadcast over partitions and combined in fp32 once per launch (e.g. w_h * w_e)",
        "reduction passes: activation_reduce / tensor_reduce per chunk, folded into [P, 1] accumulators",
        "epilogue: per-row scalar math on [P, 1] columns, the full-width combine, [T, G] outputs staged",
    )

    planning: str = (
        "The planner keeps the prepared weights of every head resident when they fit the SBUF budget "
        "(else it rebuilds one head's per token tile), then takes the fewest reduction chunks, each the "
        "narrowest multiple of 128 for that count, with whole rows kept in SBUF so each input byte crosses "
        "HBM once. Where whole rows do not fit even in 128-column chunks, it streams them: every reduction "
        "pass reads its chunks of the row inputs from HBM, and the epilogue reads each chunk again and "
        "stores its output chunk, in the widest chunks that fit; only one head's prepared weights stay "
        "width-long."
    )

    def match(self, ir: KernelIR) -> RowReduceMatch:
        """The row-reduction roles in `row_body(ir)` (raises Mismatch)."""
        matmul = next((n for n in ir.nodes if n.op == "matmul"), None)
        if matmul is not None:
            reason = (
                "`@` is not row-wise math: the family takes elementwise math and row reductions over "
                "[T, H] or [T, G, H] data"
            )
            raise Mismatch(self.name, matmul.span, reason, relevant=False)
        body, lifted = row_body(ir)
        try:
            m = match_rowreduce(body)
        except Mismatch as miss:
            raise (as_written(miss, lifted) if lifted else miss) from None
        span = m.backward_only(body)
        if span is not None:
            raise Mismatch(self.name, span, "sums over heads or tokens and packed outputs are carried only "
                           "by the row-reduction backward kernel")  # fmt: skip
        return m

    def plans(self, ir: KernelIR, m: RowReduceMatch, target: str, lnc: int) -> list[TilePlan]:
        """One plan per `check` shape."""
        body, lifted = row_body(ir)
        low, _, _ = lowerings(body, m, lifted)
        return [plan_rowreduce(body, m, low, get_target(target), lnc, {**ir.fixed_dims(), **c.env()})
                for c in ir.checks]  # fmt: skip

    def candidates(self, ir: KernelIR, m: RowReduceMatch, dims: dict[str, int], target: str, lnc: int,
                   count: int) -> list[TilePlan]:  # fmt: skip
        """None: the row planner takes the widest chunks that fit, it does not rank plans."""
        return []

    def kernel_source(self, ir: KernelIR, m: RowReduceMatch, target: str, lnc: int) -> str:
        """kernel.py: the NKI kernel and its prep kernel, the vendored planner, the host functions."""
        body, lifted = row_body(ir)
        low, tile, streamed = lowerings(body, m, lifted)
        flat = {o.name: o.shape for o in (lifted.flat if lifted else body).outputs}
        host = _host(body, m, lifted, ir)
        prologue = dict(low=low, host=host, model=private_repr(low.model), budget_source=vendored(rb),
                        sbuf_budgets=repr({name: t.sbuf_usable_bytes for name, t in sorted(TARGETS.items())}),
                        default_target=target, default_lnc=lnc)  # fmt: skip
        staging = [c.staging for c in low.required_columns + low.optional_columns]
        staging += [ld.tile for ld in low.passes.column_loads]  # column inputs: also set per token tile
        varying = ("prepared", *(ld.tile for ld in low.passes.shared_loads), *staging)
        module = render(PROLOGUE, **prologue)
        rows = rows_helper((low, tile), module) if tile else None  # their loads and passes written once
        helpers = head_helpers(low, varying, module, rows)
        per_tile = [line.split(" = ")[0] for line in tile.tile_allocs] if tile else []  # like the staging
        tile_helpers = head_helpers(tile, (*varying, *per_tile), module, rows) if tile else None
        stream_helpers = head_helpers(streamed, ("prepared", *staging), module)
        return render(
            TEMPLATE, **prologue,
            header=header(ir, TEMPLATE), name=ir.name, doc=kernel_doc(ir), helpers=helpers,
            stream=streamed, stream_helpers=stream_helpers, tile=tile, tile_helpers=tile_helpers, rows=rows,
            kernel_args=kernel_args(body), door_source=door_source(_signatures(ir, body, m)),
            dim_bindings=[f"d_{d} = {src}" for d, src in dim_bindings(body, kernel_arg)],
            outputs=[(_allocation(o.name, lifted), NL_DTYPE[o.dtype], _shape(flat[o.name]), _guard(o))
                     for o in body.outputs],
            output_views=[_output_view(o, lifted) for o in body.outputs
                          if lifted and o.name in lifted.squeezed_outputs],
        )  # fmt: skip

    def backward(self, ir: KernelIR, target: str, lnc: int) -> KernelBackward | None:
        """backward_kernel.py and its plan, where the family's matcher carries the backward IR (None for,
        e.g., an [H] weight whose gradient sums over tokens and heads: its backward stays torch code)."""
        from fusegen.codegen.rowreduce.backward_render import backward_files, kernel_backward_ir  # imports us

        back = kernel_backward_ir(ir)
        try:
            return KernelBackward(back, tuple(sorted(backward_files(back, target, lnc).items())))
        except Mismatch:
            return None


ROWREDUCE = RowReduceFamily()


def lowerings(body: KernelIR, m: RowReduceMatch, lifted: Lifted | None
              ) -> tuple[RowReduceLowering, RowReduceLowering | None, RowReduceLowering]:  # fmt: skip
    """(whole-row lowering, its per-tile variant or None, streamed lowering) of `body`, all with one SBUF
    model: with a heads axis of the spec's own, token tiles whose heads fit SBUF together run their per-row
    math once (tile_math.py); the others, and the last tile, run it per head, with the same epilogue."""
    low, streamed = with_streamed(body, m, lower_rowreduce(body, m))
    head, tile = tiled(body, m, low) if lifted is None else (low, None)
    if tile is None:
        return low, None, streamed
    return head, tile, dataclasses.replace(streamed, model=tile.model)


def row_body(ir: KernelIR) -> tuple[KernelIR, Lifted | None]:
    """What the family lowers: a 2-D spec lifted to [T, 1, H] (lift.py), norms spelled out as reductions."""
    lifted = lift_rows(ir)
    return rewrite(expand_norms(lifted.ir if lifted else ir)), lifted


def _allocation(output: str, lifted: Lifted | None) -> str:
    """The kernel's name for an output's HBM tensor: a lifted output is allocated flat, written via a view."""
    flat = lifted is not None and output in lifted.squeezed_outputs
    return kernel_arg(output) + ("_flat" if flat else "")


def _output_view(out: OutputDecl, lifted: Lifted | None) -> str:
    """The lifted [T, 1, H] view the kernel writes a flat output through."""
    view = f"{_allocation(out.name, lifted)}.reshape(({_shape(out.shape)}))"
    return f"{kernel_arg(out.name)} = {view}{_guard(out)}"


def _guard(out: OutputDecl) -> str:
    return " if save else None" if out.optional else ""


def _shape(shape: Shape) -> str:
    """The items of a shape tuple's source (`d_T,` for one dim)."""
    return ", ".join(dim_source(d) for d in shape) + ("," if len(shape) == 1 else "")


def _lift_lines(ir: KernelIR, lifted: Lifted | None, names: list[str]) -> tuple[str, ...]:
    """Kernel lines viewing the spec's 2-D inputs among `names` in the lifted shapes ([T, H] as [T, 1, H])."""
    if lifted is None:
        return ()
    lines = []
    for decl in lifted.flat.inputs:
        arg = kernel_arg(decl.name)
        dims = [f"{arg}.shape[{axis}]" for axis in range(len(decl.shape))]
        if decl.name in names and decl.name in lifted.row_inputs:
            lines.append(f"{arg} = {arg}.reshape(({', '.join([dims[0], '1', *dims[1:]])}))")
        elif decl.name in names and decl.name in lifted.weight_inputs:
            lines.append(f"{arg} = {arg}.reshape((1, {dims[0]}))")
    return tuple(lines)


FORWARD_DOC = "a row-reduction NKI kernel; reference.py spells out the math"


def kernel_doc(ir: KernelIR, what: str = FORWARD_DOC) -> str:
    """A generated kernel file's docstring: its signature and what it is."""
    outs = ", ".join(o.name for o in ir.outputs)
    ins = ", ".join(i.name for i in ir.inputs)
    return f"{ir.name}: ({ins}) -> ({outs}), {what}."


def kernel_args(ir: KernelIR) -> list[str]:
    """The NKI kernel's parameters: every input's HBM tensor, then the params."""
    return [kernel_arg(i.name) for i in ir.inputs] + [f"{p.name}_arg" for p in ir.params]


def host_params(ir: KernelIR) -> list[str]:
    """A host function's typed parameters: the input tensors, then the params with their defaults."""
    tensors = [f"{i.name}: torch.Tensor" for i in ir.inputs]
    return tensors + [f"{p.name}: float = {p.default!r}" for p in ir.params]


def prep_dims(ir: KernelIR, weights: list[str]) -> tuple[str, ...]:
    """Dim bindings of the weight prep, which sees only the weights."""
    prep_ir = dataclasses.replace(ir, inputs=tuple(i for i in ir.inputs if i.name in weights))
    return tuple(f"d_{d} = {src}" for d, src in dim_bindings(prep_ir, kernel_arg))


def _signatures(flat: KernelIR, body: KernelIR, m: RowReduceMatch) -> list[tuple[str, str]]:
    """The hosts' signatures: the kernel's over the spec's own shapes, the weight prep's over the weights."""
    outputs = [Returned(o.name, o.dtype, o.shape, o.optional) for o in flat.outputs]
    sigs = [("_SIGNATURE", signature(flat.name, flat, outputs))]
    if m.prep_roots:
        shape = (_prep_heads(body, m), m.width)
        prep = [Returned(f"prep{i}", "f32", shape) for i in range(len(m.prep_roots))]
        sigs.append(("_PREP_SIGNATURE", signature("fused_weight", _prep_ir(flat, m), prep)))
    return sigs


def _prep_heads(ir: KernelIR, m: RowReduceMatch) -> Dim:
    """The weight prep's head count: the weights' head axis where they have one (the prep sees no data)."""
    return m.heads if any(m.heads in w.shape for w in m.weights) else Dim.const(1)


def _prep_ir(ir: KernelIR, m: RowReduceMatch) -> KernelIR:
    """The weight prep's view of the spec: the weights alone, no params."""
    weights = {str(w.name) for w in m.weights}
    return dataclasses.replace(ir, inputs=tuple(i for i in ir.inputs if i.name in weights), params=())


def _host_width(flat: KernelIR, data: str, width: Dim) -> str:
    """Source of the row width in the host: the data input's last axis, or the dim a column slice of it
    spans (`D` of `x[:, D:2*D]`), spelled over the host's arguments (`x.shape[-1] // 2`)."""
    axis = next(i.shape[-1] for i in flat.inputs if i.name == data)
    if axis == width:
        return f"{data}.shape[-1]"
    sources: dict[str, str] = {}
    for name, src in dim_bindings(flat, str):  # each source reads only dims bound before it
        sources[name] = re.sub(r"\bd_(\w+)", lambda found: f"({sources[found[1]]})", src)
    return re.sub(r"\bd_(\w+)", lambda found: f"({sources[found[1]]})", dim_source(width))


def _host(ir: KernelIR, m: RowReduceMatch, lifted: Lifted | None, flat: KernelIR) -> HostSignature:
    tensors = [i.name for i in ir.inputs]
    params = host_params(ir)
    optional = [o.name for o in ir.outputs if o.optional]
    params += ["save: bool = False"] if optional else []
    params += ["lnc: int | None = None", "target: str = _TARGET"]
    required = [o.name for o in ir.outputs if not o.optional]
    returns = (
        "torch.Tensor" if len(required) == 1 else f"tuple[{', '.join(['torch.Tensor'] * len(required))}]"
    )
    returns += " | tuple[torch.Tensor, ...]" if optional else ""
    data = next(i for i in ir.inputs if len(i.shape) == 3)
    weights = [str(w.name) for w in m.weights]
    kernel_out = {o.name: _allocation(o.name, lifted) for o in ir.outputs}
    saved = f"; with save=True also ({', '.join(optional)})" if optional else ""
    return HostSignature(
        params=", ".join(params), returns=returns,
        width=_host_width(flat, data.name, m.width), heads="1" if lifted else f"{data.name}.shape[1]",
        lift_lines=_lift_lines(ir, lifted, tensors), prep_lift_lines=_lift_lines(ir, lifted, weights),
        launch_args=", ".join(tensors + [p.name for p in ir.params]),
        save_arg="save" if optional else "False",
        kernel_returns=", ".join(kernel_out[o] for o in required),
        saved_returns=", ".join(kernel_out[o.name] for o in ir.outputs) if optional else "",
        prep_outputs=tuple(f"_prep{i}" for i in range(len(m.prep_roots))),  # no `<spec name>_hbm` form
        prep_heads=dim_source(_prep_heads(ir, m)),
        doc=f"Run the kernel on `lnc` logical cores (default LNC, capped at the target's); returns "
            f"({', '.join(required)}){saved}.",
        prep_name="_fused_weight", prep_params=", ".join(f"{w}: torch.Tensor" for w in weights),
        prep_args=", ".join(weights), prep_kernel_args=", ".join(kernel_arg(w) for w in weights),
        prep_dims=prep_dims(ir, weights),
        door=door_lines("_SIGNATURE", flat, save="save" if optional else "False"),
        prep_door=door_lines("_PREP_SIGNATURE", _prep_ir(flat, m), default_lnc="1") if m.prep_roots else (),
    )  # fmt: skip
