from __future__ import annotations

import pytest

from tests.engine.fakes import Harness


@pytest.fixture
def h() -> Harness:
    """An engine on a fake clock, with the default configuration."""
    return Harness()
