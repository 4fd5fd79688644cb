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
        "         ^"
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
        "kernel k\ndim R, H, Z, N = 4\nrequire Z % 2 == 0\ninput x: f32[R]\noutput y: f32[R]\n"
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
