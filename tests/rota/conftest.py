"""Fixtures for the Rota tests: a real jobwire process with HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.servers import ServerProcess, start_jobwire


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    """jobwire with HTTP; `@pytest.mark.server_args(...)` adds serve flags."""
    marker = request.node.get_closest_marker("server_args")
    args = list(marker.args) if marker else []
    proc = start_jobwire(args, http=True)
    yield proc
    code = proc.stop()
    assert code == 0, f"jobwire exited with {code}:\n{proc.log()}"
