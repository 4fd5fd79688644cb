"""Non-finite row inputs. A spec may declare a row input `finite`; only then may the kernel pass rows
through the Tensor engine (identity matmuls into PSUM), where one token's nan reaches the other tokens of
its 128-token tile, and the host refuses inf and nan in that input. Without `finite` rows are kept apart:
a nan or -inf in one token's row (a masked softmax's mask) reaches only that token's outputs, as in the
reference. What plan.md says about it holds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fusegen.cli import main
from fusegen.perf.row_widths import plan_rows, row_examples
from fusegen.sim import load_module
from fusegen.testing import load_generated, make_inputs

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = {e.name: e for e in row_examples(ROOT)}
T = 130  # two token tiles, the second ragged
CASES = [
    ("add_rmsnorm", {"H": 256}), ("add_rmsnorm", {"H": 4224}), ("add_rmsnorm", {"H": 16384}),
    ("t5_rmsnorm", {"H": 256}), ("t5_rmsnorm", {"H": 4224}),
    ("silu_and_mul", {"D": 256}), ("silu_and_mul", {"D": 4224}),
    ("engram_gate", {"HC": 2, "H": 256}), ("engram_gate", {"HC": 2, "H": 4224}),
    ("engram_gate", {"HC": 1, "H": 32768}),  # streamed
    ("engram_gate_noresid", {"HC": 2, "H": 256}), ("engram_gate_hc8", {"HC": 8, "H": 256}),
    ("layernorm", {"H": 256}), ("scaled_softmax", {"H": 256}), ("qk_norm", {"NH": 2, "D": 256}),
]  # fmt: skip


def _claim(name: str, dims: dict[str, int]) -> str:
    """'mixed', 'apart' (either said or, with no line, implied) from the plan's reasons at `dims`."""
    plan = plan_rows(EXAMPLES[name], dims, "trn2", 1).plan
    assert plan is not None
    said = [r for r in plan.reasons if r.startswith(("rows pass through", "rows kept apart"))]
    assert len(said) <= 1
    return "mixed" if said and said[0].startswith("rows pass through") else "apart"


def _tokens_spoilt(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> set[int]:
    """Tokens with a non-finite output where the reference's is finite."""
    spoilt: set[int] = set()
    for g, w in zip(got, want, strict=True):
        bad = ~g.float().isfinite() & w.float().isfinite()
        spoilt |= set(bad.reshape(bad.shape[0], -1).any(dim=1).nonzero().flatten().tolist())
    return spoilt


IDS = [f"{name}-{'-'.join(map(str, widths.values()))}" for name, widths in CASES]


def _run_with_a_nan_token(folder: Path, name: str, dims: dict[str, int]) -> set[int]:
    """Tokens the kernel's outputs spoil (vs the reference) when token 1's first row input is all nan."""
    tests = load_generated(folder / f"test_{name}.py")
    args = make_inputs(tests.INPUTS, tests.input_shapes(dims))
    args[0][1] = float("nan")  # one token's whole first row input: a request whose activations overflowed
    got = getattr(load_module(folder / "kernel.py"), name)(*args, lnc=1)
    want = getattr(load_generated(folder / "reference.py"), f"{name}_reference")(*args)
    got, want = (v if isinstance(v, tuple) else (v,) for v in (got, want))
    return _tokens_spoilt(got, want)


def _finite_first_input(name: str) -> bool:
    """Whether the example declares its first input `finite`."""
    return EXAMPLES[name].ir.inputs[0].finite


@pytest.mark.parametrize(("name", "widths"), CASES, ids=IDS)
def test_a_nan_token_spoils_only_what_the_plan_says(name: str, widths: dict[str, int]) -> None:
    dims = {"T": T, **widths}
    if _finite_first_input(name):  # the host refuses the nan before any launch
        with pytest.raises(ValueError, match=r"x holds \d+ inf or nan element\(s\), but the spec declares"):
            _run_with_a_nan_token(ROOT / "generated" / name, name, dims)
        return
    assert _claim(name, dims) == "apart"  # rows pass through the Tensor engine only for `finite` inputs
    assert not _run_with_a_nan_token(ROOT / "generated" / name, name, dims)


UNDECLARED = [("add_rmsnorm", {"H": 256}), ("t5_rmsnorm", {"H": 256}), ("silu_and_mul", {"D": 256}),
              ("engram_gate", {"HC": 2, "H": 256})]  # fmt: skip


@pytest.mark.parametrize(("name", "widths"), UNDECLARED, ids=[n for n, _ in UNDECLARED])
def test_without_finite_rows_are_kept_apart(tmp_path: Path, name: str, widths: dict[str, int]) -> None:
    """The examples that declare `finite`, built without it: no rows through the Tensor engine (plan.md
    says none), and a nan token spoils nothing else."""
    spec = tmp_path / f"{name}.spec"
    text = (ROOT / "examples" / f"{name}.spec").read_text(encoding="utf-8")
    assert " finite" in text
    spec.write_text(text.replace(" finite", ""), encoding="utf-8")
    assert main(["build", "--out", str(tmp_path / "gen"), str(spec)]) == 0
    folder = tmp_path / "gen" / name
    assert "rows pass through" not in (folder / "plan.md").read_text(encoding="utf-8")
    assert not _run_with_a_nan_token(folder, name, {"T": T, **widths})


MASKED = """kernel masked_softmax
dim T, H
input x: bf16[T, H]{finite}
input m: bf16[T, H]{finite}  # additive mask: 0 or -inf
input t: f32[T]
output p: f32[T, H]
z = x * t[:, None] + m
e = exp(z - max(z, axis=-1, keepdim=true))
p = e / sum(e, axis=-1, keepdim=true)
check T=130 H=256
"""


def test_a_masked_softmax_keeps_unmasked_tokens_finite(tmp_path: Path) -> None:
    """The usual additive -inf mask: token 0 masks one key; every other token's row is the plain softmax
    (by a formula written here), not nan. Declared `finite`, the host refuses the -inf instead."""
    for finite in ("", " finite"):
        spec = tmp_path / f"m{len(finite)}" / "masked_softmax.spec"
        spec.parent.mkdir()
        spec.write_text(MASKED.format(finite=finite), encoding="utf-8")
        assert main(["build", "--out", str(spec.parent / "gen"), str(spec)]) == 0
        kernel = load_module(spec.parent / "gen" / "masked_softmax" / "kernel.py").masked_softmax
        x, t = torch.randn(T, 256).bfloat16(), torch.rand(T) + 0.5
        m = torch.zeros(T, 256).bfloat16()
        m[0, 1] = float("-inf")
        if finite:
            with pytest.raises(ValueError, match="m holds 1 inf or nan element"):
                kernel(x, m, t, lnc=1)
            continue
        got = kernel(x, m, t, lnc=1)
        z = x.double() * t.double()[:, None] + m.double()
        want = torch.softmax(z, dim=-1)
        assert got[0, 1] == 0 and torch.isfinite(got).all()
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
