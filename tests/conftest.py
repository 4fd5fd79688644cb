"""Options shared by every test folder (pytest reads options only from the root conftest)."""

import zlib

import pytest
import torch


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite golden files instead of comparing")


@pytest.fixture(autouse=True)
def _seeded_torch(request: pytest.FixtureRequest) -> None:
    """Every test draws its unseeded torch.randn from a seed of its own id: a failure reproduces on the
    next run and on any worker, whatever ran before it in that process."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
