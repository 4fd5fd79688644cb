"""Validate at the door: a bad argument to a generated host function or op is a TypeError / ValueError that
names the argument (or the `require` line), the expected and the actual, before any kernel runs; a call
with a zero-size dim returns its empty outputs; the LNC degree follows the target."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from fusegen.codegen.files import ops as ops
from fusegen.testing import load_generated
from tests.codegen.boundary import GENERATED, as_tuple, inputs, kernel, op, small_dims, spec_ir

BF16, F32 = torch.bfloat16, torch.float32


def _args(name: str, **dims: int) -> list[torch.Tensor]:
    """Inputs at the small dims, some overridden."""
    ir = spec_ir(name)
    return inputs(ir, {**small_dims(ir), **dims})


def _with(name: str, changes: dict[int, object], **dims: int) -> list[object]:
    """Inputs with argument i replaced by changes[i]."""
    args: list[object] = list(_args(name, **dims))
    for i, value in changes.items():
        args[i] = value
    return args


def host(name: str, changes: dict[int, object] | None = None, **kwargs: object) -> Callable[[], object]:
    """A call of kernel.py's host function with some arguments replaced."""
    return lambda: getattr(kernel(name), name)(*_with(name, changes or {}), **kwargs)


def call_op(name: str, changes: dict[int, object]) -> Callable[[], object]:
    """A call of torch.ops.fusegen.<name> with some arguments replaced."""
    return lambda: op(name)(*_with(name, changes))  # type: ignore[operator]


def fused(name: str, args: list[object], **kwargs: object) -> Callable[[], object]:
    return lambda: kernel(name)._fused_weight(*args, **kwargs)


def backward(name: str, changes: dict[int, object], **kwargs: object) -> Callable[[], object]:
    """engram-style backward host: (inputs, saved dot, gate, rstd_x, rstd_k, d_out), changed."""
    def run() -> object:
        x, kv, w_h, w_e = _args(name)
        saved = getattr(kernel(name), name)(x, kv, w_h, w_e, save=True)[1:]
        args: list[object] = [x, kv, w_h, w_e, *saved, torch.randn(x.shape).to(BF16)]
        for i, value in changes.items():
            args[i] = value
        return getattr(kernel(name, "backward_kernel.py"), f"{name}_backward")(*args, **kwargs)

    return run


def t(*shape: int, dtype: torch.dtype = BF16, device: str = "cpu") -> torch.Tensor:
    """A tensor of `shape` (random on the CPU, no data on meta)."""
    if device != "cpu":
        return torch.empty(shape, dtype=dtype, device=device)
    return torch.randn(shape).to(dtype)


@dataclass(frozen=True)
class Bad:
    """One bad call: what it is, the call, the exception type and what the message must say."""

    label: str
    call: Callable[[], object]
    error: type[Exception]
    says: str  # a literal the message contains


