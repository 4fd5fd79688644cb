"""fusegen.testing.compare, which `fusegen check`, `bench` and the generated tests judge kernels by: a nan or
inf is the answer where the reference gives the same (the math of `log` or `sqrt` of a negative input), and
a mismatch anywhere else; finite values keep their tolerance, taken over the reference's finite values."""

from __future__ import annotations

import torch

from fusegen.testing import compare

NAN, INF = float("nan"), float("inf")


def _check(got: list[float], want: list[float]) -> tuple[bool, float, float]:
    report = compare(torch.tensor(got), torch.tensor(want), (("y", 0.01, 0.001),), "k:")
    out = report.outputs[0]
    return report.ok, out.max_error, out.bound


def test_nan_and_inf_where_the_reference_has_them_are_the_answer() -> None:
    ok, error, bound = _check([1.0, NAN, -INF, 2.0], [1.0005, NAN, -INF, 2.0])
    assert ok and abs(error - 0.0005) < 1e-6 and abs(bound - (0.001 + 0.01 * 2.0)) < 1e-6


def test_a_nan_the_reference_does_not_have_is_a_mismatch() -> None:
    assert _check([1.0, NAN], [1.0, 3.0])[:2] == (False, INF)


def test_a_finite_value_where_the_reference_has_nan_is_a_mismatch() -> None:
    assert _check([1.0, 3.0], [1.0, NAN])[:2] == (False, INF)


def test_an_infinity_of_the_other_sign_or_for_nan_is_a_mismatch() -> None:
    assert not _check([INF], [-INF])[0]
    assert not _check([INF], [NAN])[0]
    assert not _check([3.4e38], [INF])[0]


def test_finite_errors_keep_their_tolerance() -> None:
    assert not _check([1.0, NAN, 2.1], [1.0, NAN, 2.0])[0]


def test_all_nan_outputs_match_all_nan_references() -> None:
    assert _check([NAN, NAN], [NAN, NAN]) == (True, 0.0, 0.001)
