"""Fuzz the front end: random bytes and mutated example specs must only ever raise SpecError."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusegen.dsl import SpecError, check, parse
from fusegen.dsl.source import decode_spec

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.spec"))
SOURCES = [p.read_text() for p in EXAMPLES]
TOKENS = re.compile(r"\s+|\w+|\*\*|[<>=!]=|.", re.DOTALL)
#: tokens worth splicing in: every operator, keyword and bracket, plus troublemakers.
VOCABULARY = sorted({t for s in SOURCES for t in TOKENS.findall(s)} | {"1e999", "nan", "\x00", "\u2028", "?"})
#: Lark's internal terminal names, which must never reach a message.
LARK_TERMINAL = re.compile(
    r"__ANON|\$END|\b_NL\b|\b(LPAR|RPAR|LSQB|RSQB|COMMA|EQUAL|COLON|MUL_OP|COMPARE_OP)\b"
)
#: derandomized so CI is reproducible; many cases per test, each fast.
FUZZ = settings(
    max_examples=700, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck), database=None
)


def front_end(text: str) -> None:
    """Parse and check `text`; only SpecError may escape."""
    try:
        check(parse(text, "fuzz.spec"))
    except SpecError as err:
        assert err.diagnostics, "a SpecError always carries a diagnostic"
        rendered = err.render()
        assert not LARK_TERMINAL.search(rendered), f"a raw Lark terminal name leaked: {rendered}"


@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes(data: bytes) -> None:
    try:
        text = decode_spec(data, "fuzz.spec")
    except SpecError:
        return
    front_end(text)


@st.composite
def mutated_example(draw: st.DrawFn) -> str:
    """An example spec with a few tokens deleted, inserted, swapped or changed character by character."""
    tokens = TOKENS.findall(draw(st.sampled_from(SOURCES)))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(tokens) - 1))
        action = draw(st.sampled_from(["delete", "insert", "swap", "char"]))
        if action == "delete":
            del tokens[at]
        elif action == "insert":
            tokens.insert(at, draw(st.sampled_from(VOCABULARY)))
        elif action == "swap":
            other = draw(st.integers(0, len(tokens) - 1))
            tokens[at], tokens[other] = tokens[other], tokens[at]
        else:
            tokens[at] = draw(st.text(max_size=3))
    return "".join(tokens)


@FUZZ
@given(mutated_example())
def test_mutated_examples(text: str) -> None:
    front_end(text)


@FUZZ
@given(st.lists(st.sampled_from(VOCABULARY), max_size=40))
def test_token_soup(tokens: list[str]) -> None:
    front_end("".join(tokens))
