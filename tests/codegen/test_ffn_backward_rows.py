"""The FFN backward's row kernels (ffn/backward_rows.py): the FFNs with a norm epilogue or prologue train
through generated NKI kernels on the interpreter, their gradients against fp64 autograd through
independent hand-written torch formulas, at ragged shapes (docs/autodiff.md, FFN section)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from fusegen.codegen.files.ops import load_ops
from tests.codegen.boundary import GENERATED, inputs, kernel, op, spec_ir
from tests.codegen.test_autodiff import calc_diff
from tests.codegen.test_ffn_backward import BAR, _gradients, backward_args

#: rows over both cores at LNC 2 and a ragged last tile; K over two 512-column chunks, the last ragged
#: (every reduction pass folds two chunks); I ragged
DIMS = {"R": 130, "K": 640, "I": 200}


def _bf16(t: torch.Tensor) -> torch.Tensor:
    """`t` rounded to bf16 and back, as the spec's bf16() and bf16 outputs round."""
    return t.to(torch.bfloat16).to(t.dtype)


def _swiglu(x, w1t, wgt, w2t, b1=0.0, bg=0.0, b2=0.0):  # type: ignore[no-untyped-def]
    return _bf16(F.silu(x @ w1t + b1) * (x @ wgt + bg)) @ w2t + b2


def _rms(v, eps):  # type: ignore[no-untyped-def]
    return v * torch.rsqrt(v.square().mean(-1, keepdim=True) + eps)


def swiglu_ffn_ln(x, w1t, b1, wgt, bg, w2t, b2, a, eps):  # type: ignore[no-untyped-def]
    x_new = _swiglu(x, w1t, wgt, w2t, b1, bg, b2) + a
    return x_new, _bf16(F.layer_norm(x_new, (x_new.shape[-1],), eps=eps))


def swiglu_rmsnorm(x, w1t, b1, wgt, bg, w2t, b2, a, gamma, eps):  # type: ignore[no-untyped-def]
    x_new = _swiglu(x, w1t, wgt, w2t, b1, bg, b2) + a
    return x_new, _bf16(_rms(x_new, eps) * gamma)


def swiglu_layernorm_affine(x, w1t, b1, wgt, bg, w2t, b2, a, gamma, beta, eps):  # type: ignore[no-untyped-def]
    x_new = _swiglu(x, w1t, wgt, w2t, b1, bg, b2) + a
    return x_new, _bf16(F.layer_norm(x_new, (x_new.shape[-1],), gamma, beta, eps))


def swiglu_gemma_norm(x, w1t, wgt, w2t, a, gamma, eps):  # type: ignore[no-untyped-def]
    x_new = _swiglu(x, w1t, wgt, w2t) + a
    return x_new, _bf16(_rms(x_new, eps) * (1 + gamma))


def swiglu_layerscale(x, w1t, b1, wgt, bg, w2t, b2, ls, a, eps):  # type: ignore[no-untyped-def]
    y = a + ls * _swiglu(x, w1t, wgt, w2t, b1, bg, b2)
    return _bf16(F.layer_norm(y, (y.shape[-1],), eps=eps))


def prenorm_swiglu(x, gamma, wgt, wut, wdt, eps):  # type: ignore[no-untyped-def]
    xn = _bf16(_rms(x, eps) * gamma)
    return _bf16(_swiglu(xn, wgt, wut, wdt) + x)


FORMULAS: dict[str, Callable[..., object]] = {f.__name__: f for f in (
    swiglu_ffn_ln, swiglu_rmsnorm, swiglu_layernorm_affine, swiglu_gemma_norm, swiglu_layerscale,
    prenorm_swiglu)}


