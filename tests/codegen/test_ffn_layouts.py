"""The FFN host's weight layouts (`_up_layout`, `_down_blocks`): made on every call by default, so any write
to a weight is seen, and reused only inside `cached_layouts()`; results against ffn_formula.py's formula."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest
import torch

from fusegen.codegen.files.ops import cached_layouts, load_ops
from fusegen.sim import load_module
from tests.codegen.ffn_formula import GENERATED, close, inputs, swiglu

SMALL = (5, 128, 64)  # the up weights laid out
WIDE = (1, 2048, 128)  # the planner's column blocks (KC > 0): the down weight laid out too


def _swiglu_ffn() -> ModuleType:
    return load_module(GENERATED / "swiglu_ffn" / "kernel.py", target="trn2")


def _data_copy(w: torch.Tensor, new: torch.Tensor) -> None:
    w.data.copy_(new)  # how EMA updates and many weight loaders write


def _data_rebind(w: torch.Tensor, new: torch.Tensor) -> None:
    w.data = new  # same tensor object, new storage


def _numpy_write(w: torch.Tensor, new: torch.Tensor) -> None:
    # bf16 has no NumPy dtype: its bits, through an int16 NumPy view of the weight's own memory
    w.view(torch.int16).numpy()[...] = new.view(torch.int16).numpy()


def _layouts(module: ModuleType, w: torch.Tensor) -> list[torch.Tensor]:
    """The layouts the host holds for weights stored in w's storage."""
    storage = w.untyped_storage()._cdata
    return [entry[2] for key, entry in module._LAID_OUT.items() if key[0] == storage]


WRITES = [_data_copy, _data_rebind, _numpy_write]


@pytest.mark.parametrize("write", WRITES, ids=["data.copy_", "data=", "numpy"])
@pytest.mark.parametrize(("shape", "weight"), [(SMALL, 1), (SMALL, 3), (WIDE, 5)], ids=["w1t", "wgt", "w2t"])
def test_a_write_the_version_counter_misses_is_seen_by_the_next_call(
    write: Callable[[torch.Tensor, torch.Tensor], None], shape: tuple[int, int, int], weight: int
) -> None:
    """Issue: the layouts were cached across calls, keyed on the version counter, and these writes left the
    next call computing with the old weight (off by up to 3.8)."""
    module, (r, k, i) = _swiglu_ffn(), shape
    assert (module._choose(module._MODEL, module._MACHINES["trn2"], r, k, i, 1).kc > 0) == (shape == WIDE)
    args = inputs(r, k, i, seed=3)[:7]
    close(module.swiglu_ffn(*args, lnc=1), swiglu(*args).bfloat16(), rtol=2e-2)
    version, new = args[weight]._version, inputs(r, k, i, seed=4)[weight]
    write(args[weight], new)
    assert torch.equal(args[weight], new) and args[weight]._version == version  # unseen by the counter
    close(module.swiglu_ffn(*args, lnc=1), swiglu(*args).bfloat16(), rtol=2e-2)
    assert module._LAID_OUT == {}


def test_inside_the_scope_a_layout_is_reused_and_remade_after_torch_changes_the_weight() -> None:
    """Reused while unchanged (the same object), remade after an in-place torch write (its version moves)
    and after `w.data = new` (its storage changes), results following the weight; all dropped on exit."""
    module = _swiglu_ffn()
    x, w1t, b1, wgt, bg, w2t, b2, _ = inputs(5, 256, 200, seed=7)
    with module.swiglu_ffn.cached_layouts():
        module.swiglu_ffn(x, w1t, b1, wgt, bg, w2t, b2, lnc=1)
        (first,) = _layouts(module, w1t)
        # the layout itself: out[h, p, kt * 128 + c] = w[kt * 128 + p, h * 128 + c], zero-padded
        assert torch.equal(first[1, 3, 128 + 5], w1t[128 + 3, 128 + 5]) and first[1, 3, 127].item() == 0.0
        module.swiglu_ffn(x, w1t, b1, wgt, bg, w2t, b2, lnc=1)
        assert [t is first for t in _layouts(module, w1t)] == [True]
        w1t.mul_(2.0)
        out = module.swiglu_ffn(x, w1t, b1, wgt, bg, w2t, b2, lnc=1)
        (second,) = _layouts(module, w1t)
        assert second is not first
        close(out, swiglu(x, w1t, b1, wgt, bg, w2t, b2).bfloat16(), rtol=2e-2)
        w1t.data = inputs(5, 256, 200, seed=8)[1]
        out = module.swiglu_ffn(x, w1t, b1, wgt, bg, w2t, b2, lnc=1)
        (third,) = _layouts(module, w1t)
        assert third is not second
        close(out, swiglu(x, w1t, b1, wgt, bg, w2t, b2).bfloat16(), rtol=2e-2)
    assert module._LAID_OUT == {}


