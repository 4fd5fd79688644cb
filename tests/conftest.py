"""Options shared by every test folder (pytest reads options only from the root conftest)."""

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite golden files instead of comparing")
