"""Every invalid spec gets its exact diagnostic: location, source line, caret and hint (cel-python style)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fusegen.dsl import SpecError, check, check_with_warnings, load_spec, parse

CASES_FILE = Path(__file__).with_name("invalid_specs.txt")


def _load_cases() -> list[tuple[str, str, str]]:
    """(name, spec, expected) from invalid_specs.txt."""
    cases = []
    text = "".join(
        line for line in CASES_FILE.read_text().splitlines(keepends=True) if not line.startswith("#")
    )
    for block in text.split("=== ")[1:]:
        name, _, body = block.partition("\n")
        spec, _, expected = body.partition("--- expected\n")
        cases.append((name, spec, expected.rstrip("\n")))
    return cases


CASES = _load_cases()


def _errors(text: str) -> str:
    with pytest.raises(SpecError) as info:
        check(parse(text, "t.spec"))
    return info.value.render()


def test_the_table_is_large() -> None:
    assert len(CASES) >= 40


@pytest.mark.parametrize(("name", "spec", "expected"), CASES, ids=[c[0] for c in CASES])
def test_invalid_spec_diagnostic(name: str, spec: str, expected: str) -> None:
    assert _errors(spec) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "t.spec: error: the spec is empty\n  hint: a spec starts with `kernel NAME`"),
        (" \n\n", "t.spec: error: the spec is empty\n  hint: a spec starts with `kernel NAME`"),
        ("kernel k\x00\n", "t.spec:1:9: error: NUL byte in the spec\n    kernel k?\n            ^"),
        (
            "kernel k\ny = (" + "(" * 60 + "\n",
            "t.spec:2:55: error: brackets nest more than 50 deep\n"
            "    y = (" + "(" * 60 + "\n" + " " * 58 + "^",
        ),
    ],
)
def test_unparseable_input(text: str, expected: str) -> None:
    assert _errors(text) == expected


def test_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.spec"
    path.write_bytes(b"kernel k\ndim R\xff\n")
    with pytest.raises(SpecError) as info:
        load_spec(str(path))
    assert info.value.render() == (
        f"{path}:2:6: error: the spec is not UTF-8 text (byte 0xff)\n"
        "    dim R\N{REPLACEMENT CHARACTER}\n"
        "         ^\n"
        "  hint: save the spec as UTF-8"
    )


def test_utf16_file_says_so(tmp_path: Path) -> None:
    """A spec saved as UTF-16 (Windows Notepad's "Unicode") was only "not UTF-8 text"."""
    path = tmp_path / "wide.spec"
    path.write_bytes("kernel k\n".encode("utf-16"))
    with pytest.raises(SpecError) as info:
        load_spec(str(path))
    assert info.value.render().endswith("  hint: the file is UTF-16: save it as UTF-8")


def test_a_directory_is_a_spec_error_with_a_hint(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        load_spec(str(tmp_path))
    assert info.value.render() == (
        f"{tmp_path}: error: cannot read the spec: Is a directory\n  hint: pass the spec files in it, e.g. "
        f"`{tmp_path}/*.spec`"
    )


def test_missing_file_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        load_spec(str(tmp_path / "nope.spec"))
    assert (
        info.value.render()
        == f"{tmp_path / 'nope.spec'}: error: cannot read the spec: No such file or directory"
    )


def test_unicode_line_separator_in_comment_keeps_line_numbers() -> None:
    text = "# a\u2028b\nkernel k\ny = x +\n"
    assert _errors(text) == "t.spec:3:8: error: expected an expression after `+`\n    y = x +\n           ^"


WARNING_SPEC = """\
kernel k
dim R
input x: f32[R]
input unused: f32[R]
param p = 2.0
output y: f32[R]
t = x * 3
y = x * 2
check R=4
"""


def test_warnings_are_collected_not_raised() -> None:
    spec = parse(WARNING_SPEC, "t.spec")
    _, warnings = check_with_warnings(spec)
    assert "\n".join(w.render(spec.source) for w in warnings) == (
        "t.spec:4:7: warning: input `unused` is never used\n"
        "    input unused: f32[R]\n"
        "          ^~~~~~\n"
        "t.spec:5:7: warning: param `p` is never used\n"
        "    param p = 2.0\n"
        "          ^\n"
        "t.spec:7:1: warning: `t` is computed but never used\n"
        "    t = x * 3\n"
        "    ^\n"
        "  hint: use it, or declare it an `output`"
    )


def test_a_dim_no_shape_or_expression_names_is_warned_about() -> None:
    text = (
        "kernel k\ndim R, H, Z, N = 4\nrequire Z % 2 == 0\ninput x: f32[R, H]\noutput y: f32[R, H]\n"
        "y = x * H\ncheck R=4 H=2 Z=2\n"
    )
    spec = parse(text, "t.spec")
    _, warnings = check_with_warnings(spec)
    assert [w.render(spec.source).split("\n")[0] for w in warnings] == [
        "t.spec:2:11: warning: dim `Z` is never used",  # a require and a check line are no use
        "t.spec:2:14: warning: dim `N` is never used",
    ]
    assert warnings[0].hint == "remove it from the `dim` line, or use it in a shape"


def test_long_expression_chains_are_refused_not_crashed() -> None:
    chain = "+".join(["x"] * 150)
    text = f"kernel k\ndim R\ninput x: f32[R]\noutput y: f32[R]\ny = {chain}\ncheck R=1\n"
    first_line = _errors(text).split("\n")[0]
    assert first_line == "t.spec:5:1: error: this line nests more than 100 operations deep"


def test_brackets_in_comments_do_not_count_as_nesting() -> None:
    text = "# " + "(" * 80 + "\nkernel k\ndim R\ninput x: f32[R]\noutput y: f32[R]\ny = x * 2\ncheck R=1\n"
    assert check(parse(text, "t.spec")).doc == "(" * 80


def _warnings(text: str) -> str:
    spec = parse(text, "t.spec")
    _, warnings = check_with_warnings(spec)
    return "\n".join(w.render(spec.source) for w in warnings)


def test_a_dim_nothing_uses_is_a_warning() -> None:
    """A dim in no shape, index or value used to pass silently (its check values idle)."""
    text = "kernel k\ndim T, H, G\ninput x: f32[T, H]\noutput z: f32[T, H]\nz = x * 2\ncheck T=4 H=8 G=2\n"
    assert _warnings(text) == (
        "t.spec:2:11: warning: dim `G` is never used\n"
        "    dim T, H, G\n"
        "              ^\n"
        "  hint: remove it from the `dim` line, or use it in a shape"
    )


def test_a_production_sized_check_is_a_warning() -> None:
    """A check line at a production shape passed silently, and its generated test ran for hours on the
    interpreter: 2 x 2 GiB of bf16 rows is about 20 minutes at the interpreter's measured pace."""
    text = "kernel k\ndim T, H\ninput x: bf16[T, H]\noutput z: bf16[T, H]\nz = x * 2\ncheck T=65536 H=16384\n"
    assert _warnings(text) == (
        "t.spec:6:1: warning: this check is 4.0 GiB of inputs and outputs: its generated test would run "
        "about 20 minutes on the CPU interpreter\n"
        "    check T=65536 H=16384\n"
        "    ^~~~~~~~~~~~~~~~~~~~~\n"
        "  hint: a check line is a test shape (the examples' largest is 0.3 GiB, 0.01 TFLOP); time a "
        "production shape with `fusegen explain SPEC --shape ...`"
    )


def test_a_check_with_matmul_work_past_a_test_shape_is_a_warning() -> None:
    """Little data, much matmul work: 2 * 8192 * 8192 * 8192 flops is 1.1 TFLOP, about 45 minutes."""
    text = ("kernel k\ndim R, K, N\ninput x: bf16[R, K]\ninput w: bf16[K, N]\noutput y: bf16[R, N]\n"
            "y = x @ w\ncheck R=8192 K=8192 N=8192\ncheck R=128 K=128 N=128\n")  # fmt: skip
    first = _warnings(text).split("\n")[0]
    assert first == (
        "t.spec:7:1: warning: this check is 0.4 GiB of inputs and outputs and 1.10 TFLOP of matmuls: its "
        "generated test would run about 46 minutes on the CPU interpreter"
    )
