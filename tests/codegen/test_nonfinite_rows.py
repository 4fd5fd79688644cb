"""What plan.md says about non-finite inputs holds: where it says rows pass through the Tensor engine, a
nan in one token's row reaches the other tokens of its 128-token tile (and no further); where it says rows
are kept apart, or says nothing, it reaches only that token's outputs, as in the reference."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

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


@pytest.mark.parametrize(("name", "widths"), CASES, ids=IDS)
def test_a_nan_token_spoils_only_what_the_plan_says(name: str, widths: dict[str, int]) -> None:
    folder = ROOT / "generated" / name
    tests = load_generated(folder / f"test_{name}.py")
    dims = {"T": T, **widths}
    args = make_inputs(tests.INPUTS, tests.input_shapes(dims))
    args[0][1] = float("nan")  # one token's whole first row input: a request whose activations overflowed
    got = getattr(load_module(folder / "kernel.py"), name)(*args, lnc=1)
    want = getattr(load_generated(folder / "reference.py"), f"{name}_reference")(*args)
    got, want = (v if isinstance(v, tuple) else (v,) for v in (got, want))
    spoilt = _tokens_spoilt(got, want)
    if _claim(name, dims) == "mixed":
        assert spoilt and spoilt <= set(range(128)) - {1}, sorted(spoilt)
    else:
        assert not spoilt, sorted(spoilt)
