from __future__ import annotations

from collections.abc import Iterator

import pytest

from jobwire import native
from tests.servers import ServerProcess, start_gearmand, start_jobwire


def pytest_report_header() -> str:
    # Server subprocesses decide the same way (JOBWIRE_PURE, JOBWIRE_ZMQFRAMES are inherited).
    from jobwire.server.zmq import wholemessages

    return f"jobwire hot path: {native.status()}; zeromq: {wholemessages.status()}"


@pytest.fixture
def jobwire() -> Iterator[ServerProcess]:
    """A fresh jobwire process on a free port with the memory store."""
    server = start_jobwire()
    yield server
    code = server.stop()
    assert code == 0, f"jobwire exited with {code}:\n{server.log()}"


@pytest.fixture
def gearmand() -> Iterator[ServerProcess]:
    """A fresh gearmand (Debian's gearman-job-server) on a free port."""
    server = start_gearmand()
    yield server
    server.stop()


@pytest.fixture(params=["jobwire", "gearmand"])
def any_server(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    """The same test against jobwire and against gearmand."""
    server = start_jobwire() if request.param == "jobwire" else start_gearmand()
    yield server
    server.stop()
