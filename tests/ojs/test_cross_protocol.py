"""One engine, two protocols: OJS jobs run on Gearman workers and Gearman jobs on OJS workers.

Mapping rule (README, "Open Job Spec"): OJS type = Gearman function; an OJS job's payload is
the JSON encoding of its args; a Gearman job appears to OJS in the queue named after its
function with args = [payload as a UTF-8 string].
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.interop.gearman_raw import Cmd, GearmanSocket
from tests.ojs.dsl import Runner
from tests.servers import ServerProcess, start_jobwire


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    proc = start_jobwire(http=True)
    yield proc
    code = proc.stop()
    assert code == 0, f"jobwire exited with {code}:\n{proc.log()}"


def test_ojs_job_runs_on_gearman_worker(server: ServerProcess) -> None:
    http = Runner(f"http://127.0.0.1:{server.http_port}")
    pushed = http.request("POST", "/ojs/v1/jobs", {"type": "resize", "args": ["a.png", 64]})
    assert pushed.status == 201, pushed.raw
    job_id = pushed.body["job"]["id"]
    with GearmanSocket(server) as worker:
        worker.send(Cmd.CAN_DO, "resize")
        assigned = worker.grab()
        assert assigned.type is Cmd.JOB_ASSIGN_UNIQ
        handle, function, _unique, payload = assigned.args
        assert handle.decode() == job_id
        assert function == b"resize"
        assert json.loads(payload) == ["a.png", 64]
        active = http.request("GET", f"/ojs/v1/jobs/{job_id}")
        assert active.body["job"]["state"] == "active"
        worker.send(Cmd.WORK_COMPLETE, handle, b"done")
        # WORK_COMPLETE has no reply; a round trip on the same socket orders it before the GET.
        worker.request(Cmd.ECHO_REQ, b"x", reply=Cmd.ECHO_RES)
    done = http.request("GET", f"/ojs/v1/jobs/{job_id}")
    assert done.status == 200, done.raw
    assert done.body["job"]["state"] == "completed"
    assert done.body["job"]["result"] == "done"


def test_gearman_background_job_fetched_and_acked_over_ojs(server: ServerProcess) -> None:
    http = Runner(f"http://127.0.0.1:{server.http_port}")
    with GearmanSocket(server) as client:
        handle = client.submit_bg("thumbnail", b"cat.jpg")
        fetched = http.request(
            "POST", "/ojs/v1/workers/fetch", {"queues": ["thumbnail"], "worker_id": "w1"}
        )
        assert fetched.status == 200, fetched.raw
        [job] = fetched.body["jobs"]
        assert job["id"] == handle
        assert job["type"] == "thumbnail"
        assert job["queue"] == "thumbnail"
        assert job["args"] == ["cat.jpg"]
        status = client.request(Cmd.GET_STATUS, handle, reply=Cmd.STATUS_RES)
        assert status.args[1:3] == (b"1", b"1")  # known, running: both views agree
        acked = http.request("POST", "/ojs/v1/workers/ack", {"job_id": handle, "result": "ok"})
        assert acked.status == 200, acked.raw
        assert acked.body["state"] == "completed"
        status = client.request(Cmd.GET_STATUS, handle, reply=Cmd.STATUS_RES)
        assert status.args[1] == b"0"  # finished jobs are unknown to Gearman, as in gearmand
