"""The variant gallery: each generated kernel against an independent hand-written torch formula."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fusegen.sim import load_module

GENERATED = Path(__file__).resolve().parents[2] / "generated"
R, K, I = 130, 256, 300  # ragged rows and intermediate
LIMIT = 0.5  # the clamped SwiGLU's bound: low enough that most activations (|h| > 0.5: ~60%) clamp
Tensors = dict[str, torch.Tensor]


def _data(seed: int) -> Tensors:
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale

    weights = {n: randn(K, I, scale=K**-0.5).bfloat16() for n in ("w1t", "wgt", "wut")}
    return {
        "x": randn(R, K).bfloat16(),
        **weights,
        "w2t": randn(I, K, scale=I**-0.5).bfloat16(),
        "b1": randn(I),
        "bg": randn(I),
        "b2": randn(K),
        "a": randn(R, K),
        "gamma": 1 + 0.1 * randn(K),
        "beta": 0.1 * randn(K),
        "ls": 0.1 * randn(K),
    }


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """bf16 operands, f32 accumulation (what the tensor engine does)."""
    return a.float() @ b.float()


def down(h: torch.Tensor, d: Tensors, w: str = "w2t") -> torch.Tensor:
    return mm(h.bfloat16(), d[w])


def swiglu(d: Tensors) -> torch.Tensor:
    return down(F.silu(mm(d["x"], d["w1t"]) + d["b1"]) * (mm(d["x"], d["wgt"]) + d["bg"]), d) + d["b2"]


def rmsnorm(v: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * weight


CASES: dict[str, tuple[tuple[str, ...], dict[str, float], Callable[[Tensors], tuple[torch.Tensor, ...]]]] = {
    "geglu_ffn": (
        ("x", "w1t", "b1", "wgt", "bg", "w2t", "b2"),
        {},
        lambda d: (
            down(
                F.gelu(mm(d["x"], d["w1t"]) + d["b1"], approximate="tanh") * (mm(d["x"], d["wgt"]) + d["bg"]),
                d,
            )
            + d["b2"],
        ),
    ),
    "gelu_mlp": (
        ("x", "w1t", "b1", "w2t", "b2"),
        {},
        lambda d: (down(F.gelu(mm(d["x"], d["w1t"]) + d["b1"]), d) + d["b2"],),
    ),
    "relu2_mlp": (("x", "w1t", "w2t"), {}, lambda d: (down(torch.relu(mm(d["x"], d["w1t"])) ** 2, d),)),
    "llama_swiglu": (
        ("x", "wgt", "wut", "wdt"),
        {},
        lambda d: (down(F.silu(mm(d["x"], d["wgt"])) * mm(d["x"], d["wut"]), d),),
    ),
    "swiglu_rmsnorm": (
        ("x", "w1t", "b1", "wgt", "bg", "w2t", "b2", "a", "gamma"),
        {"eps": 1e-6},
        lambda d: (swiglu(d) + d["a"], rmsnorm(swiglu(d) + d["a"], d["gamma"], 1e-6)),
    ),
    "swiglu_layernorm_affine": (
        ("x", "w1t", "b1", "wgt", "bg", "w2t", "b2", "a", "gamma", "beta"),
        {"eps": 1e-5},
        lambda d: (swiglu(d) + d["a"], F.layer_norm(swiglu(d) + d["a"], (K,), d["gamma"], d["beta"], 1e-5)),
    ),
    "swiglu_gemma_norm": (
        ("x", "w1t", "wgt", "w2t", "a", "gamma"),
        {"eps": 1e-6},
        lambda d: (
            down(F.silu(mm(d["x"], d["w1t"])) * mm(d["x"], d["wgt"]), d) + d["a"],
            rmsnorm(
                down(F.silu(mm(d["x"], d["w1t"])) * mm(d["x"], d["wgt"]), d) + d["a"], 1 + d["gamma"], 1e-6
            ),
        ),
    ),
    "swiglu_layerscale": (
        ("x", "w1t", "b1", "wgt", "bg", "w2t", "b2", "ls", "a"),
        {"eps": 1e-6},
        lambda d: (F.layer_norm(d["a"] + d["ls"] * swiglu(d), (K,), eps=1e-6),),
    ),
    "packed_clamped_swiglu": (
        ("x", "w12t", "w2t"),
        {"limit": LIMIT},
        lambda d: (
            down(
                F.silu(mm(d["x"], d["wgt"]).clamp(max=LIMIT)) * mm(d["x"], d["wut"]).clamp(-LIMIT, LIMIT), d
            ),
        ),
    ),
    "prenorm_swiglu": (
        ("x", "gamma", "wgt", "wut", "wdt"),
        {"eps": 1e-6},
        lambda d: (
            d["x"].float()
            + down(
                F.silu(mm(rmsnorm(d["x"].float(), d["gamma"], 1e-6).bfloat16(), d["wgt"]))
                * mm(rmsnorm(d["x"].float(), d["gamma"], 1e-6).bfloat16(), d["wut"]),
                d,
            ),
        ),
    ),
}


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("name", sorted(CASES))
def test_variant_matches_independent_formula(name: str, lnc: int) -> None:
    arg_names, params, formula = CASES[name]
    data = _data(seed=len(name))
    data["wdt"] = data["w2t"]  # the Llama-style specs name the down weight wdt
    data["w12t"] = torch.cat((data["wgt"], data["wut"]), dim=1)  # packed [gate | up]
    module = load_module(GENERATED / name / "kernel.py", target="trn2")
    got = getattr(module, name)(*(data[n] for n in arg_names), **params, lnc=lnc)
    got = got if isinstance(got, tuple) else (got,)
    for out, want in zip(got, formula(data), strict=True):
        rtol = 2e-2 if out.dtype == torch.bfloat16 else 1e-3
        err = (out.float() - want.to(out.dtype).float()).abs().max().item()
        bound = 1e-5 + rtol * want.abs().max().item()
        assert err <= bound, f"{name}: max error {err:.3e} > {bound:.3e}"
