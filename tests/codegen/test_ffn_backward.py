"""FFN ops train: their gradients against fp64 autograd through independent hand-written formulas, on both
op backends, and a two-layer toy model under torch.compile as in eager (docs/autodiff.md, FFN section)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fusegen import conformance
from fusegen.codegen.autodiff import backward_ir
from fusegen.codegen.family import Mismatch
from fusegen.codegen.ffn.backward import backward_flops, strategies
from fusegen.codegen.ffn.backward_program import build_program
from fusegen.codegen.ffn.match import match_ffn
from fusegen.codegen.files import ops
from fusegen.codegen.rewrites import rewrite
from fusegen.dsl import load_spec
from fusegen.dsl.ir import Dim, eval_shape
from fusegen.testing import TORCH_DTYPES, load_generated
from tests.codegen.boundary import GENERATED, KERNELS, as_tuple, inputs, kernel, op, small_dims, spec_ir
from tests.codegen.test_autodiff import calc_diff

#: TileKernels' calc_diff bar against fp64 (kernels.md §1.8), for every f32 gradient of the backward op: it
#: rounds h and the gradient through it to bf16 as the formula does and computes in f32 (measured worst:
#: 1.5e-10, docs/autodiff.md)
BAR = 1e-8
SHAPES = ((7, 128, 200), (130, 256, 384))  # ragged rows (both cores at LNC 2) and a ragged I


def swiglu_ffn(x, w1t, b1, wgt, bg, w2t, b2):  # type: ignore[no-untyped-def]
    """The SwiGLU FFN as written in examples/swiglu_ffn.spec, by hand: h rounded to bf16 before W2."""
    h = F.silu(x @ w1t + b1) * (x @ wgt + bg)
    return h.to(torch.bfloat16).to(x.dtype) @ w2t + b2


def swiglu_ffn_ln(x, w1t, b1, wgt, bg, w2t, b2, a, eps=1e-6):  # type: ignore[no-untyped-def]
    """examples/swiglu_ffn_ln.spec by hand: the residual, then a LayerNorm without affine, z in bf16."""
    x_new = swiglu_ffn(x, w1t, b1, wgt, bg, w2t, b2) + a
    return x_new, F.layer_norm(x_new, (x_new.shape[-1],), eps=eps).to(torch.bfloat16).to(x.dtype)


def gelu_mlp(x, w1t, b1, w2t, b2):  # type: ignore[no-untyped-def]
    """examples/gelu_mlp.spec by hand: exact (erf) GELU, its output rounded to bf16 before W2."""
    return F.gelu(x @ w1t + b1).to(torch.bfloat16).to(x.dtype) @ w2t + b2


def packed_clamped_swiglu(x, w12t, w3t, limit):  # type: ignore[no-untyped-def]
    """examples/packed_clamped_swiglu.spec by hand: the packed product split in gate | up, both clamped."""
    gate, up = (x @ w12t).chunk(2, dim=-1)
    h = F.silu(gate.clamp(max=limit)) * up.clamp(-limit, limit)
    return h.to(torch.bfloat16).to(x.dtype) @ w3t


FORMULAS: dict[str, Callable[..., object]] = {
    "swiglu_ffn": swiglu_ffn, "swiglu_ffn_ln": swiglu_ffn_ln, "gelu_mlp": gelu_mlp,
    "packed_clamped_swiglu": packed_clamped_swiglu,
}  # fmt: skip
#: params other than the spec's defaults: a limit the up-projections cross, so both sides of the clamps train
PARAMS = {"packed_clamped_swiglu": {"limit": 1.5}}
#: ops whose backward runs as generated kernels on the interpreter: their tests fail if it runs the reference
KERNEL_PATH = ("swiglu_ffn", "swiglu_ffn_ln", "gelu_mlp", "packed_clamped_swiglu")


def ffn_inputs(name: str, r: int, k: int, i: int, seed: int) -> list[torch.Tensor]:
    """Seeded inputs in the spec's dtypes: bf16 x and weights (scaled by 1/sqrt(fan-in)), f32 biases."""
    gen = torch.Generator().manual_seed(seed)
    ir = spec_ir(name)
    tokens = ir.inputs[0].shape[0]
    args = []
    for decl in ir.inputs:
        shape = eval_shape(decl.shape, {"R": r, "K": k, "I": i})
        weight = len(shape) == 2 and decl.shape[0] != tokens
        value = torch.randn(shape, generator=gen) * (shape[0] ** -0.5 if weight else 1.0)
        args.append(value.to(torch.bfloat16 if decl.dtype == "bf16" else torch.float32))
    return args


