"""The proj examples plan at published model widths (hidden K, intermediate I, vocabulary V from the models'
public configs) on every target and LNC, decode to long prefill: within SBUF and PSUM, the weights read
once per super-block, and few rows on two cores split the columns."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from fusegen.codegen.budget_base import cdiv, rows_per_core
from fusegen.codegen.build import select_family
from fusegen.codegen.proj.family import PROJ
from fusegen.codegen.rewrites import rewrite
from fusegen.dsl import load_spec
from fusegen.dsl.ir import CheckShape, KernelIR
from fusegen.sim import load_module

ROOT = Path(__file__).resolve().parents[2]
#: (model, K, I, V)
MODELS = (
    ("Llama-3-8B", 4096, 14336, 128256),
    ("Mixtral-8x22B", 6144, 16384, 32768),
    ("Qwen2.5-7B", 3584, 18944, 152064),
    ("Gemma-2-27B", 4608, 36864, 256000),
    ("DeepSeek-V3", 7168, 18432, 129280),
    ("Llama-3-70B", 8192, 28672, 128256),
    ("Llama-3.1-405B", 16384, 53248, 128256),
)
#: Llama-3's grouped-query attention: heads of 128, 8 KV heads; (K, query heads)
LLAMA_HEADS = ((4096, 32), (8192, 64), (16384, 128))
ROWS = (1, 128, 2048, 8192)
LAUNCHES = (("trn2", 2), ("trn2", 1), ("trn1", 1))


def _spec(name: str) -> KernelIR:
    path = ROOT / "examples" / f"{name}.spec"
    return rewrite(load_spec(str(path))[0])


def _plan(ir: KernelIR, dims: dict[str, int], target: str, lnc: int):  # type: ignore[no-untyped-def]
    family, match = select_family(ir, "")
    assert family is PROJ
    at = dataclasses.replace(ir, checks=(CheckShape(tuple(sorted(dims.items())), ir.checks[0].span),))
    (plan,) = PROJ.plans(at, match, target, lnc)
    return plan


def _shapes() -> list[tuple[str, dict[str, int]]]:
    out = []
    for _, k, i, v in MODELS:
        out += [("linear_gelu_bias", {"K": k, "N": i}), ("linear_gelu_bias", {"K": k, "N": v})]
        out.append(("out_proj_residual", {"H": k, "K": k}))
    out += [("rmsnorm_qkv", {"K": k, "NQ": 128 * heads, "NKV": 128 * 8}) for k, heads in LLAMA_HEADS]
    return out


@pytest.mark.parametrize(("target", "lnc"), LAUNCHES)
def test_every_published_width_plans_within_the_budget(target: str, lnc: int) -> None:
    specs = {name: _spec(name) for name in ("linear_gelu_bias", "out_proj_residual", "rmsnorm_qkv")}
    for name, widths in _shapes():
        for rows in ROWS:
            plan = _plan(specs[name], {**widths, "R": rows}, target, lnc)
            where = f"{name} {widths} R={rows} {target} LNC={lnc}"
            assert plan.sbuf_bytes <= plan.sbuf_budget and plan.psum_banks <= plan.psum_budget, where
            computed = rows if plan.tile("split_n") else rows_per_core(rows, lnc)
            blocks = cdiv(computed, plan.tile("S"))
            cores = 1 if plan.tile("split_n") else cdiv(rows, computed)
            assert plan.traffic("weights streamed") == plan.traffic("weights") * blocks * cores, where


@pytest.mark.parametrize(("model", "k", "v"), [(m, k, v) for m, k, _, v in MODELS])
def test_decode_at_vocabulary_width_splits_the_columns_over_two_cores(model: str, k: int, v: int) -> None:
    """One row at LNC=2: a row split would leave a core idle; the column split halves each core's weight
    bytes, which bound decode (the modelled time drops to at most 0.6x LNC=1's)."""
    ir = _spec("linear_gelu_bias")
    two = _plan(ir, {"R": 1, "K": k, "N": v}, "trn2", 2)
    one = _plan(ir, {"R": 1, "K": k, "N": v}, "trn2", 1)
    assert two.tile("split_n") == 1, model
    assert two.modeled_ns <= 0.6 * one.modeled_ns, (model, two.modeled_ns, one.modeled_ns)


def test_the_host_plans_exactly_as_the_compiler() -> None:
    """The vendored planner in kernel.py picks the compiler's plan at a published width."""
    module = load_module(ROOT / "generated" / "rmsnorm_qkv" / "kernel.py", target="trn2")
    for rows in (1, 2048):
        dims = {"R": rows, "K": 8192, "NQ": 8192, "NKV": 1024}
        plan = _plan(_spec("rmsnorm_qkv"), dims, "trn2", 2)
        host = module._choose(module._MODEL, module._MACHINES["trn2"], rows, 8192, (8192, 1024, 1024), 2)
        assert (host.s, host.nb, host.split, host.stream) == tuple(
            plan.tile(t) for t in ("S", "NB", "split_n", "stream")
        )
