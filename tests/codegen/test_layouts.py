"""Any layout in, right answer out: every generated host function and op, fed views with storage offsets,
permuted strides, every-other-column slices, stride-0 (expanded) axes and blocks of larger tensors, gives
bit for bit what it gives for their contiguous clones, forward and backward."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest
import torch

from fusegen.codegen.backward import differentiate
from fusegen.codegen.build import select_family
from fusegen.codegen.rewrites import rewrite
from fusegen.dsl.ir import KernelIR, eval_shape
from tests.codegen.boundary import (
    KERNELS,
    TORCH_DTYPES,
    as_tuple,
    has_backward_kernel,
    has_prep,
    inputs,
    kernel,
    op,
    small_dims,
    spec_ir,
    trainable,
)


def _offset(t: torch.Tensor) -> torch.Tensor:
    """Contiguous, but 7 elements into its storage (the issue's `[2:]` repro)."""
    buffer = torch.zeros(t.numel() + 7, dtype=t.dtype)
    view = buffer[7:].view(t.shape)
    view.copy_(t)
    return view


def _transposed(t: torch.Tensor) -> torch.Tensor:
    """Transposed, made contiguous, transposed back: column-major strides (1-D: every other element)."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2) if t.dim() > 1 else _every_other(t)


def _every_other(t: torch.Tensor) -> torch.Tensor:
    """Every other column of a twice-as-wide tensor."""
    buffer = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    buffer[..., ::2] = t
    return buffer[..., ::2]


def _expanded(t: torch.Tensor) -> torch.Tensor:
    """The first row repeated by a stride-0 first axis (a broadcast vector)."""
    return t[:1].expand(t.shape)


def _sliced(t: torch.Tensor) -> torch.Tensor:
    """A block inside a larger tensor: offset start, longer rows."""
    block = tuple(slice(2, 2 + n) for n in t.shape)
    buffer = torch.zeros(*(n + 3 for n in t.shape), dtype=t.dtype)
    buffer[block] = t
    return buffer[block]


def _unit_axes_strided(t: torch.Tensor) -> torch.Tensor:
    """The same values with each one-element axis given a stride of its own, which torch ignores: still
    `is_contiguous()`, as a one-row slice of a wider tensor is."""
    dense = torch.empty(t.shape).stride()
    strides = [s if n != 1 else t.numel() + 5 for n, s in zip(t.shape, dense, strict=True)]
    view = torch.zeros(2 * t.numel() + 8, dtype=t.dtype).as_strided(t.shape, strides, 3)
    view.copy_(t)
    return view


LAYOUTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "offset": _offset, "transposed": _transposed, "every_other_column": _every_other, "expanded": _expanded,
    "sliced": _sliced,
}  # fmt: skip


def _dense(views: list[torch.Tensor]) -> list[torch.Tensor]:
    """The contiguous clones the views are compared with."""
    return [v.clone().contiguous() for v in views]


def _assert_identical(got: object, want: object) -> None:
    """Same tensors, bit for bit (NaN where NaN)."""
    for g, w in zip(as_tuple(got), as_tuple(want), strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert torch.equal(g.isnan(), w.isnan()) and torch.equal(g[~g.isnan()], w[~w.isnan()])


def _views(name: str, layout: str, seed: int = 0) -> list[torch.Tensor]:
    ir = spec_ir(name)
    views = [LAYOUTS[layout](t) for t in inputs(ir, small_dims(ir), seed)]
    assert layout == "offset" or not all(v.is_contiguous() for v in views)
    return views


def _saving(fn: Callable[..., object]) -> dict[str, bool]:
    """save=True where the host has optional outputs, so they are compared too."""
    return {"save": True} if "save" in inspect.signature(fn).parameters else {}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", KERNELS)
def test_host_function(name: str, layout: str) -> None:
    host = getattr(kernel(name), name)
    views = _views(name, layout)
    _assert_identical(host(*views, **_saving(host)), host(*_dense(views), **_saving(host)))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", KERNELS)
def test_op(name: str, layout: str) -> None:
    views = _views(name, layout)
    _assert_identical(op(name)(*views), op(name)(*_dense(views)))  # type: ignore[operator]


@pytest.mark.parametrize("name", KERNELS)
def test_one_row_with_any_row_stride(name: str) -> None:
    """One row (T = 1), as cut from a wider tensor: torch calls it contiguous whatever its row stride, so it
    reaches the kernel as it is (the interpreter refused to reshape such an input)."""
    ir = spec_ir(name)
    views = [_unit_axes_strided(t) for t in inputs(ir, small_dims(ir, rows=1))]
    assert any(v.is_contiguous() and v.stride() != torch.empty(v.shape).stride() for v in views)
    _assert_identical(op(name)(*views), op(name)(*_dense(views)))  # type: ignore[operator]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", [n for n in KERNELS if has_prep(n)])
def test_fused_weight_host(name: str, layout: str) -> None:
    weights = list(inspect.signature(kernel(name)._fused_weight).parameters)[:-2]
    ir = spec_ir(name)
    views = [v for v, decl in zip(_views(name, layout), ir.inputs, strict=True) if decl.name in weights]
    prep = kernel(name)._fused_weight
    _assert_identical(prep(*views), prep(*_dense(views)))


def _backward_args(name: str, layout: str) -> list[torch.Tensor]:
    """The backward host's arguments: the forward's inputs and saved outputs, random output gradients."""
    ir = spec_ir(name)
    env = small_dims(ir)
    forward = dict(zip((i.name for i in ir.inputs), inputs(ir, env), strict=True))
    host = getattr(kernel(name), name)
    saves = "save" in inspect.signature(host).parameters  # the FFN family saves nothing
    saved = as_tuple(host(*forward.values(), save=True) if saves else host(*forward.values()))
    forward |= dict(zip((o.name for o in ir.outputs), saved, strict=True))
    gen = torch.Generator().manual_seed(1)
    args = [
        forward[d.name] if d.name in forward
        else torch.randn(eval_shape(d.shape, env), generator=gen).to(TORCH_DTYPES[d.dtype])
        for d in _kernel_backward_ir(ir).inputs
    ]  # fmt: skip
    return [LAYOUTS[layout](a) for a in args]


def _kernel_backward_ir(ir: KernelIR) -> KernelIR:
    """The IR the spec's backward kernels compute (its family's backward stage)."""
    family, _ = select_family(rewrite(ir), "")
    back = differentiate(ir, family, "trn2", 2)
    assert back is not None and back.kernels is not None and back.kernels.ir is not None
    return back.kernels.ir


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", [n for n in KERNELS if has_backward_kernel(n)])
def test_backward_host(name: str, layout: str) -> None:
    host = getattr(kernel(name, "backward_kernel.py"), f"{name}_backward")
    views = _backward_args(name, layout)
    _assert_identical(host(*views), host(*_dense(views)))


def _op_gradients(name: str, leaves: list[torch.Tensor], grads: list[torch.Tensor]
                  ) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """Input gradients through the op of sum(<output, grad>) over its differentiable outputs."""
    leaves = [t.detach().requires_grad_(True) for t in leaves]  # detach keeps the layout
    outs = as_tuple(op(name)(*leaves))  # type: ignore[operator]
    pairs = [(o, g) for o, g in zip(outs, grads, strict=True) if o.requires_grad]
    return torch.autograd.grad([o for o, _ in pairs], leaves, [g for _, g in pairs])


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", [n for n in KERNELS if trainable(n)])
def test_op_backward(name: str, layout: str) -> None:
    views = _views(name, layout)
    outs = as_tuple(op(name)(*views))  # type: ignore[operator]
    gen = torch.Generator().manual_seed(2)
    grads = [LAYOUTS[layout](torch.randn(o.shape, generator=gen).to(o.dtype)) for o in outs]
    got = _op_gradients(name, views, grads)
    _assert_identical(got, _op_gradients(name, _dense(views), _dense(grads)))


def test_the_issue_repro_matches_a_hand_written_formula() -> None:
    """`x[2:]` (storage offset 512) into torch.ops.fusegen.add_rmsnorm: y = rmsnorm(x + r) * w, h = x + r."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 256, generator=gen).bfloat16()[2:]
    r, w = torch.randn(4, 256, generator=gen).bfloat16(), torch.randn(256, generator=gen).bfloat16()
    y, h = op("add_rmsnorm")(x, r, w)  # type: ignore[operator]
    s = x.float() + r.float()
    want = s * torch.rsqrt(s.square().mean(-1, keepdim=True) + 1e-6) * w.float()
    assert torch.equal(h, s.bfloat16())
    assert (y.float() - want).abs().max() <= 2e-2 * want.abs().max()
