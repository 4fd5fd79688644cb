"""Ops trained the way training code calls them: inputs as views, expanded or non-contiguous incoming
gradients, one tensor passed twice, activation checkpointing, gradients accumulated over two backward calls.
Each against a float64 formula written here, independently of the spec and of the generated reference."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint as ckpt

from tests.codegen.boundary import as_tuple, op

Formula = Callable[..., torch.Tensor]


def _bf16(t: torch.Tensor) -> torch.Tensor:
    """t rounded to bf16 with an identity gradient, as the ops cast their inputs and bf16(...) in a spec."""
    return t + (t.detach().bfloat16().double() - t.detach())


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * w


def _engram_gate(x: torch.Tensor, kv: torch.Tensor, w_h: torch.Tensor, w_e: torch.Tensor) -> torch.Tensor:
    x, kv, w_h, w_e = (_bf16(t) for t in (x, kv, w_h, w_e))
    heads, width = x.shape[1], x.shape[2]
    s = (_rms(x, w_h, 1e-20) * _rms(kv[:, :heads], w_e, 1e-20)).sum(-1, keepdim=True) / math.sqrt(width)
    return x + torch.sigmoid(torch.sign(s) * torch.sqrt(s.abs().clamp(min=1e-6))) * kv[:, heads:]


def _swiglu_ffn(x, w1t, b1, wgt, bg, w2t, b2):  # type: ignore[no-untyped-def]
    x, w1t, wgt, w2t = (_bf16(t) for t in (x, w1t, wgt, w2t))
    return _bf16(F.silu(x @ w1t + b1) * (x @ wgt + bg)) @ w2t + b2


def _add_rmsnorm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    s = _bf16(x) + _bf16(r)
    return _rms(s, _bf16(w), 1e-6)


_Input = tuple[tuple[int, ...], float, float]  # shape, scale, shift of N(0, 1) values
_NORM_WEIGHT: _Input = ((2, 128), 0.1, 1)
_UP: _Input = ((128, 64), 128**-0.5, 0)
_BIAS: _Input = ((64,), 0.1, 0)
_ROWS: _Input = ((3, 128), 1, 0)
#: op name, formula of its first output, its inputs (weights near 1, projections scaled by 1/sqrt(fan-in))
CASES: dict[str, tuple[Formula, list[_Input]]] = {
    "engram_gate": (_engram_gate, [((3, 2, 128), 1, 0), ((3, 3, 128), 1, 0), _NORM_WEIGHT, _NORM_WEIGHT]),
    "swiglu_ffn": (_swiglu_ffn, [_ROWS, _UP, _BIAS, _UP, _BIAS, ((64, 128), 0.125, 0), ((128,), 0.1, 0)]),
    "add_rmsnorm": (_add_rmsnorm, [_ROWS, _ROWS, ((128,), 0.1, 1)]),
}
#: bf16 inputs and incoming gradients, f32 arithmetic: measured at most 3.9e-3 of the largest gradient element
RTOL = 2e-2


def _inputs(name: str, seed: int = 0) -> list[torch.Tensor]:
    """f32 leaves holding bf16 values (what the op computes with), seeded."""
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(shape, generator=gen) * scale + shift).bfloat16().float()
            for shape, scale, shift in CASES[name][1]]  # fmt: skip


def _close(got: list[torch.Tensor | None], want: list[torch.Tensor | None]) -> None:
    """Each gradient within RTOL of its largest element (None: no gradient reached it, in both)."""
    for g, w in zip(got, want, strict=True):
        assert (g is None) == (w is None)
        if g is not None and w is not None:
            err = (g.double() - w).abs().max().item()
            assert err <= RTOL * w.abs().max().item(), f"max error {err:.3e} of {w.abs().max().item():.3e}"


_Make = Callable[[list[torch.Tensor]], list[torch.Tensor]]
_Grads = list[torch.Tensor | None]


def _grads(name: str, leaves: list[torch.Tensor], make: _Make,
           loss: Callable[[torch.Tensor], torch.Tensor]) -> tuple[_Grads, _Grads]:  # fmt: skip
    """(the op's, the formula's) gradients of loss(first output) w.r.t. `leaves`, the inputs made of them."""
    got = torch.autograd.grad(loss(as_tuple(op(name)(*make(leaves)))[0]), leaves, allow_unused=True)  # type: ignore[operator]
    exact = [t.detach().double().requires_grad_(t.requires_grad) for t in leaves]
    want = torch.autograd.grad(loss(CASES[name][0](*make(exact))), exact, allow_unused=True)
    return list(got), list(want)


def _weighted(out: torch.Tensor) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return (out.double() * torch.randn(out.shape, generator=gen, dtype=torch.float64)).sum()


def _transposed_grad(out: torch.Tensor) -> torch.Tensor:
    """An incoming gradient stored transposed (not contiguous)."""
    gen = torch.Generator().manual_seed(2)
    grad = torch.randn(list(out.shape)[::-1], generator=gen, dtype=torch.float64)
    return (out.double() * grad.permute(*range(out.dim())[::-1])).sum()


def _views(args: list[torch.Tensor]) -> list[torch.Tensor]:
    """Leaves for the views below: x one row (expanded over the rows), others transposed or padded storage."""
    leaves = [args[0][:1].clone()]
    for i, a in enumerate(args[1:]):
        if i % 2 and a.dim() > 1:
            leaves.append(a.t().contiguous())
        else:
            big = torch.randn([s + 2 for s in a.shape])
            big[tuple(slice(1, 1 + s) for s in a.shape)] = a
            leaves.append(big)
    return leaves


def _unview(rows: int) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
    def make(leaves: list[torch.Tensor]) -> list[torch.Tensor]:
        out = [leaves[0].expand(rows, *leaves[0].shape[1:])]
        for i, b in enumerate(leaves[1:]):
            out.append(b.t() if i % 2 and b.dim() > 1 else b[tuple(slice(1, s - 1) for s in b.shape)])
        return out

    return make


@pytest.mark.parametrize("name", CASES)
def test_views_and_incoming_gradients(name: str) -> None:
    """Inputs as an expanded row, transposes and offset slices; incoming gradients expanded (from .sum() and
    .mean()), transposed and zero: the formula's gradients w.r.t. the leaves under the views."""
    args = _inputs(name)
    leaves = [t.requires_grad_(True) for t in _views(args)]
    _close(*_grads(name, leaves, _unview(args[0].shape[0]), _weighted))
    plain = [t.requires_grad_(True) for t in _inputs(name)]
    for loss in (_transposed_grad, lambda out: out.double().sum(), lambda out: out.double().mean()):
        _close(*_grads(name, plain, list, loss))
    got, _ = _grads(name, plain, list, lambda out: (out.double() * 0).sum())
    assert all(g is not None and not g.any() for g in got)


