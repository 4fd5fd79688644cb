"""Differential fuzzing against an oracle independent of fusegen: random specs from bench/oracle_gen.py are
built, their kernels run on the interpreter, and every output element is held to the float64 value of the
spec's math within the radius bench/oracle_eval.py derives, widened by the output's own rounding.

An element is flagged only where a float32 evaluation of the same math (no fusegen either) agrees with the
float64 one within that bound: where they disagree the math itself is ill-conditioned in f32 (overflow that
float64 does not have, cancellation the radius did not foresee), and the element is counted as excluded.

Run: .venv/bin/python bench/fuzz.py --oracle 300 [--seed 0]
"""

from __future__ import annotations

import itertools
import math
import random
import shutil
import sys
import tempfile
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from oracle_cases import heads_case, proj_case
from oracle_eval import DTYPES, UNIT, Evaluator
from oracle_gen import OracleCase, ffn_case, rows_case
from oracle_grad import check_grads, trains
from oracle_layout import lay_out, pick_layouts, unchanged

#: how many times the derived radius an element may be off: the radius is first-order per operation, and
#: "a few ulps" of the output dtype is the tolerance the brief asks (2 rounding-radii = 2 output ulps)
SAFETY = 2.0
#: the smallest subnormal of each output dtype: a value below it rounds to 0 or to it
SUBNORMAL = {"bf16": 9.2e-41, "f16": 6.0e-8, "f32": 1.4e-45, "fp8_e4m3": 2.0**-9, "fp8_e5m2": 2.0**-16}


@dataclass
class OracleTally:
    """What an oracle run found."""

    cases: int = 0
    built: int = 0
    ran: int = 0
    elements: int = 0
    excluded: int = 0
    rejected: Counter[str] = field(default_factory=Counter)  # build refusals by their first line
    refused_calls: list[tuple[str, str]] = field(default_factory=list)  # host ValueError, spec
    grad_cases: int = 0  # ops whose gradients were checked (bench/oracle_grad.py)
    grad_elements: int = 0
    ran_by: Counter[str] = field(
        default_factory=Counter
    )  # cases run by generator; "views", "fp8": with those
    wrong: list[tuple[str, str]] = field(default_factory=list)  # (what differs, spec)
    errors: list[tuple[str, str]] = field(default_factory=list)  # (exception, spec)
    # the interpreter refused an activation argument outside the function's valid input range (the
    # hardware's result is undefined) where the float32 math overflows too: (message, spec)
    undefined: list[tuple[str, str]] = field(default_factory=list)


def _oracle(case: OracleCase, args: list[torch.Tensor]) -> tuple[dict, dict]:
    """The float64 (value, radius) and float32 value of every output."""
    env: dict[str, torch.Tensor | float] = {n: a for (n, _, _), a in zip(case.inputs, args, strict=True)}
    env.update(case.params)
    env.update({k: float(v) for k, v in case.dims.items()})
    e64, e32 = Evaluator(env, torch.float64), Evaluator(env, torch.float32)
    return {o.name: e64(o.node) for o in case.outputs}, {o.name: e32(o.node)[0] for o in case.outputs}


