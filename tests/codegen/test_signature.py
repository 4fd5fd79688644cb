"""The door's literal: dim expressions printed by the IR evaluate back to the IR's values; the signature
lists what the spec declares."""

from __future__ import annotations

from pathlib import Path

import pytest

from fusegen.codegen.files import argcheck as argcheck
from fusegen.codegen.files.signature import Returned, signature
from fusegen.dsl import load_spec
from fusegen.dsl.ir import Dim
from fusegen.sim.targets import TARGETS

ROOT = Path(__file__).parents[2]
SPECS = sorted((ROOT / "examples").glob("*.spec"))


@pytest.mark.parametrize(
    "dim",
    [Dim.sym("T"), Dim.sym("HC") + 1, Dim.sym("I") * 2 - 1, Dim.sym("T") * Dim.sym("H"), Dim.const(1),
     Dim.const(0), Dim.const(0) - Dim.sym("K") * 3 + 7],
    ids=str,
)  # fmt: skip
def test_printed_dims_evaluate_like_the_ir(dim: Dim) -> None:
    env = {"T": 5, "HC": 3, "I": 11, "H": 7, "K": 2}
    assert argcheck._value(str(dim), env) == dim.eval(env)
    assert argcheck._value(str(dim), {}) == (None if dim.symbols() else dim.eval({}))


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_every_example_dim_and_require_round_trips(spec: Path) -> None:
    ir = load_spec(str(spec))[0]
    env = {d.name: 3 + i for i, d in enumerate(ir.dims)}
    exprs = [d for i in ir.inputs for d in i.shape] + [c.expr for c in ir.constraints]
    assert all(argcheck._value(str(d), env) == d.eval(env) for d in exprs)


def test_signature_literal_is_the_spec() -> None:
    ir = load_spec(str(ROOT / "examples" / "engram_gate_hc8.spec"))[0]
    namespace = {name: getattr(argcheck, name) for name in ("_Signature", "_Decl", "_Require")}
    sig = eval(signature("engram_gate_hc8", ir, [Returned("out", "bf16", ir.outputs[0].shape)]), namespace)
    assert [(d.name, d.dtype, d.shape) for d in sig.inputs] == [
        ("x", "bfloat16", ("T", "HC", "H")), ("kv", "bfloat16", ("T", "HC + 1", "H")),
        ("w_h", "bfloat16", ("HC", "H")), ("w_e", "bfloat16", ("HC", "H")),
    ]  # fmt: skip
    assert sig.params == ("eps", "clamp") and sig.fixed == (("HC", 8),)
    assert [r.text for r in sig.requires] == ["H % 128 == 0"]
    assert dict(sig.targets) == {"trn1": 1, "trn2": 2, "trn3": 2}
    assert {name: t.max_lnc for name, t in TARGETS.items()} == {"trn1": 1, "trn2": 2, "trn3": 2}