@pytest.mark.parametrize("name", CASES)
def test_one_tensor_passed_twice_and_some_inputs_trained(name: str) -> None:
    """The first two inputs of one shape passed as one tensor (x + x, a shared RMSNorm weight, one up weight
    for both projections) gets the sum of both gradients; with every other input requiring grad, each its
    own."""
    args = _inputs(name)
    pairs = [(i, j) for i in range(len(args)) for j in range(i + 1, len(args))]
    same = next((i, j) for i, j in pairs if args[i].shape == args[j].shape)
    leaves = [t.requires_grad_(True) for t in args]

    def shared(ts: list[torch.Tensor]) -> list[torch.Tensor]:
        return [ts[same[0]] if k == same[1] else t for k, t in enumerate(ts)]

    _close(*_grads(name, leaves, shared, _weighted))
    some = [t.detach().requires_grad_(k % 2 == 1) for k, t in enumerate(args)]
    got, want = _grads(name, [t for t in some if t.requires_grad], lambda ts: _merge(some, ts), _weighted)
    _close(got, want)


def _merge(all_inputs: list[torch.Tensor], trained: list[torch.Tensor]) -> list[torch.Tensor]:
    """all_inputs with the ones requiring grad replaced, in order, by `trained` (the same or fp64 copies)."""
    it = iter(trained)
    return [next(it) if t.requires_grad else t.to(trained[0].dtype) for t in all_inputs]


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("name", CASES)
def test_checkpointed_gradients_accumulate(name: str, reentrant: bool) -> None:
    """Under torch.utils.checkpoint (the op recomputed in the backward), backward twice through one graph
    (retain_graph) and once through a second: .grad holds three times the formula's gradients."""
    leaves = [t.requires_grad_(True) for t in _inputs(name)]
    (_, want) = _grads(name, leaves, list, _weighted)
    first = lambda *ts: as_tuple(op(name)(*ts))[0]  # type: ignore[operator]  # noqa: E731
    loss = _weighted(ckpt.checkpoint(first, *leaves, use_reentrant=reentrant))
    loss.backward(retain_graph=True)
    loss.backward()
    _weighted(as_tuple(op(name)(*leaves))[0]).backward()  # type: ignore[operator]
    _close([t.grad for t in leaves], [3 * w for w in want if w is not None])