def judge(dtype: str, got: torch.Tensor, o64: torch.Tensor, radius: torch.Tensor,
          o32: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(wrong, excluded, bound) per element: `got` against the float64 value within the bound, where the
    float32 evaluation agrees; a non-finite answer (in the output dtype) must be matched exactly, but for an
    overflow the bound leaves undecided."""
    rounded = lambda v: v.to(DTYPES[dtype]).to(torch.float64)  # noqa: E731
    k, want, want32 = got.to(torch.float64), rounded(o64), rounded(o32.to(torch.float64))
    bound = SAFETY * (radius + UNIT[dtype] * (o64.abs() + radius)) + SUBNORMAL[dtype]
    same = lambda a, b: (a == b) | (a.isnan() & b.isnan())  # noqa: E731
    finite = want.isfinite()
    agree = torch.where(finite, (want32 - o64).abs() <= bound, same(want32, want))
    excluded = ~agree | (finite & ~radius.isfinite())
    # within the bound of the cast's overflow threshold (f16's 65520) a value may round to inf or to the
    # largest finite one: both are the cast of a value the kernel may hold before it
    edge = o64.isfinite() & ~finite & rounded(o64 - o64.sign() * bound).isfinite()
    off = torch.where(finite | edge, ~((k - o64).abs() <= bound) & ~same(k, want), ~same(k, want))
    return off & ~excluded, excluded, bound


def check_case(case: OracleCase, folder: Path, tally: OracleTally, name: str = "k") -> None:
    """Run the built kernel `name` and judge every output against the oracle; then its op's gradients."""
    from fusegen.sim import InputRangeError, load_module
    from fusegen.testing import make_inputs

    kernel = load_module(folder / "kernel.py")
    how = dict(case.layouts)
    args = [lay_out(a, how.get(n)) for (n, _, _), a in zip(case.inputs, make_inputs(case.inputs, case.shapes),
                                                            strict=True)]  # fmt: skip
    before = [a.clone() for a in args]
    try:
        got = getattr(kernel, name)(*args, **case.params, lnc=case.lnc, target=case.target)
    except ValueError as err:  # the host refused the params (a scalar it forms would be undefined)
        tally.refused_calls.append((str(err).splitlines()[0][:160], case.text))
        return
    except InputRangeError as err:
        if not _ill_conditioned(case, args):
            raise  # the math is well-conditioned in f32, so an out-of-range argument is a finding
        tally.undefined.append((str(err).splitlines()[0][:160], case.text))
        return
    tally.ran += 1
    tally.ran_by.update(
        [case.generator] + (["views"] if case.layouts else []) + (["fp8"] if "fp8" in case.text else [])
        + ([case.target] if case.target != "trn2" else [])
    )
    written = [n for (n, _, _), a, b in zip(case.inputs, args, before, strict=True) if not unchanged(b, a)]
    if written:
        tally.wrong.append((f"inputs {written} written by the call; layouts {case.layouts}", case.text))
    got = got if isinstance(got, tuple) else (got,)
    o64, o32 = _oracle(case, args)
    for out, g in zip(case.outputs, got, strict=True):
        v, r = o64[out.name]
        assert r is not None
        shape = tuple(int(d) if d.isdigit() else case.dims[d] for d in out.shape.split(", "))
        if tuple(g.shape) != tuple(shape):
            tally.wrong.append((f"{out.name}: shape {tuple(g.shape)}, spec says {tuple(shape)}", case.text))
            continue
        wrong, excluded, bound = judge(out.dtype, g.reshape(v.shape), v, r, o32[out.name].reshape(v.shape))
        tally.elements += wrong.numel()
        tally.excluded += int(excluded.sum())
        if wrong.any():
            worst = _worst(out.name, g.reshape(v.shape), v, o32[out.name], bound, wrong)
            called = f"called with {case.params}, lnc={case.lnc}, {case.target}, layouts {case.layouts}"
            tally.wrong.append((f"{worst}; {called}", case.text))
    if case.grads:
        check_grads(case, folder, name, args, tally)


def _ill_conditioned(case: OracleCase, args: list[torch.Tensor]) -> bool:
    """Does the float32 evaluation of some output element disagree with the float64 one (overflow)?"""
    o64, o32 = _oracle(case, args)
    for out in case.outputs:
        v, r = o64[out.name]
        assert r is not None
        f32 = o32[out.name].reshape(v.shape)
        if bool(judge(out.dtype, f32, v, r, f32)[1].any()):  # [1]: elements excluded as ill-conditioned
            return True
    return False


def _worst(name: str, got: torch.Tensor, want: torch.Tensor, want32: torch.Tensor, bound: torch.Tensor,
           wrong: torch.Tensor) -> str:  # fmt: skip
    """One line on the worst flagged element."""
    err = torch.where(wrong, (got.double() - want).abs().nan_to_num(math.inf), torch.zeros_like(want))
    at = int(err.flatten().argmax())
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(at), want.shape))
    pick = lambda t: float(t.flatten()[at])  # noqa: E731
    return (
        f"{name}{list(idx)}: kernel {pick(got):.6g}, oracle f64 {pick(want):.6g} (f32 {pick(want32):.6g}), "
        f"bound {pick(bound):.3g}; {int(wrong.sum())} of {wrong.numel()} elements off"
    )


NAMES = itertools.count()