FFN, ROW, ENGRAM, HC8, QK = "swiglu_ffn", "add_rmsnorm", "engram_gate", "engram_gate_hc8", "qk_norm"
# swiglu_ffn: x[R, K] w1t[K, I] b1[I] wgt[K, I] bg[I] w2t[I, K] b2[K] at R=3 K=128 I=3
# add_rmsnorm: x[T, H] r[T, H] w[H] at T=3 H=128;  qk_norm: q[T, NH, D] w[D] at T=3 NH=3 D=32
# engram_gate: x[T, HC, H] kv[T, HC + 1, H] w_h[HC, H] w_e[HC, H] at T=3 HC=3 H=128 (hc8: HC = 8 fixed)
CASES = [
    Bad("ffn w1t shape", host(FFN, {1: t(384, 384)}), ValueError,
        "swiglu_ffn: w1t: expected [K=128, I] (K from x), got [384, 384]"),
    Bad("ffn w2t both dims bound", host(FFN, {5: t(4, 128)}), ValueError,
        "w2t: expected [I=3, K=128] (I from w1t; K from x), got [4, 128]"),
    Bad("ffn b2 length", host(FFN, {6: t(129, dtype=F32)}), ValueError, "b2: expected [K=128] (K from x)"),
    Bad("ffn b1 rank", host(FFN, {2: t(3, 1, dtype=F32)}), ValueError, "b1: expected 1 dims [I], got 2"),
    Bad("ffn x dtype", host(FFN, {0: t(3, 128, dtype=F32)}), TypeError,
        "x: expected dtype torch.bfloat16, got torch.float32"),
    Bad("ffn x not a tensor", host(FFN, {0: [[1.0] * 128] * 3}), TypeError,
        "x: expected a torch.Tensor [R, K], got list"),
    Bad("ffn require K % 128", host(FFN, {0: t(3, 200)}), ValueError,
        "requires K % 128 == 0, got K=200 (from x)"),
    Bad("ffn require R <= 65536", host(FFN, {0: t(65537, 128)}), ValueError,
        "requires R <= 65536, got R=65537 (from x)"),
    Bad("ffn I=0 leaves out non-empty", host(FFN, {1: t(128, 0), 2: t(0, dtype=F32), 3: t(128, 0),
                                                   4: t(0, dtype=F32), 5: t(0, 128)}),
        ValueError, "I=0 leaves output out non-empty"),
    Bad("ffn unknown target", host(FFN, target="trn9"), ValueError,
        "target='trn9' is not a target it plans for; known targets: trn1, trn2"),
    Bad("ffn lnc 2 on trn1", host(FFN, target="trn1", lnc=2), ValueError, "lnc=2 is not available on trn1"),
    Bad("ffn lnc 3", host(FFN, lnc=3), ValueError, "lnc=3 is not available on trn2"),
    Bad("ffn lnc as text", host(FFN, lnc="2"), TypeError, "lnc: expected an int, got str"),
    Bad("ffn meta device", host(FFN, dict(enumerate(t(*a.shape, dtype=a.dtype, device="meta")
                                                    for a in _args(FFN)))),
        ValueError, "no backend for device meta"),
    Bad("ffn op w1t shape", call_op(FFN, {1: t(384, 384)}), ValueError,
        "fusegen::swiglu_ffn: w1t: expected [K=128, I] (K from x)"),
    Bad("ffn op integer x", call_op(FFN, {0: torch.ones(3, 128, dtype=torch.int32)}), TypeError,
        "x: expected a floating-point tensor (cast to torch.bfloat16), got torch.int32"),
    Bad("ffn op fake (meta) b2", call_op(FFN, {i: t(*s, dtype=d, device="meta") for i, (s, d) in enumerate(
        [((3, 128), BF16), ((128, 3), BF16), ((3,), F32), ((128, 3), BF16), ((3,), F32), ((3, 128), BF16),
         ((64,), F32)])}), ValueError, "b2: expected [K=128] (K from x), got [64]"),
    Bad("row r width", host(ROW, {1: t(3, 256)}), ValueError,
        "add_rmsnorm: r: expected [T=3, H=128] (T, H from x), got [3, 256]"),
    Bad("row r rows", host(ROW, {1: t(4, 128)}), ValueError,
        "r: expected [T=3, H=128] (T, H from x), got [4, 128]"),
    Bad("row w length", host(ROW, {2: t(256)}), ValueError, "w: expected [H=128] (H from x), got [256]"),
    Bad("row x rank", host(ROW, {0: t(3, 1, 128)}), ValueError, "x: expected 2 dims [T, H], got 3"),
    Bad("row op batched x", call_op(ROW, {0: t(2, 3, 128)}), ValueError,
        "x: expected 2 dims [T, H], got 3: [2, 3, 128]; fold the extra leading dims into T: x.flatten(0, 1)"),
    Bad("engram batched kv", host(ENGRAM, {1: t(2, 3, 4, 128)}), ValueError,
        "kv: expected 3 dims [T, HC + 1, H], got 4: [2, 3, 4, 128]; fold the extra leading dims into T: "
        "kv.flatten(0, 1)"),
    Bad("row require H % 128", host(ROW, {0: t(3, 200), 1: t(3, 200), 2: t(200)}), ValueError,
        "requires H % 128 == 0, got H=200 (from x)"),
    Bad("row sparse x", host(ROW, {0: t(3, 128).to_sparse()}), TypeError,
        "add_rmsnorm: x: expected a dense (strided) tensor, got a sparse_coo one: pass .to_dense()"),
    Bad("row op sparse r", call_op(ROW, {1: t(3, 128).to_sparse()}), TypeError,
        "fusegen::add_rmsnorm: r: expected a dense (strided) tensor, got a sparse_coo one"),
    Bad("row eps text", host(ROW, eps="1e-6"), TypeError, "eps: expected a number, got str '1e-6'"),
    Bad("row eps bool", host(ROW, eps=True), TypeError, "eps: expected a number, got bool"),
    Bad("row eps tensor", host(ROW, eps=torch.tensor(1e-6, requires_grad=True)), TypeError,
        "eps: expected a number, got Tensor tensor(1.0000e-06, requires_grad=True): the kernel takes eps as "
        "a constant (no gradient); pass float(eps)"),
    Bad("row eps past f32", host(ROW, eps=1e300), ValueError,
        "add_rmsnorm: eps: 1e+300 is outside the f32 range of the spec's params"),
    Bad("row op eps past f32", lambda: op(ROW)(*_args(ROW), 3.5e38), ValueError,  # type: ignore[operator]
        "fusegen::add_rmsnorm: eps: 3.5e+38 is outside the f32 range"),
    Bad("row mixed devices", host(ROW, {1: t(3, 128, device="meta")}), ValueError,
        "r is on meta but x on cpu"),
    Bad("row default lnc on trn1 ok, lnc 2 not", host(ROW, target="trn1", lnc=2), ValueError,
        "lnc=2 is not available on trn1, which has no logical cores"),
    Bad("row op r shape", call_op(ROW, {1: t(3, 256)}), ValueError, "fusegen::add_rmsnorm: r: expected"),
    Bad("row fused_weight rank", fused(ROW, [t(1, 128)]), ValueError, "fused_weight: w: expected 1 dims [H]"),
    Bad("row fused_weight target", fused(ROW, [t(128)], target="trn9"), ValueError, "target='trn9'"),
    Bad("layernorm x dtype", host("layernorm", {0: t(3, 3, dtype=torch.float16)}), TypeError,
        "x: expected dtype torch.bfloat16, got torch.float16"),
    Bad("layernorm too wide names the kernel", host("layernorm", {0: t(3, 30000), 1: t(30000, dtype=F32),
                                                                2: t(30000, dtype=F32)}),
        ValueError, "layernorm: no tile plan fits: width 30000"),
    Bad("op too wide names the kernel", call_op("layernorm", {0: t(3, 30000), 1: t(30000, dtype=F32),
                                                              2: t(30000, dtype=F32)}),
        ValueError, "layernorm: no tile plan fits: width 30000"),
    Bad("softmax scale", host("scaled_softmax", scale=None), TypeError,
        "scale: expected a number, got NoneType"),
    Bad("softmax scale, an int past f32 and float", host("scaled_softmax", scale=10**400), ValueError,
        "scale: 1000000000"),
    Bad("qk require D % 32", host(QK, {0: t(3, 3, 48), 1: t(48)}), ValueError,
        "requires D % 32 == 0, got D=48 (from q)"),
    Bad("qk w length", host(QK, {1: t(64)}), ValueError, "w: expected [D=32] (D from q), got [64]"),
    Bad("qk lnc 0", host(QK, lnc=0), ValueError, "lnc=0 is not available on trn2"),
    Bad("engram kv heads", host(ENGRAM, {1: t(3, 3, 128)}), ValueError,
        "engram_gate: kv: expected [T=3, HC+1=4, H=128] (T, HC, H from x), got [3, 3, 128]"),
    Bad("engram w_h heads", host(ENGRAM, {2: t(4, 128)}), ValueError,
        "w_h: expected [HC=3, H=128] (HC, H from x), got [4, 128]"),
    Bad("engram require HC <= 8", host(ENGRAM, {0: t(3, 9, 128), 1: t(3, 10, 128), 2: t(9, 128),
                                               3: t(9, 128)}),
        ValueError, "requires HC <= 8, got HC=9 (from x)"),
    Bad("engram x dtype", host(ENGRAM, {0: t(3, 3, 128, dtype=F32)}), TypeError,
        "x: expected dtype torch.bfloat16"),
    Bad("engram clamp", host(ENGRAM, clamp="small"), TypeError, "clamp: expected a number, got str"),
    Bad("engram clamp past f32", host(ENGRAM, clamp=-1e39), ValueError, "clamp: -1e+39 is outside the f32"),
    Bad("engram save, bad target", host(ENGRAM, save=True, target="inf2"), ValueError, "target='inf2'"),
    Bad("engram op kv", call_op(ENGRAM, {1: t(3, 3, 128)}), ValueError, "fusegen::engram_gate: kv: expected"),
    Bad("engram fused_weight w_e", fused(ENGRAM, [t(3, 128), t(2, 128)]), ValueError,
        "w_e: expected [HC=3, H=128] (HC, H from w_h), got [2, 128]"),
    Bad("hc8 fixed heads", host(HC8, {0: t(3, 4, 128)}), ValueError,
        "x: expected [T, HC=8, H] (HC fixed by the spec), got [3, 4, 128]"),
    Bad("hc8 w_e heads", host(HC8, {3: t(4, 128)}), ValueError,
        "w_e: expected [HC=8, H=128] (HC fixed by the spec; H from x), got [4, 128]"),
    Bad("backward d_out", backward(ENGRAM, {8: t(3, 3, 256)}), ValueError,
        "engram_gate_backward: d_out: expected [T=3, HC=3, H=128] (T, HC, H from x), got [3, 3, 256]"),
    Bad("backward saved dot dtype", backward(ENGRAM, {4: t(3, 3)}), TypeError,
        "dot: expected dtype torch.float32, got torch.bfloat16"),
    Bad("backward saved rstd_x heads", backward(ENGRAM, {6: t(3, 4, dtype=F32)}), ValueError,
        "rstd_x: expected [T=3, HC=3] (T, HC from x), got [3, 4]"),
    Bad("backward lnc 2 on trn1", backward(ENGRAM, {}, target="trn1", lnc=2), ValueError,
        "lnc=2 is not available on trn1"),
    Bad("backward hc8 fixed heads", backward(HC8, {2: t(3, 128)}), ValueError,
        "w_h: expected [HC=8, H=128] (HC fixed by the spec; H from x), got [3, 128]"),
]


