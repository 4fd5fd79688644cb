"""Row-wise specs of the row-reduction family beyond the Engram gate: [T, H] ones lifted to one head (add +
RMSNorm, LayerNorm, scaled softmax) and a per-head norm (QK-norm), on the interpreter, and a lifted op's
gradients, against torch's own functions."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fusegen.codegen.files import ops as ops
from fusegen.sim import load_module

GENERATED = Path(__file__).resolve().parents[2] / "generated"
T, H = 131, 384  # a ragged token count: two token tiles, the second partial
EPS_RMS, EPS_LN, SCALE = 1e-6, 1e-5, 0.125
Formula = Callable[..., tuple[torch.Tensor, ...]]


def add_rmsnorm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    s = x.float() + r.float()
    return F.rms_norm(s, (H,), w.float(), EPS_RMS).bfloat16(), s.bfloat16()


def layernorm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
    var, mu = torch.var_mean(x.float(), dim=-1, unbiased=False)
    return F.layer_norm(x.float(), (H,), w, b, EPS_LN).bfloat16(), mu, torch.rsqrt(var + EPS_LN)


def scaled_softmax(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    z = x.float() * SCALE
    return torch.softmax(z, dim=-1).bfloat16(), torch.logsumexp(z, dim=-1, keepdim=True)


def qk_norm(q: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (F.rms_norm(q.float(), (q.shape[-1],), w.float(), EPS_RMS).bfloat16(),)


def _inputs(name: str) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(T, H, generator=gen).bfloat16()
    if name == "add_rmsnorm":
        weight = 1 + 0.1 * torch.randn(H, generator=gen)
        return [x, torch.randn(T, H, generator=gen).bfloat16(), weight.bfloat16()]
    if name == "layernorm":
        return [x, 1 + 0.1 * torch.randn(H, generator=gen), 0.1 * torch.randn(H, generator=gen)]
    if name == "qk_norm":  # [T, heads, head_dim]
        return [x.reshape(T, 3, H // 3), (1 + 0.1 * torch.randn(H // 3, generator=gen)).bfloat16()]
    return [4 * x]  # logits spread wide enough that the softmax is far from uniform


CASES: dict[str, tuple[Formula, dict[str, bool]]] = {
    "add_rmsnorm": (add_rmsnorm, {}),
    "layernorm": (layernorm, {"save": True}),
    "scaled_softmax": (scaled_softmax, {}),
    "qk_norm": (qk_norm, {}),
}


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("name", sorted(CASES))
def test_kernel_matches_torch(name: str, lnc: int) -> None:
    formula, options = CASES[name]
    args = _inputs(name)
    kernel = getattr(load_module(GENERATED / name / "kernel.py", target="trn2"), name)
    got = kernel(*args, **options, lnc=lnc)
    got = got if isinstance(got, tuple) else (got,)
    for i, (out, want) in enumerate(zip(got, formula(*args), strict=True)):
        assert out.shape == want.shape and out.dtype == want.dtype, i
        rtol = 2e-2 if out.dtype == torch.bfloat16 else 1e-5  # bf16 outputs: one rounding; f32: order only
        err = (out.float() - want.float()).abs().max().item()
        assert err <= 1e-6 + rtol * want.float().abs().max().item(), (name, i, err)


#: the first output of each op in fp64 from its inputs, for autograd
FP64_FIRST_OUTPUT: dict[str, Callable[..., torch.Tensor]] = {
    "add_rmsnorm": lambda x, r, w: F.rms_norm(x + r, (H,), w, EPS_RMS),
    "layernorm": lambda x, w, b: F.layer_norm(x, (H,), w, b, EPS_LN),
}


@pytest.mark.parametrize("name", sorted(FP64_FIRST_OUTPUT))
def test_lifted_op_trains_through_the_derived_backward(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FUSEGEN_OPS_BACKEND", "interpreter")
    ops.load_ops(name, GENERATED)
    spec_inputs = _inputs(name)
    leaves = [t.float().requires_grad_(True) for t in spec_inputs]
    grad_y = torch.randn(T, H, generator=torch.Generator().manual_seed(1)).bfloat16()  # y is bf16
    y = getattr(torch.ops.fusegen, name)(*leaves)[0]
    got = torch.autograd.grad(y, leaves, grad_y)
    exact = [t.double().requires_grad_(True) for t in spec_inputs]  # the op rounds to the spec's dtypes
    want = torch.autograd.grad(FP64_FIRST_OUTPUT[name](*exact), exact, grad_y.double())
    for g, e in zip(got, want, strict=True):
        # an f32 backward from the same inputs and bf16 grad_y (measured: <= 1.2e-7 relative)
        assert (g.double() - e).norm() <= 1e-6 * e.norm(), name


def test_an_f32_output_the_tensor_engine_helped_form_leaves_psum_through_sbuf(tmp_path: Path) -> None:
    # `layernorm(x, eps, w)`'s last step reads its centred row from PSUM and, for an f32 output, wrote it
    # there too: the store then DMA'd out of PSUM, which no DMA can read (an interpreter error)
    from fusegen.cli import main

    spec = tmp_path / "ln32.spec"
    spec.write_text("kernel ln32\ndim T, H\ninput x: bf16[T, H]\ninput w: f32[H]\nparam eps = 1e-5\n"
                    f"output y: f32[T, H]\ny = layernorm(x, eps, w)\ncheck T={T} H={H}\n")  # fmt: skip
    assert main(["build", "--out", str(tmp_path / "out"), str(spec)]) == 0
    x, w, _ = _inputs("layernorm")
    got = load_module(tmp_path / "out" / "ln32" / "kernel.py", target="trn2").ln32(x, w, lnc=1)
    want = F.layer_norm(x.float(), (H,), w, eps=EPS_LN)
    assert (got - want).abs().max().item() <= 1e-6 + 1e-5 * want.abs().max().item()


def test_a_cast_inside_a_cast_keeps_its_own_rounding(tmp_path: Path) -> None:
    # bf16(f16(v)) was computed as bf16(v): f16's overflow (|v| > 65504 is inf) and rounding were lost
    from fusegen.cli import main

    spec = tmp_path / "casts.spec"
    spec.write_text("kernel casts\ndim T, H\ninput x: bf16[T, H]\noutput y: f32[T, H]\n"
                    f"y = bf16(f16(x * 100000.0))\ncheck T={T} H={H}\n")  # fmt: skip
    assert main(["build", "--out", str(tmp_path / "out"), str(spec)]) == 0
    x = _inputs("layernorm")[0]
    got = load_module(tmp_path / "out" / "casts" / "kernel.py", target="trn2").casts(x, lnc=1)
    want = (x.float() * 100000.0).half().bfloat16().float()
    assert want.isinf().any() and torch.equal(got, want)  # the same f32 product, then the same two roundings


def test_rows_of_two_half_dtypes_each_get_their_own_identity(tmp_path: Path) -> None:
    # the passes staged bf16 r and the epilogue f16 x through PSUM: both identities were named pe_identity,
    # so the launch allocated the second and never wrote it (an uninitialised read on the interpreter)
    from fusegen.cli import main

    spec = tmp_path / "mixed.spec"
    spec.write_text("kernel mixed\ndim T, H\ninput x: f16[T, H]\ninput r: bf16[T, H]\noutput y: f32[T, H]\n"
                    "y = x - r + mean(where(r > -2.0, r, 127.0), axis=-1, keepdim=true)\n"
                    f"check T={T} H={H}\n")  # fmt: skip
    assert main(["build", "--out", str(tmp_path / "out"), str(spec)]) == 0
    gen = torch.Generator().manual_seed(5)
    x, r = torch.randn(T, H, generator=gen).half(), torch.randn(T, H, generator=gen).bfloat16()
    got = load_module(tmp_path / "out" / "mixed" / "kernel.py", target="trn2").mixed(x, r, lnc=1)
    want = x.float() - r.float() + torch.where(r > -2.0, r, 127.0).float().mean(dim=-1, keepdim=True)
    assert (got - want).abs().max().item() <= 1e-6 + 1e-5 * want.abs().max().item()