def one(case: OracleCase, work: Path, tally: OracleTally) -> None:
    """Build one case and check it."""
    from fuzz import HANG_S, _cli, _deadline, _expect

    spec, out = work / "oracle.spec", work / "out"
    name = f"oracle{next(NAMES)}" if case.grads else "k"  # a process registers one op per kernel name
    spec.write_text(case.text.replace("kernel k\n", f"kernel {name}\n", 1))
    shutil.rmtree(out, ignore_errors=True)
    tally.cases += 1
    try:
        with _deadline(HANG_S * 3):
            code, err = _cli(["build", "--out", str(out), str(spec)])
            _expect(code, err, "build")
            if code != 0:
                tally.rejected[_refusal(err)] += 1
                return
            tally.built += 1
            check_case(case, out / name, tally, name)
    except Exception as exc:  # every escape is a finding
        tally.errors.append((f"{type(exc).__name__}: {str(exc).splitlines()[0][:150] if str(exc) else ''}",
                             case.text))  # fmt: skip


def _refusal(err: str) -> str:
    """Why a build refused: the closest family's note, else the first error."""
    lines = err.splitlines()
    closest = next((line for line in lines if "comes closest" in line), "")
    family = closest.split("the ", 1)[-1].split(" family")[0] if closest else ""
    note = next((line for line in lines if f"leaves the {family} family here" in line), "") if family else ""
    first = note or next((line for line in lines if "error:" in line), err[:100])
    return first.split("here: " if note else "error: ", 1)[-1][:100]


#: the share of the cases that train whose op's gradients are checked too
GRAD_SHARE = 0.3
#: each generator's share of the cases
MIX = ((rows_case, 0.35), (heads_case, 0.25), (ffn_case, 0.15), (proj_case, 0.25))


def draw(rng: random.Random) -> OracleCase:
    """One case from a generator of MIX, its inputs laid out as views for some."""
    make = rng.choices([f for f, _ in MIX], weights=[w for _, w in MIX])[0]
    case = make(rng)
    names = [n for n, _, _ in case.inputs]
    layouts = pick_layouts(rng, names, [len(case.shapes[n]) for n in names])
    case = replace(case, layouts=layouts, generator=make.__name__, target=_target(case))
    return replace(case, grads=trains(case) and rng.random() < GRAD_SHARE)


def _target(case: OracleCase) -> str:
    """trn1 (its own SBUF, PSUM and engine rates: other plans) for a quarter of the single-core cases
    without fp8_e4m3, which trn1 lacks; decided by the spec's text, so a seed draws the cases it drew
    before."""
    single = case.lnc == 1 and "fp8_e4m3" not in case.text  # LNC exists on Trn2/Trn3 only
    return "trn1" if single and zlib.crc32(case.text.encode()) % 4 == 0 else "trn2"


def oracle_fuzz(count: int, seed: int) -> OracleTally:
    """`count` random cases from `seed` (see `draw`)."""
    rng = random.Random(seed)
    tally = OracleTally()
    with tempfile.TemporaryDirectory(prefix="fusegen-oracle-") as tmp:
        for _ in range(count):
            one(draw(rng), Path(tmp), tally)
    return tally


def report(tally: OracleTally, elapsed: float) -> int:
    """Print the run's summary and findings; 1 when something was wrong."""
    print(
        f"{tally.cases} cases in {elapsed:.0f} s: {tally.built} built, {tally.ran} run, "
        f"{tally.elements} elements checked ({tally.excluded} excluded as ill-conditioned in f32), "
        f"{len(tally.wrong)} wrong, {len(tally.errors)} errors, {len(tally.refused_calls)} calls refused, "
        f"{len(tally.undefined)} undefined (an activation argument out of range where f32 overflows too)"
    )
    print(f"  gradients of {tally.grad_cases} ops checked: {tally.grad_elements} elements")
    print("  run by generator: " + ", ".join(f"{k} {n}" for k, n in sorted(tally.ran_by.items())))
    for reason, n in tally.rejected.most_common(8):
        print(f"  rejected {n:4d}  {reason}")
    for what, text in tally.wrong + tally.errors:
        print(f"--- {what}\n{text}")
    for what, text in tally.refused_calls[:3]:
        print(f"--- refused: {what}\n{text}")
    for what, text in tally.undefined[:3]:
        print(f"--- undefined: {what}\n{text}")
    return 1 if tally.wrong or tally.errors else 0


def main(count: int, seed: int) -> int:
    """The `--oracle` mode of bench/fuzz.py."""
    started = time.monotonic()
    tally = oracle_fuzz(count, seed)
    return report(tally, time.monotonic() - started)
