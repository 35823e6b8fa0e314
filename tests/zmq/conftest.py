"""Fixtures for the ZeroMQ listener tests: a real jobwire process serving Majordomo."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.servers import ServerProcess, start_jobwire
from tests.zmq.support import Zmq, zmq_peers


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    """jobwire with ZeroMQ and HTTP; `@pytest.mark.server_args(...)` adds serve flags."""
    marker = request.node.get_closest_marker("server_args")
    args = list(marker.args) if marker else []
    if "--mdp-heartbeat" not in args:
        # Workers in these tests beat only when a test says so: on a busy machine they must
        # not expire for being slow (30 s of silence allowed).
        args += ["--mdp-heartbeat", "10"]
    proc = start_jobwire(args, http=True, zmq=True)
    yield proc
    code = proc.stop()
    assert code == 0, f"jobwire exited with {code}:\n{proc.log()}"


@pytest.fixture
def peers(server: ServerProcess) -> Iterator[Zmq]:
    with zmq_peers(server) as made:
        yield made
