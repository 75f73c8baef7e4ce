"""The packet-table and fuzz tests share one compile of the real datapath
(the session fixture `datapath` in tests/conftest.py)."""
from __future__ import annotations

import pytest


@pytest.fixture
def fresh(datapath):
    """The datapath as just attached and configured (no learnt state)."""
    datapath.configure()
    return datapath
