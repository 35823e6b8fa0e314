"""An operator directs a Gearman worker through the one admin endpoint (server-side: a
Gearman worker has no lifecycle messages): quiet gets no job, running resumes, terminate
closes its connection once the job it holds is done; `workers` shows the state."""

from __future__ import annotations

import pytest

from tests.interop.gearman_raw import Cmd, GearmanSocket, admin
from tests.ojs.dsl import Runner
from tests.servers import ServerProcess, start_jobwire


@pytest.fixture
def server() -> ServerProcess:
    proc = start_jobwire(http=True)
    yield proc  # type: ignore[misc]
    proc.stop()


def direct(http: Runner, worker_id: str, state: str) -> int:
    path = f"/ojs/v1/admin/workers/{worker_id}/state"
    return http.request("POST", path, {"state": state}).status


def test_quiet_running_and_terminate_reach_a_gearman_worker(server: ServerProcess) -> None:
    http = Runner(f"http://127.0.0.1:{server.http_port}")
    with GearmanSocket(server) as worker, GearmanSocket(server) as client:
        worker.send(Cmd.SET_CLIENT_ID, "w1")
        worker.send(Cmd.CAN_DO, "job")
        worker.send(Cmd.ECHO_REQ, "sync")
        worker.expect(Cmd.ECHO_RES)
        [listed] = http.request("GET", "/ojs/v1/workers?protocol=gearman").body["workers"]
        worker_id = listed["worker_id"]
        for _ in range(2):
            client.send(Cmd.SUBMIT_JOB_BG, "job", "", b"x")
            client.expect(Cmd.JOB_CREATED)

        assert direct(http, worker_id, "quiet") == 200
        worker.send(Cmd.GRAB_JOB)
        worker.expect(Cmd.NO_JOB)  # quiet: nothing new
        assert "w1[quiet] : job" in admin(server, "workers")

        assert direct(http, worker_id, "running") == 200
        worker.expect(Cmd.NOOP)  # resumed while work waits: woken
        worker.send(Cmd.GRAB_JOB)
        handle = worker.expect(Cmd.JOB_ASSIGN).args[0]

        assert direct(http, worker_id, "terminate") == 200
        assert direct(http, worker_id, "running") == 409
        worker.send(Cmd.GRAB_JOB)
        worker.expect(Cmd.NO_JOB)  # terminating: nothing new either
        worker.send(Cmd.WORK_COMPLETE, handle, b"done")
        assert worker.sock.recv(1) == b""  # closed once its job is done
    assert direct(http, "gearman:999", "quiet") == 404
