"""Where fp8 may appear: which targets take which fp8 format, and which families lower fp8 values.

Sources (aws-neuron/aws-neuron-sdk): the NeuronCore-v2 data types (about-neuron/arch/neuron-features/
data-types.rst) list FP8_e5m2, FP8_e4m3 and FP8_e3m4 as "cFP8"; `nki.language.float8_e4m3fn`, the OCP
e4m3 (no inf, NaN 0bS1111111, max 448) that `fp8_e4m3` is, is documented for Trn2 and Trn3 only (its
page from SDK 2.32: "relevant for: Trn2, Trn3"), but neither trn1 nor trn2 takes it: the Tensor engine takes
it from NeuronCore-v4 (trn3) only (nki/api/nki/isa/__init__.py, nc_matmul "Data types": "Starting
NeuronCore-v4, float8_e4m3fn (OCP FP8) is also supported"; fusegen.sim rule matmul-fp8-e4m3fn), and the
graph compiler rejects any F8E4M3FN operand on them (compiler/error-codes/EVRF051.rst: "Data type F8E4M3FN
is not supported on TRN1/TRN2", "natively supported on Trainium3 (Trn3) and later"), which an NKI
kernel's fp8 output is. So `fp8_e4m3` builds for neither build target; `fp8_e5m2` (`nl.float8_e5m2`, a
Tensor-engine input on every target) builds for both.
"""

from __future__ import annotations

from collections.abc import Iterable

from fusegen.dsl.diagnostics import Diagnostic
from fusegen.dsl.ir import FP8_DTYPES, KernelIR, Node
from fusegen.sim.targets import TARGETS

#: the oldest NeuronCore generation taking each fp8 format (as a value and as a matmul operand alike)
MIN_NC_VERSION = {"fp8_e4m3": 4, "fp8_e5m2": 2}
#: a format's name where it is a matmul operand (diagnostics, `supports`)
OPERAND = " matmul operand"
#: targets `fusegen build --target` offers
BUILD_TARGETS = ("trn1", "trn2")
#: families whose lowering handles fp8 values: every one (FFN and projection weights, casts and outputs of
#: epilogues), or only the outputs (a row kernel's last step writes its fp8 tile; nothing reads it back)
FP8_FAMILIES = {"ffn": "all", "proj": "all", "rowreduce": "outputs"}


def weight_dtype_fits(weight: str, x: str) -> bool:
    """A weight of x's dtype, or an fp8 weight beside a 16-bit x (the PE takes mixed fp8/bf16 inputs; x and
    the combine stay 16-bit: fp8 is a storage format for weights and outputs here)."""
    return weight == x or (weight in FP8_DTYPES and x in ("bf16", "f16"))


def fp8_nodes(ir: KernelIR) -> list[Node]:
    """Every input, cast and output value of an fp8 dtype, in IR order."""
    outputs = {o.node for o in ir.outputs if o.dtype in FP8_DTYPES}
    return [n for n in ir.nodes if n.dtype in FP8_DTYPES or n.id in outputs]


def _operands(ir: KernelIR) -> set[int]:
    """Ids of the nodes a matmul reads."""
    return {a for n in ir.nodes if n.op == "matmul" for a in n.args}


def _uses(n: Node, operands: set[int]) -> str:
    """n's fp8 format, named as a matmul operand where a matmul reads it."""
    return n.dtype + OPERAND if n.id in operands else n.dtype


def _dtypes_of(ir: KernelIR) -> set[str]:
    operands = _operands(ir)
    return {_uses(n, operands) for n in ir.nodes if n.dtype in FP8_DTYPES} | {
        o.dtype for o in ir.outputs if o.dtype in FP8_DTYPES
    }


def _not_outputs(ir: KernelIR, nodes: list[Node]) -> Node | None:
    """The first fp8 value that is an input, another step reads, or no output is (an output's last step is
    none of these)."""
    read = {a for n in ir.nodes for a in n.args}
    outputs = {o.node for o in ir.outputs}
    return next((n for n in nodes if n.op == "input" or n.id in read or n.id not in outputs), None)


def _outputs_only(ir: KernelIR, family: str, stray: Node) -> Diagnostic:
    """Why a family that writes only fp8 outputs refuses `stray`."""
    only = f"the {family} family writes fp8 outputs only"
    output = next((o for o in ir.outputs if o.node == stray.id), None)
    if stray.op == "input":
        message, hint = f"`{stray.name}` is an fp8 input; {only}", "declare it bf16 or f32"
    elif output is not None:
        message = f"output `{output.name}` is {output.dtype} and read again; {only}"
        hint = "read the value before its cast to fp8: give it a name of its own"
    else:
        message, hint = f"an fp8 value read again; {only}", "cast to fp8 only in an output's last step"
    return Diagnostic(stray.span, message, hint=hint)


def supports(target: str, dtypes: Iterable[str]) -> bool:
    """Whether `target` takes every fp8 format in `dtypes` (names ending in OPERAND: as matmul operands)."""
    return all(TARGETS[target].nc_version >= _min_version(d) for d in dtypes)


def _min_version(use: str) -> int:
    """The oldest NeuronCore generation taking a format in this use."""
    return MIN_NC_VERSION[use.removesuffix(OPERAND)]


def fp8_errors(ir: KernelIR, family: str, target: str) -> list[Diagnostic]:
    """Diagnostics for fp8 values a family cannot lower or a target cannot take (empty when fine)."""
    nodes = fp8_nodes(ir)
    if not nodes:
        return []
    first = nodes[0]
    if family not in FP8_FAMILIES:
        hint = f"fp8 is supported in the {', '.join(FP8_FAMILIES)} families; use bf16 here"
        return [Diagnostic(first.span, f"the {family} family does not lower fp8 values", hint=hint)]
    if FP8_FAMILIES[family] == "outputs" and (stray := _not_outputs(ir, nodes)):
        return [_outputs_only(ir, family, stray)]
    missing = sorted(d for d in _dtypes_of(ir) if not supports(target, (d,)))
    if not missing:
        return []
    operands = _operands(ir)
    spans = [n.span for n in nodes if _uses(n, operands) in missing]
    spans += [o.span for o in ir.outputs if o.dtype in missing]  # an output stored as fp8
    at = spans[0] if spans else first.span
    others = [t for t in BUILD_TARGETS if supports(t, missing) and t != target]
    message = f"{', '.join(missing)} is not available on {target}"
    hint = f"build with --target {others[0]}, or use fp8_e5m2" if others else "use fp8_e5m2"
    if any(d.startswith("fp8_e4m3") for d in missing):
        hint += " (the OCP float8_e4m3fn is a NeuronCore-v4 (trn3) type: trn1 and trn2 take it nowhere)"
    return [Diagnostic(at, message, hint=hint)]


def fp8_targets(ir: KernelIR, targets: Iterable[str]) -> list[str]:
    """The targets among `targets` that take every fp8 format `ir` uses."""
    dtypes = _dtypes_of(ir)
    return [t for t in targets if supports(t, dtypes)]