def _args(name: str, dims: dict[str, int], seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Seeded inputs in the spec's dtypes (norm weights near 1) and output gradients in the outputs'."""
    ir = spec_ir(name)
    args = inputs(ir, dims, seed=seed)
    args = [t + 1 if d.name in ("gamma", "ls") and name != "swiglu_gemma_norm" else t
            for d, t in zip(ir.inputs, args, strict=True)]  # fmt: skip
    gen = torch.Generator().manual_seed(seed + 1)
    grads = [torch.randn(dims["R"], dims["K"], generator=gen).to(torch.bfloat16 if o.dtype == "bf16"
             else torch.float32) for o in ir.outputs]  # fmt: skip
    return args, grads


def distances(name: str, seed: int) -> list[tuple[str, float, float]]:
    """Per input: calc_diff against fp64 autograd through the formula of the op's backward on the current
    backend and of f32 eager torch autograd through the same formula."""
    ir, params = spec_ir(name), [p.default for p in spec_ir(name).params]
    args, grads = _args(name, DIMS, seed=seed)
    tensors = backward_args(name, args, grads, params)
    got = getattr(torch.ops.fusegen, f"{name}_backward")(*tensors, *params)
    formula = FORMULAS[name]
    want = _gradients(lambda *t: formula(*t, *params), args, [g.double() for g in grads], torch.float64)
    eager = _gradients(lambda *t: formula(*t, *params), args, [g.float() for g in grads], torch.float32)
    return [(d.name, calc_diff(g, w), calc_diff(e, w)) for d, g, w, e in zip(ir.inputs, got, want, eager,
                                                                             strict=True)]  # fmt: skip


@pytest.mark.parametrize("name", sorted(FORMULAS))
def test_row_kernel_gradients_match_fp64_formula(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The op's backward on the interpreter runs backward_kernel.py (never the reference) and every f32
    input gradient is within TileKernels' bar of fp64 autograd through the hand-written formula, or, where
    f32 torch autograd through the same formula is itself further off (the formula's bf16 roundings land
    differently in f32 than in fp64), within twice that distance, as for engram_gate (docs/autodiff.md)."""
    monkeypatch.setenv("FUSEGEN_OPS_BACKEND", "interpreter")
    op(name)
    module = load_ops(name, GENERATED)
    loaded: list[str] = []
    real = module._module

    def spy(file: str, mode: str | None = None) -> object:
        loaded.append(file)
        return real(file, mode)

    monkeypatch.setattr(module, "_module", spy)
    for input_name, kernel_diff, eager_diff in distances(name, seed=11):
        assert kernel_diff <= max(BAR, 2 * eager_diff), (input_name, kernel_diff, eager_diff)
    assert loaded[-1:] == ["backward_kernel.py"] and "backward_reference.py" not in loaded, loaded


@pytest.mark.parametrize(("rows", "lnc"), [(1, 2), (7, 1)])
def test_token_sums_without_a_gemm_add_the_cores_partials(rows: int, lnc: int) -> None:
    """prenorm_swiglu's dγ is a sum over the tokens no weight gradient carries: the row kernel's per-core
    [1, K] partials (one core without rows at R=1, LNC 2) add up to the formula's."""
    dims = {"R": rows, "K": 640, "I": 200}
    args, grads = _args("prenorm_swiglu", dims, seed=rows)
    got = kernel("prenorm_swiglu", "backward_kernel.py").prenorm_swiglu_backward(*args, *grads, lnc=lnc)
    want = _gradients(lambda *t: prenorm_swiglu(*t, 1e-6), args, [g.double() for g in grads], torch.float64)
    gamma = [d.name for d in spec_ir("prenorm_swiglu").inputs].index("gamma")
    assert got[gamma].shape == (640,) and calc_diff(got[gamma], want[gamma]) <= BAR
    assert all(calc_diff(g, w) <= BAR for g, w in zip(got, want, strict=True))


def test_views_and_slices_train_as_contiguous_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    """swiglu_ffn_ln through autograd with a column slice of x, a transposed view of w2t and a strided
    residual: the same gradients, bit for bit, as from contiguous copies."""
    monkeypatch.setenv("FUSEGEN_OPS_BACKEND", "interpreter")
    dims = {"R": 9, "K": 256, "I": 200}
    args, grads = _args("swiglu_ffn_ln", dims, seed=3)
    names = [d.name for d in spec_ir("swiglu_ffn_ln").inputs]
    views = list(args)
    views[names.index("x")] = torch.cat([args[0], args[0]], dim=1)[:, 256:]
    w2 = names.index("w2t")
    views[w2] = args[w2].t().contiguous().t()
    views[names.index("a")] = torch.stack([args[-1], args[-1]], dim=1)[:, 0]
    assert not any(v.is_contiguous() for v in (views[0], views[w2], views[-1]))
    fn = op("swiglu_ffn_ln")
    got = _gradients(fn, views, grads, None)
    want = _gradients(fn, args, grads, None)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    assert all(g.dtype == a.dtype for g, a in zip(got, args, strict=True))


if __name__ == "__main__":  # the figures of docs/autodiff.md: python -m tests.codegen.test_ffn_backward_rows
    for spec in sorted(FORMULAS):
        rows = [d for seed in range(11, 17) for d in distances(spec, seed)]
        held = sum(k <= max(BAR, 2 * e) for _, k, e in rows)
        print(f"{spec}: kernel <= {max(r[1] for r in rows):.1e}, f32 eager <= {max(r[2] for r in rows):.1e}, "
              f"the test's bar holds on {held} of {len(rows)} gradients (seeds 11..16)")