def refuse_reference(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the op's backward_reference.py raise, so the op trains only through backward_kernel.py."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"{name}: the backward ran backward_reference.py, not the generated kernels")

    reference = ops.load_ops(name, GENERATED)._module("backward_reference.py")
    monkeypatch.setattr(reference, f"{name}_backward_reference", refuse)


def backward_args(name: str, args: list[torch.Tensor], grads: list[torch.Tensor],
                  params: list[float]) -> list[torch.Tensor]:  # fmt: skip
    """torch.ops.fusegen.<name>_backward's tensors: the inputs, the forward's outputs autograd saves for the
    backward (the f32 outputs the kernels read), the output gradients."""
    outs = as_tuple(op(name)(*args, *params))  # registers fusegen::<name> and its backward op
    saved = ops.load_ops(name, GENERATED)._SAVED_OUTPUTS
    return [*args, *(outs[i] for i in saved), *grads]


def _gradients(fn: Callable[..., object], args: list[torch.Tensor], grads: list[torch.Tensor],
               dtype: torch.dtype | None) -> list[torch.Tensor]:  # fmt: skip
    """d(args) of Σ outputs·grads through `fn`, the args cast to `dtype` (None: as given)."""
    leaves = [(a.to(dtype) if dtype else a).detach().requires_grad_(True) for a in args]
    outs = fn(*leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    loss = sum((o.to(g.dtype) * g).sum() for o, g in zip(outs, grads, strict=True))
    return list(torch.autograd.grad(loss, leaves))


@pytest.mark.parametrize("backend", ["interpreter", "reference"])
@pytest.mark.parametrize(("r", "k", "i"), SHAPES)
@pytest.mark.parametrize("name", ["swiglu_ffn", "swiglu_ffn_ln", "gelu_mlp", "packed_clamped_swiglu"])
def test_ffn_op_gradients_match_fp64_formula(name: str, r: int, k: int, i: int, backend: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("FUSEGEN_OPS_BACKEND", backend)
    if backend == "interpreter" and name in KERNEL_PATH:
        refuse_reference(name, monkeypatch)
    args = ffn_inputs(name, r, k, i, seed=r)
    ir = spec_ir(name)
    gen = torch.Generator().manual_seed(1)
    grads = [torch.randn(r, k, generator=gen).to(torch.bfloat16 if o.dtype == "bf16" else torch.float32)
             for o in ir.outputs]  # fmt: skip
    params = [PARAMS.get(name, {}).get(p.name, p.default) for p in ir.params]
    tensors = backward_args(name, args, grads, params)
    f32 = getattr(torch.ops.fusegen, f"{name}_backward")(*tensors, *params)  # the f32 input gradients
    formula = FORMULAS[name]
    want = _gradients(lambda *t: formula(*t, *params), args, [g.double() for g in grads], torch.float64)
    for decl, g, w in zip(ir.inputs, f32, want, strict=True):
        assert g.dtype == torch.float32 and calc_diff(g, w) <= BAR, (decl.name, calc_diff(g, w))
    got = _gradients(lambda *t: op(name)(*t, *params), args, grads, None)  # type: ignore[operator]
    assert all(torch.equal(g, f.to(a.dtype)) for g, f, a in zip(got, f32, args, strict=True))


def test_backward_plan_prices_every_strategy() -> None:
    """Recomputing from x re-runs the up-projections (and the down-projection under a norm epilogue);
    saving the up-projections recomputes no GEMM; the FLOPs of the gradients are twice the forward's."""
    dims = {"R": 256, "K": 1280, "I": 3416}
    for name, recomputed in (("swiglu_ffn", 2), ("swiglu_ffn_ln", 3)):
        ir = spec_ir(name)
        m, back = match_ffn(rewrite(ir)), backward_ir(ir)
        flops = backward_flops(ir, back, m, dims)
        assert flops.forward == 3 * 2 * 1280 * 3416 and flops.gradients == 2 * flops.forward
        by_name = {s.name: s for s in strategies(ir, m, back, dims)}
        assert by_name["recompute all from x"].recompute_flops == recomputed * 2 * 1280 * 3416
        assert by_name["save the up-projections"].recompute_flops == 0
        assert by_name["save the up-projections"].saved_bytes >= 2 * 2 * 3416
    # the kernels' IR reads swiglu_ffn_ln's f32 x_new: the down-projection is not recomputed
    ir = spec_ir("swiglu_ffn_ln")
    m, back = match_ffn(rewrite(ir)), backward_ir(ir, read_outputs=True)
    assert "x_new" in [d.name for d in back.inputs]
    assert backward_flops(ir, back, m, dims).recompute == 2 * 2 * 1280 * 3416


class TwoLayers(torch.nn.Module):
    """Two SwiGLU FFN layers with residuals, weights as parameters, through torch.ops.fusegen.swiglu_ffn."""

    def __init__(self, k: int, i: int) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(5)
        self.layers = torch.nn.ModuleList()
        for _ in range(2):
            layer = torch.nn.Module()
            for n, shape, scale in (("w1t", (k, i), k**-0.5), ("b1", (i,), 0.1), ("wgt", (k, i), k**-0.5),
                                    ("bg", (i,), 0.1), ("w2t", (i, k), i**-0.5), ("b2", (k,), 0.1)):
                dtype = torch.float32 if n.startswith("b") else torch.bfloat16
                value = (torch.randn(shape, generator=gen) * scale).to(dtype)
                layer.register_parameter(n, torch.nn.Parameter(value))
            self.layers.append(layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + torch.ops.fusegen.swiglu_ffn(x, *layer.parameters())
        return x


def test_two_layer_model_trains_compiled_as_in_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    op("swiglu_ffn")
    monkeypatch.setenv("FUSEGEN_OPS_BACKEND", "interpreter")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 128, generator=gen).bfloat16()
    target = torch.randn(5, 128, generator=gen).bfloat16()
    eager, compiled = TwoLayers(128, 64), TwoLayers(128, 64)
    torch._dynamo.reset()
    step = torch.compile(compiled, fullgraph=True, backend="aot_eager")  # fullgraph: a graph break raises
    for fn in (eager, step):
        F.mse_loss(fn(x).float(), target.float()).backward()
    for p, q in zip(eager.parameters(), compiled.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None and torch.equal(p.grad, q.grad)


PLANS = {n: GENERATED / n / "backward_plan.md" for n in KERNELS}
FFN_KERNELS = [n for n, p in PLANS.items() if p.is_file() and "(ffn family)" in p.read_text(encoding="utf-8")]


@pytest.mark.parametrize("name", FFN_KERNELS)
def test_every_ffn_op_trains_compiled_as_in_eager(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each gallery FFN op in one fullgraph aot_eager graph (a break raises); gradients bit-identical."""
    monkeypatch.setenv("FUSEGEN_OPS_BACKEND", "interpreter")
    ir = spec_ir(name)
    args = inputs(ir, small_dims(ir, rows=5), seed=2)
    fn = op(name)
    params = [p.default for p in ir.params]

    def loss(*tensors: torch.Tensor) -> torch.Tensor:
        return sum(o.float().square().sum() for o in as_tuple(fn(*tensors, *params)))  # type: ignore[operator]

    torch._dynamo.reset()
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    grads = []
    for f in (loss, compiled):
        leaves = [a.clone().requires_grad_(True) for a in args]
        grads.append(torch.autograd.grad(f(*leaves), leaves))
    assert all(torch.equal(g, c) for g, c in zip(*grads, strict=True))
    assert any(g.abs().sum() > 0 for g in grads[0])


KERNEL_BACKWARDS = [n for n in FFN_KERNELS if (GENERATED / n / "backward_kernel.py").is_file()]


def test_every_trainable_ffn_op_has_backward_kernels() -> None:
    """Issue 19: every gallery FFN that trains (fp8 specs are inference-only) trains through generated
    backward kernels, so the interpreter backend never falls back to backward_reference.py for one."""
    assert len(FFN_KERNELS) >= 13 and KERNEL_BACKWARDS == FFN_KERNELS


@pytest.mark.parametrize("name", KERNEL_BACKWARDS)
def test_backward_kernels_match_the_reference_backward(name: str) -> None:
    """backward_kernel.py on the interpreter (LNC 2, ragged rows, I over two 512-column blocks, ragged; the
    f32 outputs it reads from reference.py's forward) against backward_reference.py, both f32 on the same
    bf16 inputs: they differ by summation order."""
    ir = spec_ir(name)
    dims = {**small_dims(ir, rows=130), **{d: v for d, v in (("K", 256), ("I", 600)) if d in small_dims(ir)}}
    args = inputs(ir, dims, seed=1)
    gen = torch.Generator().manual_seed(3)
    grads = [torch.randn(args[0].shape, generator=gen).to(TORCH_DTYPES[o.dtype]) for o in ir.outputs]
    outs = as_tuple(getattr(load_generated(GENERATED / name / "reference.py"), f"{name}_reference")(*args))
    named = {d.name: t for d, t in zip([*ir.inputs, *ir.outputs], [*args, *outs], strict=True)}
    named.update({f"d_{o.name}": g for o, g in zip(ir.outputs, grads, strict=True)})
    host = getattr(kernel(name, "backward_kernel.py"), f"{name}_backward")
    got = host(**{p: named[p] for p in inspect.signature(host).parameters if p in named}, lnc=2)
    want = getattr(load_generated(GENERATED / name / "backward_reference.py"), f"{name}_backward_reference")(
        *args, *grads)
    assert len(got) == len(want) == len(ir.inputs)
    for decl, g, w in zip(ir.inputs, got, want, strict=True):
        assert g.dtype == torch.float32 and g.shape == w.shape
        assert calc_diff(g, w) <= 1e-10, (decl.name, calc_diff(g, w))


@pytest.mark.parametrize("name", ["gelu_mlp", "packed_clamped_swiglu"])
def test_kernel_backward_passes_opcheck_and_gradcheck_at_ragged_shapes(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch.library.opcheck and gradcheck with the backward on the generated kernels, at rows split unevenly
    between two cores and an intermediate width that is no multiple of 128 (the slices' offsets too)."""
    monkeypatch.setenv("FUSEGEN_OPS_BACKEND", "interpreter")
    refuse_reference(name, monkeypatch)
    ir = spec_ir(name)
    tokens = ir.inputs[0].shape[0]
    specs = tuple((d.name, d.dtype, "fan_in" if len(d.shape) == 2 and d.shape[0] != tokens else "1")
                  for d in ir.inputs)  # fmt: skip
    shapes = {d.name: eval_shape(d.shape, {"R": 7, "K": 128, "I": 100}) for d in ir.inputs}
    folder = GENERATED / name
    conformance.opcheck(folder, name, specs, shapes, requires_grad=True)
    dtypes = tuple({*(d.dtype for d in ir.inputs), *(o.dtype for o in ir.outputs)})
    assert conformance.gradcheck(folder, name, specs, shapes, (0,), dtypes)


#: a packed product whose up half is unused: its gradient is the gate half's, zeros elsewhere
GATE_ONLY = """kernel gate_only
dim R, K, I
input x: bf16[R, K]
input w12t: bf16[K, 2 * I]
input w3t: bf16[I, K]
output out: bf16[R, K]
h = x @ w12t
out = bf16(silu(h[:, 0:I])) @ w3t
check R=8 K=128 I=64
"""


def test_packed_gradient_is_one_buffer_and_a_partial_scatter_is_refused(tmp_path: Path) -> None:
    """packed_clamped_swiglu's program writes [dG | dU] into one [R, 2I] buffer that one token GEMM and one
    row GEMM read whole; a gradient that fills only some columns is no concatenation: a Mismatch (the op
    trains through backward_reference.py)."""
    program = build_program(backward_ir(spec_ir("packed_clamped_swiglu")), Dim.sym("R"))
    (stage,) = program.kernels
    concat = [b for b in stage.buffers if b[2] != "N"]
    assert [c[2] for c in concat] == ["2 * d_I"] and sorted(w[2] for w in stage.writes) == ["", "", "d_I"]
    assert sum(f"({concat[0][0]}," in c.call or f", {concat[0][0]}," in c.call for c in program.calls) == 2
    path = tmp_path / "gate_only.spec"
    path.write_text(GATE_ONLY, encoding="utf-8")
    with pytest.raises(Mismatch, match="not a concatenation"):
        build_program(backward_ir(load_spec(str(path))[0]), Dim.sym("R"))
