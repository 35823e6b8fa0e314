"""The OJS worker protocol beyond the conformance suite, against a real jobwire process:
registration and server-enforced concurrency, dead-worker recovery, deregistration, the
operator's worker state (HTTP admin endpoint and `jobwire worker-state`).

Waits poll up to a deadline; they never decide a test by how long something took.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.ojs.dsl import Response, Runner
from tests.servers import ServerProcess, start_jobwire

DEADLINE = 20.0


def poll(check: Callable[[], Any], deadline: float = DEADLINE) -> Any:
    end = time.monotonic() + deadline
    while True:
        value = check()
        if value or time.monotonic() > end:
            return value
        time.sleep(0.05)


def serve(*args: str) -> Iterator[ServerProcess]:
    proc = start_jobwire(["--allow-reset", *args], http=True)
    yield proc
    code = proc.stop()
    assert code == 0, f"jobwire exited with {code}:\n{proc.log()}"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """Default heartbeat timeout (30 s): no worker of these tests dies by accident."""
    yield from serve()


@pytest.fixture(scope="module")
def hasty_server() -> Iterator[ServerProcess]:
    """Workers are dead after one silent second."""
    yield from serve("--heartbeat-timeout", "1")


def runner(server: ServerProcess) -> Runner:
    http = Runner(f"http://127.0.0.1:{server.http_port}")
    http.reset()
    return http


@pytest.fixture
def http(server: ServerProcess) -> Runner:
    return runner(server)


def ok(response: Response, status: int = 200) -> Any:
    assert response.status == status, response.raw
    return response.body


def push(http: Runner, queue: str, n: int = 1) -> list[str]:
    return [
        ok(
            http.request(
                "POST", "/ojs/v1/jobs", {"type": "t", "args": [i], "options": {"queue": queue}}
            ),
            201,
        )["job"]["id"]
        for i in range(n)
    ]


def fetch(http: Runner, worker: str, queue: str, count: int = 1) -> list[str]:
    body = {"queues": [queue], "worker_id": worker, "count": count}
    return [job["id"] for job in ok(http.request("POST", "/ojs/v1/workers/fetch", body))["jobs"]]


def test_registration_declares_queues_and_concurrency_the_server_enforces(http: Runner) -> None:
    reply = ok(
        http.request(
            "POST",
            "/ojs/v1/workers/register",
            {
                "worker_id": "w-conc",
                "hostname": "h",
                "pid": 1,
                "queues": ["conc"],
                "concurrency": 2,
            },
        )
    )
    assert reply["worker_id"] == "w-conc"
    assert reply["heartbeat_timeout"] == 30
    push(http, "conc", 3)
    held = fetch(http, "w-conc", "conc", count=3)
    assert len(held) == 2  # at its concurrency
    assert fetch(http, "w-conc", "conc") == []
    ok(http.request("POST", "/ojs/v1/workers/ack", {"job_id": held[0]}))
    # Without `queues`, a registered worker fetches from the queues it declared.
    body = ok(http.request("POST", "/ojs/v1/workers/fetch", {"worker_id": "w-conc"}))
    assert len(body["jobs"]) == 1
    workers = ok(http.request("GET", "/ojs/v1/workers"))["workers"]
    [listed] = [w for w in workers if w["worker_id"] == "w-conc"]
    assert listed["concurrency"] == 2 and listed["queues"] == ["conc"]


def test_a_registered_worker_that_stops_beating_loses_its_jobs(
    hasty_server: ServerProcess,
) -> None:
    http = runner(hasty_server)
    [job_id] = push(http, "d")
    assert fetch(http, "w-dead", "d") == [job_id]
    # Registered only now, holding the job: its silence starts counting here.
    ok(http.request("POST", "/ojs/v1/workers/register", {"worker_id": "w-dead", "queues": ["d"]}))

    def requeued() -> Any:
        job = ok(http.request("GET", f"/ojs/v1/jobs/{job_id}"))["job"]
        return job if job["state"] == "available" else None

    job = poll(requeued)
    assert job, "the dead worker's job did not come back"
    assert job["attempt"] == 1  # the lost attempt counts
    assert job["error"]["type"] == "worker_death"
    workers = ok(http.request("GET", "/ojs/v1/workers"))["workers"]
    assert [w["state"] for w in workers if w["worker_id"] == "w-dead"] == ["terminated"]
    assert fetch(http, "w-other", "d") == [job_id]


def test_deregistration_requeues_what_the_worker_held(http: Runner) -> None:
    ok(http.request("POST", "/ojs/v1/workers/register", {"worker_id": "w-bye"}))
    [job_id] = push(http, "bye")
    assert fetch(http, "w-bye", "bye") == [job_id]
    reply = ok(http.request("POST", "/ojs/v1/workers/deregister", {"worker_id": "w-bye"}))
    assert reply["jobs_requeued"] == [job_id]
    assert ok(http.request("GET", f"/ojs/v1/jobs/{job_id}"))["job"]["state"] == "available"
    missing = http.request("POST", "/ojs/v1/workers/deregister", {"worker_id": "w-bye"})
    assert missing.status == 404 and missing.body["error"]["code"] == "not_found"


def worker_state(
    server: ServerProcess, worker: str, state: str
) -> subprocess.CompletedProcess[str]:
    url = f"http://127.0.0.1:{server.http_port}"
    cmd = [sys.executable, "-m", "jobwire", "worker-state", worker, state, "--url", url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_operator_directs_a_worker_with_the_cli(server: ServerProcess, http: Runner) -> None:
    ok(http.request("POST", "/ojs/v1/workers/register", {"worker_id": "w-op"}))
    push(http, "op")
    done = worker_state(server, "w-op", "quiet")
    assert done.returncode == 0, done.stderr
    assert "w-op: quiet" in done.stdout
    beat = ok(http.request("POST", "/ojs/v1/workers/heartbeat", {"worker_id": "w-op"}))
    assert beat["state"] == "quiet"
    assert fetch(http, "w-op", "op") == []  # quiet: nothing new
    assert worker_state(server, "w-op", "running").returncode == 0
    assert len(fetch(http, "w-op", "op")) == 1
    assert worker_state(server, "w-op", "terminate").returncode == 0
    beat = ok(http.request("POST", "/ojs/v1/workers/heartbeat", {"worker_id": "w-op"}))
    assert beat["state"] == "terminate"
    refused = worker_state(server, "w-op", "running")
    assert refused.returncode != 0 and "409" in refused.stderr
    unknown = worker_state(server, "nobody", "quiet")
    assert unknown.returncode != 0 and "404" in unknown.stderr


def test_admin_endpoint_validates_the_state(http: Runner) -> None:
    ok(http.request("POST", "/ojs/v1/workers/register", {"worker_id": "w-val"}))
    bad = http.request("POST", "/ojs/v1/admin/workers/w-val/state", {"state": "asleep"})
    assert bad.status == 400 and bad.body["error"]["code"] == "invalid_request"


def test_the_worker_protocols_own_paths_are_aliases(http: Runner) -> None:
    """The OJS worker protocol's `POST /jobs/fetch`, `/jobs/:id/ack` and `/jobs/:id/nack`."""
    first, second = push(http, "alias", 2)
    fetched = ok(http.request("POST", "/ojs/v1/jobs/fetch", {"queues": ["alias"], "count": 2}))
    assert sorted(job["id"] for job in fetched["jobs"]) == sorted([first, second])
    acked = ok(http.request("POST", f"/ojs/v1/jobs/{first}/ack", {"result": {"ok": 1}}))
    assert acked["state"] == "completed"
    nacked = ok(
        http.request(
            "POST",
            f"/ojs/v1/jobs/{second}/nack",
            {"error": {"message": "no", "retryable": False}},
        )
    )
    assert nacked["job"]["state"] == "discarded"
    mismatch = http.request("POST", f"/ojs/v1/jobs/{first}/ack", {"job_id": second})
    assert mismatch.status == 400


def test_a_worker_that_resumes_itself_is_followed_unless_an_operator_quieted_it(
    server: ServerProcess, http: Runner
) -> None:
    """The worker adopts the state the server returns (the seed): a worker's own quiet
    (SIGTSTP) and running (SIGCONT) are both followed; an operator's quiet holds."""
    ok(http.request("POST", "/ojs/v1/workers/register", {"worker_id": "w-self"}))
    push(http, "self")

    def beat(state: str) -> str:
        body = {"worker_id": "w-self", "state": state}
        answer: str = ok(http.request("POST", "/ojs/v1/workers/heartbeat", body))["state"]
        return answer

    assert beat("quiet") == "quiet"
    assert fetch(http, "w-self", "self") == []
    assert beat("running") == "running"  # followed: it resumed itself
    assert len(fetch(http, "w-self", "self")) == 1
    assert worker_state(server, "w-self", "quiet").returncode == 0
    assert beat("running") == "quiet"  # the operator's quiet holds
    assert worker_state(server, "w-self", "running").returncode == 0
    assert beat("running") == "running"
