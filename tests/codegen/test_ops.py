"""Generated ops.py: torch.ops.fusegen.<name> forward, autograd, fake/compile, training, inference guard."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch._functorch.config as functorch_config

from fusegen.codegen.files import ops as ops
from fusegen.dsl import load_spec
from tests.codegen.test_autodiff import calc_diff, naive_grads

ROOT = Path(__file__).parents[2]
#: The op computes in f32; against fp64 its gradients reach calc_diff 7.8e-8 at T=4001 on the interpreter
#: (reference backend 2.2e-8; f32 autograd through gate_naive 1.2e-9), set by the token with the smallest
#: |s| (5.6e-5), where 1/sqrt|s| amplifies the cancellation in the forward's f32 sum for `dot` (the backward
#: kernel alone meets 1e-8: test_backward_kernel.py). It depends on grad_out (2.6e-9 ... 1.2e-7 over 20
#: other draws), so grad_out comes from the check's seeded generator. The fp64 checks (test_autodiff.py)
#: meet 1e-8.
OP_BAR = 1e-7


def load_ops(name: str) -> ModuleType:
    """generated/<name>/ops.py of this checkout."""
    return ops.load_ops(name, ROOT / "generated")


def engram_inputs(t: int, hc: int, h: int, seed: int = 0, grad: bool = False) -> list[torch.Tensor]:
    """bf16 x, kv, w_h, w_e as the spec declares them; with `grad`, then a bf16 grad_out of `out`."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(t, hc, h), (t, hc + 1, h), (hc, h), (hc, h)] + [(t, hc, h)] * grad
    return [torch.randn(s, generator=gen).to(torch.bfloat16) for s in shapes]


def op_grads(inputs: list[torch.Tensor], grad_out: torch.Tensor) -> list[torch.Tensor]:
    """Gradients of <out, grad_out> through torch.ops.fusegen.engram_gate."""
    leaves = [t.clone().requires_grad_(True) for t in inputs]
    out = torch.ops.fusegen.engram_gate(*leaves)[0]
    return list(torch.autograd.grad(out, leaves, grad_out))


