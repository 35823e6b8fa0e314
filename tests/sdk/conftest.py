"""Fixtures shared by the SDK tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.sdk.support import wait_workers, worker_thread
from tests.servers import ServerProcess, start_gearmand, start_jobwire


@pytest.fixture(scope="module", params=["jobwire", "gearmand"])
def served(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    """jobwire, then gearmand, with a fixture worker (concurrency 2) registered on it.

    Like `any_server`, but shared by the module's tests to keep the suite quick; tests use
    their own marker folders and unique keys, so they do not see each other's jobs.
    """
    server = start_jobwire() if request.param == "jobwire" else start_gearmand()
    try:
        with worker_thread([server.address]):
            wait_workers(server)
            yield server
    finally:
        server.stop()