def test_a_fresh_view_each_call_reuses_the_layout_and_nested_scopes_drop_it_at_the_outermost() -> None:
    """nn.Linear-style weights passed as `weight.t()` (a new view every call) hit: the key is the storage."""
    module = _swiglu_ffn()
    x, w1t, b1, wgt, bg, w2t, b2, _ = inputs(5, 256, 200, seed=11)
    w1, wg = w1t.t().contiguous(), wgt.t().contiguous()  # [I, K], as nn.Linear stores them
    with module.swiglu_ffn.cached_layouts():
        module.swiglu_ffn(x, w1.t(), b1, wg.t(), bg, w2t, b2, lnc=1)
        (first,) = _layouts(module, w1)
        with module.swiglu_ffn.cached_layouts():
            out = module.swiglu_ffn(x, w1.t(), b1, wg.t(), bg, w2t, b2, lnc=1)
        assert [t is first for t in _layouts(module, w1)] == [True]
        close(out, swiglu(x, w1t, b1, wgt, bg, w2t, b2).bfloat16(), rtol=2e-2)
    assert module._LAID_OUT == {}


def test_the_op_path_enters_the_scope_of_the_kernel_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """`cached_layouts(name)`: torch.ops.fusegen.<name> reuses the layouts inside, like the host function."""
    monkeypatch.setenv("FUSEGEN_OPS_BACKEND", "interpreter")
    ops = load_ops("swiglu_ffn", GENERATED)
    kernel = ops._kernel_module(ops._backend(torch.device("cpu")))
    args = inputs(*SMALL, seed=9)[:7]
    with cached_layouts("swiglu_ffn", out_dir=GENERATED):
        out = torch.ops.fusegen.swiglu_ffn(*args)
        (first,) = _layouts(kernel, args[1])
        torch.ops.fusegen.swiglu_ffn(*args)
        assert [t is first for t in _layouts(kernel, args[1])] == [True]
    assert kernel._LAID_OUT == {}
    close(out, swiglu(*args).bfloat16(), rtol=2e-2)


def _train(steps: int, scope: Callable[[], object]) -> list[torch.Tensor]:
    """The op's outputs over `steps` fused-AdamW steps on bf16 weights, inside `scope()`."""
    x, w1t, b1, wgt, bg, w2t, b2 = inputs(*SMALL, seed=12)[:7]
    params = [torch.nn.Parameter(w) for w in (w1t, b1, wgt, bg, w2t, b2)]
    opt = torch.optim.AdamW(params, lr=1e-2, fused=True)  # writes in place without moving the version counter
    outs = []
    with scope():  # type: ignore[attr-defined]
        for _ in range(steps):
            out = torch.ops.fusegen.swiglu_ffn(x, *params)
            opt.zero_grad()
            out.float().square().mean().backward()
            opt.step()
            with torch.no_grad():  # an evaluation between steps, cached as inference calls are
                outs.append(torch.ops.fusegen.swiglu_ffn(x, *params))
    return outs


def test_training_inside_the_scope_follows_a_fused_optimizer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue: torch's fused optimizers write the weights without moving their version counter, so inside
    the scope every call after a step computed with the layouts made before it (outputs off by up to 3.2, of
    2.9 at most). Now a weight the op's backward differentiated is laid out anew on every later call."""
    import contextlib

    monkeypatch.setenv("FUSEGEN_OPS_BACKEND", "interpreter")
    load_ops("swiglu_ffn", GENERATED)
    want = _train(2, contextlib.nullcontext)
    got = _train(2, lambda: cached_layouts("swiglu_ffn", out_dir=GENERATED))
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
