"""The example specs: they check, their IR matches the golden dumps, and the IR has the promised facts."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from fusegen.dsl import check, format_ast, format_ir, load_spec, parse
from fusegen.dsl.ir import Dim

#: the examples that define the users' style; each has a golden IR dump.
EXAMPLES = ("swiglu_ffn", "swiglu_ffn_ln", "engram_gate")
#: every spec in examples/, including ones other stages add: all must keep checking.
ALL_EXAMPLES = sorted(p.stem for p in (Path(__file__).parents[2] / "examples").glob("*.spec"))


@pytest.mark.parametrize("name", ALL_EXAMPLES)
def test_every_example_checks(repo_root: Path, name: str) -> None:
    kernel, _ = load_spec(f"examples/{name}.spec")
    assert kernel.name == name
    assert kernel.path == f"examples/{name}.spec"
    assert kernel.source_sha256 == hashlib.sha256((repo_root / kernel.path).read_bytes()).hexdigest()


@pytest.mark.parametrize("name", EXAMPLES)
def test_ir_dump_matches_golden(repo_root: Path, golden, name: str) -> None:
    kernel, warnings = load_spec(f"examples/{name}.spec")
    assert warnings == ()
    golden(f"{name}.ir", format_ir(kernel))


@pytest.mark.parametrize("name", ALL_EXAMPLES)
def test_dumps_are_deterministic(repo_root: Path, name: str) -> None:
    text = (repo_root / "examples" / f"{name}.spec").read_text()
    first, second = parse(text, "x.spec"), parse(text, "x.spec")
    assert format_ast(first) == format_ast(second)
    assert format_ir(check(first)) == format_ir(check(second))


def test_swiglu_signature(repo_root: Path) -> None:
    kernel, _ = load_spec("examples/swiglu_ffn.spec")
    assert [(t.name, t.dtype, [str(d) for d in t.shape]) for t in kernel.inputs] == [
        ("x", "bf16", ["R", "K"]),
        ("w1t", "bf16", ["K", "I"]),
        ("b1", "f32", ["I"]),
        ("wgt", "bf16", ["K", "I"]),
        ("bg", "f32", ["I"]),
        ("w2t", "bf16", ["I", "K"]),
        ("b2", "f32", ["K"]),
    ]
    assert [(o.name, o.dtype, o.optional) for o in kernel.outputs] == [("out", "bf16", False)]
    assert [c.env() for c in kernel.checks] == [
        {"R": 256, "K": 1280, "I": 3416},
        {"R": 300, "K": 384, "I": 1000},
        {"R": 7, "K": 256, "I": 384},
    ]
    assert all(n.id == i for i, n in enumerate(kernel.nodes))
    assert all(a < n.id for n in kernel.nodes for a in n.args), "nodes are in topological order"


def test_swiglu_ln_outputs_and_param(repo_root: Path) -> None:
    kernel, _ = load_spec("examples/swiglu_ffn_ln.spec")
    assert [t.name for t in kernel.inputs][-1] == "a"
    assert [(p.name, p.default) for p in kernel.params] == [("eps", 1e-6)]
    assert [(o.name, o.dtype) for o in kernel.outputs] == [("x_new", "f32"), ("z", "bf16")]
    z = kernel.node(kernel.outputs[1].node)
    assert z.op == "layernorm" and z.dtype == "f32"
    assert kernel.node(z.args[1]).op == "param"


def test_engram_shapes(repo_root: Path) -> None:
    kernel, _ = load_spec("examples/engram_gate.spec")
    kv = kernel.inputs[1]
    assert kv.shape == (Dim.sym("T"), Dim.sym("HC") + 1, Dim.sym("H"))
    assert [(o.name, o.optional) for o in kernel.outputs] == [
        ("out", False),
        ("dot", True),
        ("gate", True),
        ("rstd_x", True),
        ("rstd_k", True),
    ]
    assert {str(kernel.node(o.node).shape[-1]) for o in kernel.outputs[1:]} == {"HC"}
    assert {c.env()["HC"] for c in kernel.checks} == {2, 4}
    reductions = [n for n in kernel.nodes if n.op in ("sum", "mean")]
    assert {n.attr("axis") for n in reductions} == {2}, "axis=-1 is normalized"


def test_missing_golden_says_how_to_create_it(golden, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if request.config.getoption("--update-golden"):
        pytest.skip("golden files are being rewritten")
    with pytest.raises(pytest.fail.Exception, match="pytest tests/dsl --update-golden"):
        golden("absent", "text", tmp_path)
    (tmp_path / "present.txt").write_text("text")
    golden("present", "text", tmp_path)
    with pytest.raises(AssertionError, match="differs"):
        golden("present", "other", tmp_path)
