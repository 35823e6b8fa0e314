"""The Gearman admin commands `shutdown` and `shutdown graceful`, as gearmand has them."""

from __future__ import annotations

import socket

import pytest

from tests.interop.gearman_raw import Cmd, GearmanSocket
from tests.servers import start_jobwire

pytestmark = pytest.mark.interop


def test_shutdown_answers_ok_and_stops_the_server() -> None:
    server = start_jobwire()
    try:
        with GearmanSocket(server) as conn:
            assert conn.admin("shutdown") == "OK\r\n"
        assert server.proc.wait(60) == 0
    finally:
        server.kill()


def test_shutdown_graceful_stops_accepting_and_waits_for_running_jobs() -> None:
    server = start_jobwire()
    try:
        with GearmanSocket(server) as worker, GearmanSocket(server) as client:
            client.send(Cmd.SUBMIT_JOB_BG, "slow", "", b"x")
            client.expect(Cmd.JOB_CREATED)
            worker.send(Cmd.CAN_DO, "slow")
            worker.send(Cmd.GRAB_JOB)
            handle = worker.expect(Cmd.JOB_ASSIGN).args[0]
            assert client.admin("shutdown graceful") == "OK\r\n"
            with pytest.raises(OSError):  # no new connections
                socket.create_connection(("127.0.0.1", server.port), timeout=5).close()
            assert server.proc.poll() is None  # the running job holds it
            worker.send(Cmd.WORK_COMPLETE, handle, b"done")
            assert server.proc.wait(60) == 0
    finally:
        server.kill()
