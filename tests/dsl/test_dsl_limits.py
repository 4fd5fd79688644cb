"""Every front-end limit is a diagnostic at the spot, at and past it (speed: bench/frontend_speed.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fusegen.cli import main
from fusegen.dsl.check import MAX_CHAIN, check
from fusegen.dsl.diagnostics import SpecError
from fusegen.dsl.parser import MAX_DEPTH, MAX_SPEC_CHARS, parse
from fusegen.dsl.shapes import MAX_DIM_TERMS

HEAD = "kernel k\ndim T, H\ninput x: f32[T, H]\ninput w: f32[H, H]\noutput y: f32[T, H]\n"
TAIL = "\ncheck T=4 H=128\n"
DEEP = f"this line nests more than {MAX_DEPTH} operations deep"

#: a chain of `n` operators of each kind on line 6; n operators nest n + 2 deep under the statement.
CHAINS = {
    "pow": lambda n: "y = x" + " ** 1.0" * n,
    "minus": lambda n: "y = x" + " - x" * n,
    "neg": lambda n: "y = " + "-" * n + "x",
    "div": lambda n: "y = x" + " / x" * n,
    "matmul": lambda n: "y = x" + " @ w" * n,
    "slice": lambda n: "y = x" + "[0:4]" * n,
}


def _diagnostics(text: str) -> list[str]:
    """The first line of every diagnostic for `text` ([] when it checks)."""
    try:
        check(parse(text, "t.spec"))
    except SpecError as err:
        return [d.render(text).split("\n")[0] for d in err.diagnostics]
    return []


@pytest.mark.parametrize("kind", sorted(CHAINS))
def test_operator_chains_at_and_past_the_depth_limit(kind: str) -> None:
    chain = CHAINS[kind]
    at = MAX_DEPTH - (3 if kind == "slice" else 2)  # a slice's bounds nest one level below its `[]`
    assert not any(DEEP in d for d in _diagnostics(HEAD + chain(at) + TAIL))
    for n in (at + 1, 490, 5000):  # just past the limit, where Python's recursion gave out, far past
        assert _diagnostics(HEAD + chain(n) + TAIL) == [f"t.spec:6:1: error: {DEEP}"], n


def _statements(n: int) -> str:
    return HEAD + "a0 = x\n" + "".join(f"a{i + 1} = a{i} + x\n" for i in range(n)) + f"y = f32(a{n})" + TAIL


def test_statement_chains_at_and_past_the_chain_limit() -> None:
    assert _diagnostics(_statements(MAX_CHAIN - 2)) == []  # a0 = x is the input node, then n adds
    past = _diagnostics(_statements(MAX_CHAIN - 1))  # now `y = f32(a99)` is the 101st operation
    line = 6 + MAX_CHAIN
    message = f"`y` sits at the end of a chain of more than {MAX_CHAIN} operations"
    assert past == [f"t.spec:{line}:1: error: {message}"]
    assert len(_diagnostics(_statements(3000))) == 1


def test_number_literals_at_and_past_their_limits() -> None:
    spec = HEAD + "y = x + sum(x, axis={})" + TAIL
    assert not any("digits" in d for d in _diagnostics(spec.format("9" * 18)))
    for digits in (19, 4301):
        assert _diagnostics(spec.format("1" * digits))[0].startswith("t.spec:6:21: error: integer literal `1")
    scaled = HEAD + "y = x * {}" + TAIL
    assert _diagnostics(scaled.format("3.4028234e38")) == []
    assert _diagnostics(scaled.format("5e-324")) == []
    for past_f32 in ("3.5e38", "-1e308"):  # the kernel's fp32 immediate would be inf
        assert f"`{past_f32}` does not fit in f32" in _diagnostics(scaled.format(past_f32))[0]
    assert "overflows" in _diagnostics(scaled.format("1e309"))[0]
    assert "`1e-400` underflows to 0" in _diagnostics(scaled.format("1e-400"))[0]
    assert _diagnostics(scaled.format("0e-400")) == []  # zero written as zero is fine


def test_file_size_at_and_past_the_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = HEAD + "y = x * 2.0" + TAIL
    padded = spec + "#" * (MAX_SPEC_CHARS - len(spec) - 1) + "\n"
    path = tmp_path / "t.spec"
    path.write_text(padded)
    assert main(["check-spec", str(path)]) == 0
    path.write_text(padded + "#\n")
    assert main(["check-spec", str(path)]) == 2
    err = capsys.readouterr().err
    line = padded.count("\n") + 1
    assert f"t.spec:{line}:1: error: the spec is larger than {MAX_SPEC_CHARS} bytes" in err


def test_thousands_of_errors_report_capped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 1,500 names in scope, then 6,500 lines each naming an unknown value and redeclaring `z`
    lines = [f"v{i} = x\n" for i in range(1500)] + [f"z = v{i % 1500}q #\n" for i in range(6500)]
    path = tmp_path / "t.spec"
    path.write_text(HEAD + "y = x\n" + "".join(lines) + TAIL)
    assert 90_000 < path.stat().st_size <= MAX_SPEC_CHARS
    assert main(["check-spec", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count(": error: ") == 50 and "and 12950 more" in err and len(err) < 20_000
    assert main(["check-spec", "--max-errors", "3", str(path)]) == 2
    assert capsys.readouterr().err.count(": error: ") == 3


def test_byte_order_mark_is_accepted_and_cr_line_endings_are_named(tmp_path: Path) -> None:
    spec = HEAD + "y = x * 2.0" + TAIL
    path = tmp_path / "t.spec"
    path.write_bytes(b"\xef\xbb\xbf" + spec.encode())
    assert main(["check-spec", str(path)]) == 0
    with pytest.raises(SpecError) as info:
        parse(spec.replace("\n", "\r"), "t.spec")
    assert "classic Mac (CR) line endings" in info.value.render()
    assert parse(spec.replace("\n", "\r\n"), "t.spec").items  # CRLF is fine


def test_a_closed_pipe_is_not_an_internal_error() -> None:
    """`fusegen check-spec ... | head -1`: the reader leaves early; fusegen stops quietly."""
    specs = sorted(str(p) for p in (Path(__file__).resolve().parents[2] / "examples").glob("*.spec"))
    command = f"{sys.executable} -m fusegen.cli check-spec {' '.join(specs)} | head -1"
    run = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)
    assert run.stdout.count("\n") == 1
    assert "Traceback" not in run.stderr and "internal error" not in run.stderr


def test_a_dim_compound_axes_do_not_determine_is_named() -> None:
    """`x: [T, NQ + 2*NKV]` alone gives no runtime value for NQ or NKV (the reference once read an
    undefined `d_NQ`); one more whole axis, or a fixed value, determines both."""
    spec = (
        "kernel k\ndim T, NQ, NKV\ninput x: f32[T, NQ + 2*NKV]\noutput y: f32[T, NQ + 2*NKV]\n"
        "y = x * 2.0\ncheck T=4 NQ=64 NKV=32\n"
    )
    message = "t.spec:3:1: error: dim `{}` appears only inside compound axes that do not determine its value"
    assert _diagnostics(spec) == [message.format("NQ"), message.format("NKV")]
    assert _diagnostics(spec.replace("dim T, NQ, NKV", "dim T, NQ, NKV = 32").replace(" NKV=32", "")) == []
    with_kv = spec.replace("output y", "input b: f32[NKV]\noutput y")
    assert _diagnostics(with_kv) == []  # NKV from b, then NQ solved from x
    product = spec.replace("NQ + 2*NKV", "2*NQ*NKV")
    assert _diagnostics(product) == [message.format("NQ"), message.format("NKV")]


def test_dim_products_at_and_past_the_term_limit() -> None:
    """A product is checked before it is expanded: a short line of factors once never finished."""
    symbols = [f"D{i}" for i in range(1, 10)]
    names = ", ".join(symbols)
    ones = " ".join(f"{d}=1" for d in symbols)
    spec = (f"kernel k\ndim T, {names}\ninput x: f32[T, {names}]\ninput z: f32[T, {{}}]\n"
            f"output y: f32[T, {names}]\ny = x * 2.0\ncheck T=1 {ones}\n")  # fmt: skip
    eight, nine = "(" + " + ".join(symbols[:8]) + ")", "(" + " + ".join(symbols) + ")"
    assert _diagnostics(spec.format(f"{eight} * {eight}")) == []
    past = _diagnostics(spec.format(f"{eight} * {nine}"))
    assert past == [f"t.spec:4:17: error: this dim expression expands to more than {MAX_DIM_TERMS} terms"]
    assert len(_diagnostics(spec.format(" * ".join([nine] * 60)))) == 1


def test_a_very_long_line_is_shown_as_a_window_around_the_caret() -> None:
    text = HEAD + "y = x" + " + x" * 5000 + TAIL
    rendered = _diagnostics(text)
    with pytest.raises(SpecError) as info:
        check(parse(text, "t.spec"))
    lines = info.value.render().split("\n")
    assert rendered == ["t.spec:6:1: error: " + DEEP]
    assert all(len(line) < 220 for line in lines)
    assert lines[2].strip() == "^" + "~" * 199  # the statement's span, cut to the window
