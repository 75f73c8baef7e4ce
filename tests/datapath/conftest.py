"""One compile of the real datapath for every packet-table and fuzz test."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def datapath():
    from .harness import Datapath
    dp = Datapath()
    try:
        yield dp
    finally:
        dp.close()


@pytest.fixture
def fresh(datapath):
    """The datapath as just attached and configured (no learnt state)."""
    datapath.configure()
    return datapath
