"""The per-row chain of the row kernels: how many [P, 1] steps it takes on which engine, and the launch's
order (docs/performance.md, "Second pass", steps 9-12)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).parents[2]


def function(name: str, function: str) -> ast.FunctionDef:
    """A module-level function of a committed generated kernel."""
    tree = ast.parse((REPO / "generated" / name / "kernel.py").read_text())
    return next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)


def column_steps(body: ast.AST, columns: str = "0:1") -> list[str]:
    """The `nisa` calls in `body` writing per-row columns (`dst=...[0:pt, <columns>]`), as source text."""
    found = []
    for node in ast.walk(body):
        if isinstance(node, ast.Call) and ast.unparse(node.func).startswith("nisa."):
            dst = next((ast.unparse(k.value) for k in node.keywords if k.arg == "dst"), "")
            if dst.endswith(f"[0:pt, {columns}]"):
                found.append(ast.unparse(node))
    return found


def _chunk_loop() -> ast.For:
    """The chunk loop of engram_gate's reduction passes (`_row_passes`, which both passes helpers call)."""
    return next(n for n in function("engram_gate", "_row_passes").body if isinstance(n, ast.For))


def _clamp_branch(body: ast.FunctionDef) -> ast.If:
    """The trace-time `if clamp_arg >= 0.0:` that picks how max(|s|, clamp) is formed."""
    branches = [n for n in ast.walk(body) if isinstance(n, ast.If)]
    return next(n for n in branches if "clamp_arg >= 0.0" in ast.unparse(n.test))


def test_engram_chain_is_fourteen_scalar_steps_per_head() -> None:
    """Per token tile and head, for a clamp >= 0: two rsqrt, two products, abs, relu and its `+ clamp`, sqrt,
    sign, sigmoid and g's three bf16 parts (four steps); 16 before this session's folds: each mean's 1/H was
    a step per chunk. A negative clamp takes one exact Vector maximum instead of relu and `+ clamp`. One
    head runs the tile's chain (`_row_math`) over column 0:1 of its own tiles, its accumulators passed where
    the tile's chain takes their [P, heads] tiles: each step once."""
    passes = function("engram_gate", "_head_passes")
    calls = [n for n in ast.walk(passes) if isinstance(n, ast.Call)]
    assert not [c for c in calls if ast.unparse(c.func).startswith("nisa.")]  # only allocations of its own
    call = next(c for c in calls if ast.unparse(c.func) == "_row_math")
    math = function("engram_gate", "_row_math")
    params = [a.arg for a in math.args.args]
    args = [ast.unparse(a) for a in call.args]
    assert args[:3] == ["pt", "0", "1"] and len(args) == len(params)
    assert all(arg == param.removesuffix("_t") for arg, param in zip(args[3:], params[3:], strict=True))
    other = [s for n in _clamp_branch(math).orelse for s in column_steps(n, "c0:c1")]
    chain = [s for s in column_steps(math, "c0:c1") + column_steps(math, "j:j + 1") if s not in other]
    assert len(chain) == 14
    assert all(s.startswith("nisa.activation(") for s in chain)  # all on the Scalar engine: no hand-off
    assert len(other) == 1 and "op0=nl.maximum" in other[0] and "operand0=clamp_arg" in other[0]
    # the chunk loop only reduces and accumulates: no scaled partial per chunk
    assert all("scale=" not in s for s in column_steps(_chunk_loop()))


def test_engram_chain_is_nine_steps_per_tile_and_five_per_head() -> None:
    """The per-row math of a token tile's heads c0:c1 (all of them: once per tile; one: per head in the
    last tile), for a clamp >= 0: two rsqrt, abs, relu and its `+ clamp`, sqrt, sign and g's two bf16
    roundings over the range; the two products, the sigmoid of sign times sqrt and g's two residuals per
    column, as an activation's scale or bias is one column. 29 Scalar steps per tile of 4 heads, 56 when
    each head ran its own 14 (tile_math.py). A negative clamp takes one exact Vector maximum instead of
    relu and `+ clamp`."""
    math = function("engram_gate", "_row_math")
    branch = _clamp_branch(math)
    other = [s for n in branch.orelse for s in column_steps(n, "c0:c1")]
    over_range = [s for s in column_steps(math, "c0:c1") if s not in other]
    per_column = column_steps(math, "j:j + 1")
    assert (len(over_range), len(per_column)) == (9, 5)
    # all on the Scalar engine: no hand-off
    assert all(s.startswith("nisa.activation(") for s in over_range + per_column)
    assert all(any(f"{role}=" in s and "j:j + 1]" in s.split(f"{role}=")[1] for role in ("scale", "bias"))
               for s in per_column)  # fmt: skip
    assert len(other) == 1 and "op0=nl.maximum" in other[0] and "operand0=clamp_arg" in other[0]
    # the passes only reduce, accumulate and hand each head's sums to the tile's columns
    passes = function("engram_gate", "_tile_passes")
    assert all("scale=" not in s for s in column_steps(_chunk_loop()))
    assert len(column_steps(passes, "h:h + 1")) == 3 and not column_steps(passes, "c0:c1")


def test_engram_kernel_runs_the_chain_per_tile_and_per_head_in_its_last_tile() -> None:
    """The per-head helpers (the tests above) serve the last tile and plans without room for a tile's
    heads."""
    kernel = ast.unparse(function("engram_gate", "engram_gate_kernel"))
    assert "_row_math(pt, 0, d_HC," in kernel and "head = _head_passes(" in kernel
    assert "per_head = overlap != _TILE or t0 + _P >= t_end" in kernel


def test_any_spec_with_a_heads_axis_batches_its_chain() -> None:
    """qk_norm (a per-head RMSNorm) takes the same per-tile form: its rsqrt once over the tile's heads."""
    math = column_steps(function("qk_norm", "_row_math"), "c0:c1")
    assert len(math) == 1 and "op=nl.rsqrt" in math[0]
    assert "_row_math(pt, 0, d_NH," in ast.unparse(function("qk_norm", "qk_norm_kernel"))


def test_the_mean_scale_rides_in_the_rsqrt_and_the_clamp_is_exact_for_either_sign() -> None:
    math = function("engram_gate", "_row_math")
    rsqrt = [s for s in column_steps(math, "c0:c1") if "op=nl.rsqrt" in s]
    assert len(rsqrt) == 2 and all("scale=1.0 / float(d_H)" in s and "bias=" in s for s in rsqrt)
    usual = [s for n in _clamp_branch(math).body for s in column_steps(n, "c0:c1")]
    assert ["op=nl.relu" in usual[0], "op=nl.copy" in usual[1] and "bias=" in usual[1]] == [True, True]


def test_layernorm_variance_is_scaled_in_its_rsqrt() -> None:
    """layernorm's mean is read by the centring too, so it keeps its per-chunk scale; the variance's
    1/H moves into the rsqrt."""
    rsqrt = [s for s in column_steps(function("layernorm", "_head_passes")) if "op=nl.rsqrt" in s]
    assert len(rsqrt) == 1 and "scale=1.0 / float(d_H)" in rsqrt[0]


def test_the_weight_prep_waits_on_nothing_in_the_vector_queue() -> None:
    """The prep's ones row is set on GpSimd, and the identity is built before the prep is queued."""
    prep = ast.unparse(function("engram_gate", "_prepare_weights"))
    assert "value=1.0, engine=nisa.engine.gpsimd" in prep
    kernel = ast.unparse(function("engram_gate", "engram_gate_kernel"))
    assert kernel.index("pe_identity = ") < kernel.index("_prepare_weights(")
