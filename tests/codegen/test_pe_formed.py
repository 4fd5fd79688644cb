"""`x + g*v` of bf16 rows and a per-row column, formed in PSUM by the Tensor engine (select_pe.py)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from types import ModuleType

import torch

from fusegen.codegen.select_pe import ACC_BANKS, G_PARTS
from fusegen.sim import load_module

REPO = Path(__file__).parents[2]


@functools.cache
def kernel(name: str) -> ModuleType:
    """The committed generated kernel module, bound to the interpreter."""
    return load_module(REPO / "generated" / name / "kernel.py")


def calls(name: str, function: str) -> list[str]:
    """The `nisa.<call>` names a generated kernel's module-level function makes, in order."""
    tree = ast.parse((REPO / "generated" / name / "kernel.py").read_text())
    body = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)
    found = [n.func for n in ast.walk(body) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
    return [f.attr for f in found if ast.unparse(f.value) == "nisa"]


def test_engram_out_is_formed_in_psum_with_its_diagonals_in_the_per_row_prefix() -> None:
    epilogue = calls("engram_gate", "_head_epilogue")
    assert "scalar_tensor_tensor" not in epilogue
    assert epilogue.count("nc_matmul") == 1 + G_PARTS  # I·x, then one diagonal per part of g
    # the diagonals (the identity scaled per row) are built with the per-row math, ahead of the epilogue: in
    # the chain (`_row_math`) each head's passes run over its own column
    tree = ast.parse((REPO / "generated" / "engram_gate" / "kernel.py").read_text())
    body = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_row_math")
    scaled = [n for n in ast.walk(body) if isinstance(n, ast.Call) and "data=pe_identity" in ast.unparse(n)]
    assert len(scaled) == G_PARTS and all(ast.unparse(n).startswith("nisa.activation(") for n in scaled)
    passes = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_head_passes")
    assert "_row_math(pt, 0, 1," in ast.unparse(passes)


def test_tiles_of_heads_read_their_diagonals_from_the_per_tile_math() -> None:
    """Where a token tile's heads run their per-row math once (tile_math.py), the diagonals are built there,
    one per part of g and head from the head's column, into per-head lists the epilogue indexes (at hc); the
    Scalar engine, freed by that chain, evicts the last 512 columns of the tile's first head."""
    tree = ast.parse((REPO / "generated" / "engram_gate" / "kernel.py").read_text())
    body = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_row_math")
    scaled = [ast.unparse(n) for n in ast.walk(body)
              if isinstance(n, ast.Call) and "data=pe_identity" in ast.unparse(n)]  # fmt: skip
    assert len(scaled) == G_PARTS
    assert all(s.startswith("nisa.activation(") and "j:j + 1]" in s for s in scaled)
    epilogue = ast.unparse(next(n for n in tree.body if isinstance(n, ast.FunctionDef)
                                and n.name == "_head_epilogue"))  # fmt: skip
    assert epilogue.count("[hc][0:pt, 0:pt]") == G_PARTS
    assert "if share and q0 + qw == d_H:" in epilogue
    assert calls("engram_gate", "_head_epilogue").count("activation") == 1
    # the share only in a tile's first head, never per head (slower there: docs/performance.md)
    functions = {n.name: ast.unparse(n) for n in tree.body if isinstance(n, ast.FunctionDef)}
    state = {name: functions[name] for name in ("_tile_passes", "_head_passes")}
    assert "share = h == 0" in state["_tile_passes"] and "hc = h" in state["_tile_passes"]
    assert "share = False" in state["_head_passes"] and "hc = 0" in state["_head_passes"]


def test_without_a_residual_the_rule_does_not_apply() -> None:
    """engram_gate_noresid's out = g*v has no row to add: it keeps its one-instruction product."""
    assert "nc_matmul" not in calls("engram_gate_noresid", "_head_epilogue")


def test_streamed_plans_keep_the_fused_instruction() -> None:
    assert "scalar_tensor_tensor" in calls("engram_gate", "_stream_epilogue")


def test_out_rounds_the_exact_sum_of_the_kernels_own_gate() -> None:
    """out = bf16(x + gate*v) from the kernel's saved gate, in float64: the parts of g carry its 24 bits,
    so only a tie broken the other way by the fp32 accumulation may differ (two parts, 16 bits of g,
    differed at 8.7e-4 of the outputs here; the former scalar_tensor_tensor at 2.7e-5)."""
    gen = torch.Generator().manual_seed(3)
    tokens, heads, width = 256, 2, 1024
    shapes = ((tokens, heads, width), (tokens, heads + 1, width), (heads, width), (heads, width))
    x, kv, w_h, w_e = (torch.randn(s, generator=gen).bfloat16() for s in shapes)
    out, _, gate, _, _ = kernel("engram_gate").engram_gate(x, kv, w_h, w_e, save=True, lnc=1)
    want = (x.double() + gate.double().unsqueeze(-1) * kv[:, heads:].double()).bfloat16()
    assert (out != want).double().mean().item() < 1e-4


def test_the_plan_counts_the_diagonals_and_the_accumulation_banks() -> None:
    module = kernel("engram_gate")
    assert module._MODEL.diagonals == G_PARTS * 128 * 2  # [P, P] bf16 per part, per head
    plan = (REPO / "generated" / "engram_gate" / "plan.md").read_text()
    # the prep broadcasts w_h and w_e (a bank each), then the accumulation of out
    assert f"| PSUM banks | {2 + ACC_BANKS} of 8" in plan


def test_rows_too_wide_for_psum_take_the_step_straight_from_sbuf() -> None:
    """Past the 4096 fp32 columns of all PSUM banks a staged step reads both rows from SBUF: silu_and_mul's
    only Scalar work is its silu (the SBUF form once copied the row to fp32 first: a second full-width
    Scalar pass for nothing), and the product is the same as the formula's."""
    width = 4224
    x = torch.randn(130, 2 * width, generator=torch.Generator().manual_seed(5)).bfloat16()
    k = kernel("silu_and_mul")
    y = k.silu_and_mul(x, lnc=1)
    scalar = [r.op for r in k.silu_and_mul_kernel.last_run.trace if r.engine == "scalar"]
    assert len(scalar) == 2, scalar  # one silu per 128-token tile
    assert "nc_matmul" not in [r.op for r in k.silu_and_mul_kernel.last_run.trace]
    want = (torch.nn.functional.silu(x[:, :width].float()) * x[:, width:].float()).bfloat16()
    torch.testing.assert_close(y, want, rtol=0, atol=0)


def test_a_staged_sum_rounded_for_one_output_is_read_again_in_fp32() -> None:
    """add_rmsnorm_fp8 casts `t = x + r` to bf16 for `h` before its RMSNorm reads `t` in fp32: the Tensor
    engine's fp32 sum in PSUM serves both (it was formed again on the Vector engine, 2N, for the norm)."""
    epilogue = calls("add_rmsnorm_fp8", "_head_epilogue")
    assert epilogue.count("nc_matmul") == 2  # I·x + I·r, once
    assert epilogue.count("tensor_tensor") == 1  # the PSUM form's `else` branch only (rows past 8 banks)
