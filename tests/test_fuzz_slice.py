"""A slice of bench/fuzz.py in CI: generated and mutated specs through check-spec, build and import."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "fuzz.py"


def _fuzz_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fusegen_bench_fuzz", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_two_hundred_specs_give_no_traceback_and_no_hang() -> None:
    """A case over the bench's 60 s deadline is a traceback (TimeoutError). Cases merely slower than
    `SLOW_S` are the bench's report, not a test: CPU time per build moves with the machine and with what
    earlier cases left cached (a mutated Llama-width spec of this slice takes 5.3-5.8 s alone here, on
    2026-12-07's main and on this change alike)."""
    fuzz = _fuzz_module()
    tally = fuzz.fuzz(count=200, seed=17, run_every=0)
    assert tally.specs == 200
    assert tally.accepted >= 40 and tally.built >= 30  # the generator reaches the families, not only errors
    assert tally.tracebacks == [], tally.tracebacks[:3]


def _oracle_module() -> ModuleType:
    sys.path.insert(0, str(BENCH.parent))  # bench/oracle_fuzz.py imports its siblings by name
    import oracle_fuzz

    return oracle_fuzz


def test_oracle_slice_kernels_match_math_written_outside_fusegen() -> None:
    oracle = _oracle_module()
    tally = oracle.oracle_fuzz(count=24, seed=9)
    assert tally.ran >= 12 and tally.elements > 100_000  # the generator reaches kernels, not only errors
    for generator in ("rows_case", "heads_case", "ffn_case", "proj_case", "views", "fp8"):  # each reached
        assert tally.ran_by[generator] >= 3, tally.ran_by
    assert tally.ran_by["trn1"] >= 2, tally.ran_by  # trn1's plans: a quarter of the single-core cases
    assert tally.grad_cases >= 3 and tally.grad_elements > 10_000  # ops' gradients (bench/oracle_grad.py)
    assert tally.errors == [], tally.errors[:2]
    assert tally.wrong == [], tally.wrong[:2]


def test_oracle_flags_a_few_ulps_off_and_excludes_what_f32_cannot_hold() -> None:
    import torch

    judge = _oracle_module().judge
    want = torch.tensor([1.0, -3.0, 100.0, 1e30], dtype=torch.float64)
    radius = want.abs() * 2.0**-22  # a few f32 roundings
    want32 = want.clone()
    want32[3] = float("inf")  # the f32 math overflowed where float64 did not: no answer to hold it to
    got = torch.tensor([1.0, -3.015625, 102.0, 5e30]).bfloat16()  # exact, 1 ulp off, 4 ulps off, anything
    wrong, excluded, _ = judge("bf16", got, want, radius, want32)
    assert wrong.tolist() == [False, False, True, False]  # one bf16 ulp is rounding; four are a wrong answer
    assert excluded.tolist() == [False, False, False, True]


def test_oracle_lets_a_cast_into_f16_subnormals_round_either_way() -> None:
    """Below f16's smallest normal a rounding errs by half a subnormal step, absolute (the 2026-12-07 seed-91
    case: a softmax probability near 5.8e-6 cast to f16 came out one step, 2**-24, from the oracle's)."""
    import torch

    _oracle_module()
    from oracle_eval import Evaluator

    step = 2.0**-24
    tie = 96.5 * step
    exact = torch.tensor([tie + 1e-12, tie - 1e-12], dtype=torch.float64)  # either side of a tie
    want, radius = Evaluator({}, torch.float64).cast("f16", (exact, torch.zeros_like(exact)))
    assert radius is not None and want.tolist() == [97 * step, 96 * step]
    got = torch.tensor([96 * step, 97 * step])  # the kernel's f32 value fell on the other side of the tie
    wrong, _, _ = _oracle_module().judge("f32", got, want, radius, want.float())
    assert wrong.tolist() == [False, False]
    far = torch.tensor([94 * step, 99 * step])  # two steps past the other side: not rounding
    assert _oracle_module().judge("f32", far, want, radius, want.float())[0].tolist() == [True, True]


def test_oracle_views_keep_values_and_hide_nan_past_their_ends() -> None:
    """Each layout hands over the same values (a broadcast repeats its first row) in another memory layout,
    with NaN where a kernel reading past the view would land."""
    import torch

    _oracle_module()
    from oracle_layout import lay_out

    t = torch.arange(12.0).reshape(3, 4).bfloat16()
    for how in ("slice", "reversed", "offset"):
        view = lay_out(t, how)
        assert torch.equal(view, t) and not (view.is_contiguous() and view.storage_offset() == 0)
    assert lay_out(t, "slice").untyped_storage().nbytes() > t.numel() * 2
    assert torch.isnan(torch.as_strided(lay_out(t, "offset"), (1,), (1,), 0)).all()  # storage before it
    assert lay_out(t, "expand").stride(0) == 0 and torch.equal(lay_out(t, "expand")[2], t[0])


def test_oracle_lets_a_value_at_f16s_overflow_threshold_round_either_way() -> None:
    """65520 (f16's largest finite 65504 plus half its ulp) rounds to inf; a kernel value a few ulps of f32
    below it rounds to 65504 (the 2026-12-07 seed-4 case): within the bound both are right, far below only
    65504, and a value past the threshold by more than the bound only inf."""
    import torch

    judge = _oracle_module().judge
    want = torch.tensor([65520.0, 65520.0, 65000.0, 70000.0], dtype=torch.float64)
    radius = want.abs() * 2.0**-22
    got = torch.tensor([65504.0, float("inf"), float("inf"), 65504.0]).half()
    wrong, excluded, _ = judge("f16", got, want, radius, want.float())
    assert wrong.tolist() == [False, False, True, True] and not excluded.any()


def test_oracle_gradients_are_torchs_of_the_math_and_flag_a_wrong_derivative() -> None:
    """The oracle's float64 gradient of rmsnorm(x, eps, w) (its tree) equals torch's F.rms_norm autograd;
    a gradient off by f32 rounding passes, one missing the rstd's own derivative does not."""
    import random

    import torch
    import torch.nn.functional as F

    _oracle_module()
    from oracle_eval import Node
    from oracle_gen import OracleCase, Output
    from oracle_grad import _oracle_grads, grad_wrong

    x_leaf, w_leaf = Node("in", (), "x", "row", "any", "x"), Node("in", (), "w", "vec", "any", "w")
    eps = Node("param", (), "eps", "scalar", "pos", "eps")
    norm = Node("rmsnorm", (x_leaf, eps, w_leaf), "rmsnorm(x, eps, w)", "row")
    case = OracleCase("", (("x", "f32", "unit"), ("w", "f32", "unit")), {"x": (5, 64), "w": (64,)},
                      {"eps": 1e-5}, {"T": 5, "H": 64}, (Output("o0", "f32", "T, H", norm),))  # fmt: skip
    gen = torch.Generator().manual_seed(random.Random(1).randint(0, 99))
    x, w, cot = (
        torch.randn(5, 64, generator=gen),
        torch.randn(64, generator=gen),
        torch.randn(5, 64, generator=gen),
    )
    dx, dw = _oracle_grads(case, [x, w], {"o0": cot}, torch.float64)
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    (F.rms_norm(xd, (64,), wd, 1e-5) * cot.double()).sum().backward()
    assert dx is not None and dw is not None and xd.grad is not None and wd.grad is not None
    torch.testing.assert_close(dx, xd.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dw, wd.grad, rtol=1e-12, atol=1e-12)
    rstd = torch.rsqrt(xd.detach().square().mean(-1, keepdim=True) + 1e-5)
    no_rstd_term = cot.double() * wd.detach() * rstd  # d/dx treating rstd as a constant
    assert not grad_wrong("f32", dx.float().double(), dx, dx.float())[0].any()
    assert grad_wrong("f32", no_rstd_term, dx, dx.float())[0].any()
    big = torch.tensor(
        [183977.0, -1e5, 100.0], dtype=torch.float64
    )  # an f16 input's gradient: past 65504, inf
    got = torch.tensor([float("inf"), float("-inf"), float("inf")], dtype=torch.float64)
    assert grad_wrong("f16", got, big, big.float())[0].tolist() == [False, False, True]  # seed 13's dkv


def test_oracle_holds_gelu_to_u_of_its_argument_in_the_tail() -> None:
    """In gelu's negative tail f32 gets x * (1 + erf(x / sqrt 2)) / 2 right to a few u of |x| only (the sum
    cancels): torch's own f32 gelu, the interpreter's nl.gelu, is within the oracle's radius there (the
    2026-12-07 seed-6 case, where the oracle's f32 evaluation of a strided view took torch's more accurate
    path); a value 50 u of |x| off is not."""
    import torch
    import torch.nn.functional as F

    _oracle_module()
    from oracle_eval import Evaluator

    x = torch.linspace(-12, 0, 200_001)
    want, radius = Evaluator({}, torch.float64).unary("gelu", (x.double(), torch.zeros_like(x.double())))
    assert radius is not None
    judge = _oracle_module().judge
    assert not judge("f32", F.gelu(x), want, radius, want.float())[0].any()
    off = (F.gelu(x).double() - 50 * 2.0**-24 * x.double().abs()).float()
    assert judge("f32", off, want, radius, want.float())[0][x < -1].all()


def test_an_out_of_range_activation_argument_is_undefined_only_where_f32_overflows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seed 38's 12th case, rsqrt(mean(square(min(x, -1e30))) + eps): square overflows f32, the kernel's
    rsqrt argument is inf, outside its valid input range, and the interpreter refuses it. The f32 math
    overflows as well, so the hardware's answer is undefined, not wrong; were the math well-conditioned in
    f32, it would be an error (a finding)."""
    import random

    oracle = _oracle_module()
    rng = random.Random(38)
    case = [oracle.draw(rng) for _ in range(12)][-1]
    assert "rsqrt" in case.text and "param p = -1e+30" in case.text
    tally = oracle.OracleTally()
    oracle.one(case, tmp_path, tally)
    assert tally.errors == [] and tally.wrong == [] and len(tally.undefined) == 1
    assert "activation-input-range" in tally.undefined[0][0]
    monkeypatch.setattr(oracle, "_ill_conditioned", lambda case, args: False)
    tally = oracle.OracleTally()
    oracle.one(case, tmp_path, tally)
    assert tally.undefined == [] and "InputRangeError" in tally.errors[0][0]