def test_a_backward_past_its_token_sums_names_the_kernel_and_dims() -> None:
    """HC * H past one PSUM bank: the message said neither which kernel nor the values."""
    x, kv, w_h, w_e, d_out = t(2, 8, 8320), t(2, 9, 8320), t(8, 8320), t(8, 8320), t(2, 8, 8320)
    saved = [torch.ones(2, 8, dtype=F32) for _ in range(4)]
    says = ("engram_gate_backward: sums over the tokens need H % 128 == 0 and HC * H <= 65536 (one PSUM "
            "bank), got HC=8, H=8320")  # fmt: skip
    with pytest.raises(ValueError, match=re.escape(says)):
        kernel(ENGRAM, "backward_kernel.py").engram_gate_backward(x, kv, w_h, w_e, *saved, d_out)


def test_enough_cases_across_families() -> None:
    assert len(CASES) >= 40
    assert len({c.label for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label)
def test_bad_argument_is_named(case: Bad) -> None:
    with pytest.raises(case.error, match=re.escape(case.says)):
        case.call()


def test_torch_compile_reports_a_bad_argument_at_trace_time() -> None:
    """The op's fake runs the same checks, so tracing fails with the door's message, before any kernel."""
    x, w = t(3, 128), t(256)
    add_rmsnorm = op(ROW)
    compiled = torch.compile(lambda x, w: add_rmsnorm(x, x, w), backend="eager", fullgraph=True)  # type: ignore[operator]
    says = re.escape("fusegen::add_rmsnorm: w: expected [H=128] (H from x), got [256]")
    with pytest.raises(torch._dynamo.exc.TorchRuntimeError, match=says) as caught:
        compiled(x, w)
    assert "ValueError" in str(caught.value)  # the door's exception, wrapped by dynamo


def test_a_device_without_backend_is_named() -> None:
    module = ops.load_ops(ROW, GENERATED)
    with pytest.raises(ValueError, match="no backend for device meta"):
        module._backend(torch.device("meta"))


# ---- zero-size dims: empty outputs without a launch ----


def _kernels(name: str) -> list[object]:
    """The @nki.jit kernels of kernel.py (each keeps its last launch)."""
    return [v for v in vars(kernel(name)).values() if hasattr(v, "launch")]


@pytest.mark.parametrize(("name", "rows"), [(FFN, "R"), (ROW, "T"), (QK, "T"), (ENGRAM, "T")])
def test_zero_rows_give_empty_outputs_without_a_launch(name: str, rows: str) -> None:
    args = _args(name, **{rows: 0})
    reference = load_generated(GENERATED / name / "reference.py")
    want = as_tuple(getattr(reference, f"{name}_reference")(*args))
    for k in _kernels(name):
        k.last_run = None  # type: ignore[attr-defined]
    got = as_tuple(getattr(kernel(name), name)(*args))
    assert all(k.last_run is None for k in _kernels(name))  # type: ignore[attr-defined]
    via_op = as_tuple(op(name)(*args))[: len(want)]  # type: ignore[operator]  # a trainable op adds saved ones
    for out in (got, via_op):
        assert [(o.shape, o.dtype) for o in out] == [(w.shape, w.dtype) for w in want]
        assert all(o.numel() == 0 for o in out)


def test_zero_rows_backward_gives_zero_weight_gradients() -> None:
    x, kv, w_h, w_e = _args(ENGRAM, T=0)
    saved = [torch.zeros(0, 3, dtype=F32) for _ in range(4)]
    grads = kernel(ENGRAM, "backward_kernel.py").engram_gate_backward(x, kv, w_h, w_e, *saved, t(0, 3, 128))
    assert [g.shape for g in grads] == [(0, 3, 128), (0, 4, 128), (3, 128), (3, 128)]
    assert all(g.dtype == F32 and not g.any() for g in grads)
    leaves = [a.clone().requires_grad_(True) for a in (x, kv, w_h, w_e)]
    op(ENGRAM)(*leaves)[0].sum().backward()  # type: ignore[operator]
    assert leaves[2].grad is not None and leaves[2].grad.shape == (3, 128) and not leaves[2].grad.any()


# ---- the LNC degree follows the target ----


@pytest.mark.parametrize(("target", "grid"), [("trn1", 1), ("trn2", 2), ("trn3", 2)])
def test_default_lnc_follows_the_target(target: str, grid: int, monkeypatch: pytest.MonkeyPatch) -> None:
    module = kernel(ROW)
    monkeypatch.setattr(module, "_LNC", 2)
    module.add_rmsnorm(*_args(ROW), target=target)
    assert module.add_rmsnorm_kernel.last_run.stats["grid"] == grid


@pytest.mark.parametrize("default", [0, -1])
def test_a_default_lnc_that_is_no_degree_is_named(default: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """NEURON_LOGICAL_NC_CONFIG=0 reached the launch as a grid of 0 (a SimError traceback from launch)."""
    module = kernel(ROW)
    monkeypatch.setattr(module, "_LNC", default)
    with pytest.raises(ValueError, match=re.escape(f"the default LNC {default} (NEURON_LOGICAL_NC_CONFIG)")):
        module.add_rmsnorm(*_args(ROW))
    module.add_rmsnorm(*_args(ROW), lnc=1)  # an explicit lnc needs no default