@pytest.mark.parametrize("backend", ["interpreter", "reference"])
@pytest.mark.parametrize("check", range(5), ids=lambda i: f"check{i}")
def test_op_gradients_at_check_shapes(check: int, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    load_ops("engram_gate")
    monkeypatch.setenv("FUSEGEN_OPS_BACKEND", backend)
    env = load_spec(str(ROOT / "examples" / "engram_gate.spec"))[0].checks[check].env()
    *tensors, grad_out = engram_inputs(env["T"], env["HC"], env["H"], seed=check, grad=True)
    inputs = [t.float() for t in tensors]  # f32 leaves: f32 gradients
    got = op_grads(inputs, grad_out)
    expected = naive_grads([t.double() for t in inputs], grad_out.double(), resid=True)
    diffs = [calc_diff(g, e) for g, e in zip(got, expected, strict=True)]
    assert all(g.dtype == torch.float32 for g in got)
    assert max(diffs) < OP_BAR, diffs


def test_interpreter_and_reference_backends_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    load_ops("engram_gate")
    inputs = engram_inputs(5, 2, 128)
    monkeypatch.setenv("FUSEGEN_OPS_BACKEND", "reference")
    ref = torch.ops.fusegen.engram_gate(*inputs)
    monkeypatch.setenv("FUSEGEN_OPS_BACKEND", "interpreter")
    sim = torch.ops.fusegen.engram_gate(*inputs)
    for a, b in zip(sim, ref, strict=True):  # bf16 `out` within a bf16 rounding; f32 saved tensors tightly
        rtol = 2e-2 if a.dtype == torch.bfloat16 else 1e-5
        torch.testing.assert_close(a.float(), b.float(), rtol=rtol, atol=1e-5)
    grads = op_grads(inputs, torch.ones_like(sim[0]))
    assert [g.dtype for g in grads] == [torch.bfloat16] * 4  # each gradient in its input's dtype


def test_compile_traces_without_graph_breaks(monkeypatch: pytest.MonkeyPatch) -> None:
    load_ops("engram_gate")
    monkeypatch.setenv("FUSEGEN_OPS_BACKEND", "reference")
    x, kv, w_h, w_e = engram_inputs(4, 2, 128)
    w_h = w_h.float().requires_grad_(True)

    def fn(x: torch.Tensor, kv: torch.Tensor, w_h: torch.Tensor, w_e: torch.Tensor) -> torch.Tensor:
        return torch.ops.fusegen.engram_gate(x, kv, w_h, w_e)[0].float().square().mean()

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")  # fullgraph: a graph break raises
    loss = compiled(x, kv, w_h, w_e)
    (grad,) = torch.autograd.grad(loss, w_h)
    (eager,) = torch.autograd.grad(fn(x, kv, w_h, w_e), w_h)
    torch.testing.assert_close(loss, fn(x, kv, w_h, w_e))
    torch.testing.assert_close(grad, eager)


class Gate(torch.nn.Module):
    """A toy module: learnable RMSNorm weights in front of the generated Engram gate."""

    def __init__(self, hc: int, h: int) -> None:
        super().__init__()
        self.w_h = torch.nn.Parameter(torch.ones(hc, h))
        self.w_e = torch.nn.Parameter(torch.ones(hc, h))

    def forward(self, x: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return torch.ops.fusegen.engram_gate(x, kv, self.w_h, self.w_e)[0]


def test_toy_module_trains_through_the_op_on_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    load_ops("engram_gate")
    monkeypatch.setenv("FUSEGEN_OPS_BACKEND", "interpreter")
    x, kv, _, _ = engram_inputs(8, 2, 128, seed=3)
    target = x.float() + 0.9 * kv[:, 2:].float()  # reachable: a gate near 0.9 on every head
    model = Gate(2, 128)
    opt = torch.optim.SGD(model.parameters(), lr=50.0)
    losses = []
    for _ in range(5):
        loss = torch.nn.functional.mse_loss(model(x, kv).float(), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0], losses


def test_ffn_op_takes_f32_inputs_and_trains(monkeypatch: pytest.MonkeyPatch) -> None:
    ffn = load_ops("swiglu_ffn")
    monkeypatch.setenv("FUSEGEN_OPS_BACKEND", "reference")
    gen = torch.Generator().manual_seed(0)
    shapes = {
        "x": (3, 128),
        "w1t": (128, 5),
        "b1": (5,),
        "wgt": (128, 5),
        "bg": (5,),
        "w2t": (5, 128),
        "b2": (128,),
    }
    args = [torch.randn(s, generator=gen).to(torch.bfloat16) for s in shapes.values()]
    with torch.no_grad():
        out = ffn.swiglu_ffn(*[a.float().requires_grad_(True) for a in args])
    ref = ffn._module("reference.py").swiglu_ffn_reference(*args)
    torch.testing.assert_close(out, ref)
    trained = torch.ops.fusegen.swiglu_ffn(args[0].float().requires_grad_(True), *args[1:])
    assert trained.requires_grad and torch.equal(trained.detach(), out)  # the FFN op trains


#: the five trainable row-reduction ops, chained in one toy block so each backend compiles once
TRAINABLE = ("add_rmsnorm", "layernorm", "scaled_softmax", "qk_norm", "engram_gate")


class Block(torch.nn.Module):
    """Every trainable op in one graph: add + RMSNorm, LayerNorm, scaled softmax, QK-norm, Engram gate."""

    def __init__(self, h: int) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(7)
        self.w_rms = torch.nn.Parameter(1 + 0.1 * torch.randn(h, generator=gen))
        self.w_ln = torch.nn.Parameter(1 + 0.1 * torch.randn(h, generator=gen))
        self.b_ln = torch.nn.Parameter(0.1 * torch.randn(h, generator=gen))
        self.w_qk = torch.nn.Parameter(1 + 0.1 * torch.randn(32, generator=gen))
        self.w_h = torch.nn.Parameter(1 + 0.1 * torch.randn(2, h // 2, generator=gen))  # two heads of h / 2
        self.w_e = torch.nn.Parameter(1 + 0.1 * torch.randn(2, h // 2, generator=gen))

    def forward(self, x: torch.Tensor, r: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        ops = torch.ops.fusegen
        y, h = ops.add_rmsnorm(x, r, self.w_rms)
        z = ops.layernorm(y, self.w_ln, self.b_ln)[0]
        p, lse = ops.scaled_softmax(z)
        q = ops.qk_norm(z.reshape(z.shape[0], -1, 32), self.w_qk)
        gate_in = (h.float() + q.reshape(h.shape).float()).reshape(x.shape[0], 2, -1)
        out = ops.engram_gate(gate_in, kv, self.w_h, self.w_e)[0]
        return out.float().square().mean() + p.float().square().sum() + lse.mean()


def train_step(model: Block, step: Any, inputs: list[torch.Tensor]) -> tuple[torch.Tensor, list[Any]]:
    """One SGD step of `step` (the model, compiled or not); the loss and every gradient, parameters first."""
    loss = step(*inputs)
    leaves = [*model.parameters(), inputs[0]]
    grads = list(torch.autograd.grad(loss, leaves))
    with torch.no_grad():
        for param, grad in zip(model.parameters(), grads, strict=False):
            param -= 0.1 * grad
    return loss.detach(), grads


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_trainable_ops_train_under_compile_as_in_eager(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in TRAINABLE:
        load_ops(name)
    monkeypatch.setenv("FUSEGEN_OPS_BACKEND", "interpreter")
    gen = torch.Generator().manual_seed(0)
    t, h = 3, 256
    inputs = [torch.randn(t, h, generator=gen).requires_grad_(True), torch.randn(t, h, generator=gen)]
    inputs.append(torch.randn(t, 3, h // 2, generator=gen))
    eager, compiled = Block(h), Block(h)
    # torch 2.13's inductor calls a custom op with its arguments packed into one list when some of them are
    # donated buffers (saved forward outputs only the backward reads: the Engram gate's dot, gate, rstd_*);
    # without donation the compiled backward calls fusegen::<name>_backward as AOT autograd traced it
    torch._dynamo.reset()
    step = torch.compile(compiled, fullgraph=True, backend=backend)  # fullgraph: a graph break raises
    for _ in range(2):  # the second step runs the compiled graph again, on updated parameters
        want_loss, want = train_step(eager, eager, inputs)
        with functorch_config.patch(donated_buffer=False):
            got_loss, got = train_step(compiled, step, inputs)
        torch.testing.assert_close(got_loss, want_loss)
        for g, w in zip(got, want, strict=True):
            # aot_eager: bit for bit. inductor computes the f32 glue between the ops in its own order, and
            # the ops read incoming gradients in their outputs' dtype (bf16): one rounding of those, 2^-8
            # of a gradient's largest element, may differ (measured up to 1.2e-4).
            atol = 0.0 if backend == "aot_eager" else 2**-7 * w.abs().max().item()
            torch.testing.assert_close(g, w, rtol=0.0 if backend == "aot_eager" else 1.3e-6, atol=atol)


def test_a_second_build_of_a_loaded_name_is_refused_not_swapped_for_the_first(tmp_path: Path) -> None:
    """load_ops kept one module per kernel name: a second folder of that name (another spec, another --out)
    came back as the first, so torch.ops.fusegen.<name> silently ran the first build's kernel."""
    from fusegen.cli import main

    folders = []
    for factor in (2, 3):
        spec = tmp_path / f"times{factor}.spec"
        spec.write_text("kernel twin_build_probe\ndim T, H\ninput x: bf16[T, H]\noutput y: f32[T, H]\n"
                        f"y = x * {factor}\ncheck T=4 H=128\n")  # fmt: skip
        assert main(["build", "--out", str(tmp_path / f"out{factor}"), str(spec)]) == 0
        folders.append(tmp_path / f"out{factor}" / "twin_build_probe")
    first = ops.load_ops(folders[0])
    x = torch.randn(4, 128).bfloat16()
    assert torch.equal(torch.ops.fusegen.twin_build_probe(x), x.float() * 2)
    refused = r"already registered from .*out2/twin_build_probe/ops\.py; .*out3"
    with pytest.raises(RuntimeError, match=refused):
        ops.load_ops(folders[1])
    assert ops.load_ops("twin_build_probe", folders[0].parent) is first  # the same build again: the module
