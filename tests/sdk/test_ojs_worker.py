"""The SDK's OjsWorker against a real jobwire server process over HTTP: tasks, acks and
nacks, the operator's states, SIGTERM, a server restart, and a Gearman job.

Tests wait for conditions they can observe (job states, the worker's state and counters,
marker files) up to a generous deadline; no outcome depends on timing.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from jobwire import Client
from jobwire.sdk.lifecycle import WorkerState
from tests.interop.gearman_raw import DEADLINE, wait_until
from tests.sdk.ojs_support import Markers, Ojs, WorkerProcess, new_worker, serving
from tests.sdk.support import REPO, child_env
from tests.servers import ServerProcess, start_jobwire, wait_for_port


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    proc = start_jobwire(http=True)
    yield proc
    proc.stop()


def test_sync_and_async_tasks_round_trip(server: ServerProcess) -> None:
    ojs = Ojs(server)
    worker = new_worker(server)
    with serving(worker):
        row = ojs.worker(worker.worker_id)
        assert row is not None and row["registered"] and row["concurrency"] == 2
        assert row["queues"] == sorted(worker.fetch_queues())
        synced = ojs.push("echo", [1, {"a": "b"}])
        text = ojs.push("echo", ["héllo"])
        awaited = ojs.push("upper", ["shout"])
        assert ojs.wait_job(synced, "completed")["result"] == {
            "args": [1, {"a": "b"}],
            "payload": '[1,{"a":"b"}]',
            "attempt": 1,
        }
        assert ojs.wait_job(text, "completed")["result"]["payload"] == "héllo"
        assert ojs.wait_job(awaited, "completed")["result"] == "SHOUT"
        wait_until(lambda: worker.heartbeats >= 2, "heartbeats answered")
    row = ojs.worker(worker.worker_id)
    assert row is not None and row["state"] == "terminated"  # deregistered on exit
    assert worker.state is WorkerState.TERMINATED


def test_failing_tasks_nack_and_the_retry_policy_applies(server: ServerProcess) -> None:
    ojs = Ojs(server)
    with serving(new_worker(server)):
        failed = ojs.push("fail", ["x"], max_attempts=3)
        job = ojs.wait_job(failed, "discarded")  # not retryable: one attempt
        assert job["attempt"] == 1
        (error,) = job["errors"]
        assert (error["code"], error["retryable"]) == ("ValueError", False)
        assert error["message"] == "bad input ['x']"
        assert error["details"]["error_class"] == "ValueError"
        assert "ValueError: bad input" in error["details"]["traceback"]

        retried = ojs.push(
            "retry",
            [],
            retry={"max_attempts": 3, "initial_interval": "PT0.01S", "jitter": False},
        )
        job = ojs.wait_job(retried, "discarded")  # retryable, until its attempts run out
        assert job["attempt"] == 3
        assert [(e["code"], e["retryable"], e["attempt"]) for e in job["errors"]] == [
            ("retry", True, 1),
            ("retry", True, 2),
            ("retry", True, 3),
        ]
        assert job["errors"][2]["message"] == "try again after attempt 3"

        stuck = ojs.push("stuck", [], max_attempts=1)
        job = ojs.wait_job(stuck, "discarded")
        assert job["errors"][0]["code"] == "timeout"


def test_the_operator_quiets_and_resumes_the_worker(server: ServerProcess) -> None:
    ojs = Ojs(server)
    worker = new_worker(server)
    with serving(worker):
        ojs.wait_job(ojs.push("upper", ["a"]), "completed")
        ojs.direct(worker.worker_id, "quiet")
        wait_until(lambda: worker.state is WorkerState.QUIET, "the worker quiet")
        fetches = worker.fetches
        beats = worker.heartbeats
        waiting = ojs.push("upper", ["b"])
        # Several heartbeats later it still takes nothing, and has not even asked: only the
        # one fetch that was already on its way when the quiet came may still be answered
        # (it gets nothing: the server gives a quiet worker no job).
        wait_until(lambda: worker.heartbeats >= beats + 5, "heartbeats while quiet")
        assert worker.state is WorkerState.QUIET
        assert worker.fetches <= fetches + 1
        assert ojs.job(waiting)["state"] == "available"
        ojs.direct(worker.worker_id, "running")
        assert ojs.wait_job(waiting, "completed")["result"] == "B"
        assert worker.state is WorkerState.RUNNING
        row = ojs.worker(worker.worker_id)
        assert row is not None and row["state"] == "running"


def test_terminate_makes_the_worker_finish_and_exit(server: ServerProcess) -> None:
    ojs = Ojs(server)
    markers = Markers()
    worker = new_worker(server)
    with serving(worker) as thread:
        held = ojs.push("hold", markers.args("t1"))
        markers.wait_started("t1")
        ojs.direct(worker.worker_id, "terminate")
        wait_until(lambda: worker.state is not WorkerState.RUNNING, "the worker stopping")
        later = ojs.push("upper", ["never"])
        markers.release("t1")
        thread.join(DEADLINE)  # it exits on its own
        assert not thread.is_alive()
    assert ojs.job(held)["state"] == "completed"
    assert ojs.job(held)["result"] == "held t1"
    assert ojs.job(later)["state"] == "available"
    row = ojs.worker(worker.worker_id)
    assert row is not None and row["state"] == "terminated"


def test_reconnects_after_a_server_restart(server: ServerProcess) -> None:
    worker = new_worker(server)
    with serving(worker):
        assert Ojs(server).wait_job(Ojs(server).push("upper", ["one"]), "completed")
        server.kill()
        wait_until(lambda: not worker._connected, "the worker noticed")
        assert server.http_port is not None
        # A new server on the same ports; it knows nothing of the worker.
        again = start_jobwire(["--http-port", str(server.http_port)], port=server.port)
        server.proc, server.workdir = again.proc, again.workdir
        wait_for_port(server.http_port, server.proc)
        wait_until(lambda: worker.registrations >= 2, "the worker registered again")
        ojs = Ojs(server)
        row = ojs.worker(worker.worker_id)
        assert row is not None and row["registered"]
        assert ojs.wait_job(ojs.push("upper", ["two"]), "completed")["result"] == "TWO"


def test_a_gearman_job_runs_on_an_ojs_worker(server: ServerProcess) -> None:
    with serving(new_worker(server)), Client([server.address], timeout=DEADLINE) as client:
        # Gearman's function is the OJS type and queue; args are [payload as UTF-8], and
        # the task written for Gearman gets the payload back as bytes.
        result = client.submit("reverse", "hello world")
        # The OJS result ("dlrow olleh") reaches Gearman as its JSON encoding.
        assert json.loads(result) == "dlrow olleh"
        assert json.loads(client.submit("echo", "héllo")) == {
            "args": ["héllo"],
            "payload": "héllo",
            "attempt": 1,
        }


def test_signals_quiet_resume_and_stop_the_worker_process(server: ServerProcess) -> None:
    ojs = Ojs(server)
    markers = Markers()
    proc = WorkerProcess(server)
    pid = proc.proc.pid

    def server_says(state: str) -> bool:
        row = ojs.worker_of_pid(pid)
        return row is not None and row["state"] == state

    def beats_since(mark: str | None, count: int) -> bool:
        seen = ojs.worker_of_pid(pid)
        stamps.append(seen["last_heartbeat_at"] if seen else None)
        return len(set(stamps) - {mark}) >= count

    stamps: list[str | None] = []
    try:
        wait_until(lambda: server_says("running"), "the worker registered")
        ojs.wait_job(ojs.push("upper", ["up"]), "completed")

        proc.proc.send_signal(signal.SIGTSTP)
        wait_until(lambda: server_says("quiet"), "the server saw it quiet")
        waiting = ojs.push("upper", ["wait"])
        row = ojs.worker_of_pid(pid)
        assert row is not None
        wait_until(lambda: beats_since(row["last_heartbeat_at"], 3), "heartbeats while quiet")
        assert ojs.job(waiting)["state"] == "available"
        assert server_says("quiet")

        proc.proc.send_signal(signal.SIGCONT)
        assert ojs.wait_job(waiting, "completed")["result"] == "WAIT"
        assert server_says("running")

        held = ojs.push("hold", markers.args("p1"))
        markers.wait_started("p1")
        proc.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: server_says("quiet"), "the server saw it stopping")
        markers.release("p1")
        assert proc.wait() == 0, proc.log()
        assert ojs.job(held)["result"] == "held p1"
        assert server_says("terminated")  # deregistered
    finally:
        proc.kill()


def test_the_cli_runs_a_gearman_worker_s_tasks_over_ojs(server: ServerProcess) -> None:
    """`jobwire worker --ojs URL MODULE:ATTR` with a Gearman `Worker` there."""
    ojs = Ojs(server)
    command = [
        sys.executable,
        "-m",
        "jobwire",
        "worker",
        "--ojs",
        ojs.url,
        "--queue",
        "reverse",
        "tests.sdk.fixtures_tasks:worker",
    ]
    proc = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=child_env()
    )
    try:
        job = ojs.push("reverse", ["abc"], queue="reverse")
        assert ojs.wait_job(job, "completed")["result"] == "cba"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(DEADLINE) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_its_own_quiet_and_the_operator_s_are_kept_apart(server: ServerProcess) -> None:
    """quiet()/resume() (SIGTSTP/SIGCONT) reach the server; an operator's quiet outlasts the
    worker's own resume, and its own quiet outlasts the operator's running."""
    ojs = Ojs(server)
    worker = new_worker(server)

    def server_state() -> str | None:
        row = ojs.worker(worker.worker_id)
        return row["state"] if row else None

    with serving(worker):
        worker.quiet()
        wait_until(lambda: server_state() == "quiet", "the server saw it quiet")
        worker.resume()
        wait_until(lambda: server_state() == "running", "the server saw it running")
        wait_until(lambda: worker.state is WorkerState.RUNNING, "the worker running")

        ojs.direct(worker.worker_id, "quiet")
        wait_until(lambda: worker.state is WorkerState.QUIET, "the worker quiet")
        worker.resume()  # the operator holds it quiet
        beats = worker.heartbeats
        wait_until(lambda: worker.heartbeats >= beats + 3, "heartbeats after the resume")
        assert worker.state is WorkerState.QUIET
        assert server_state() == "quiet"

        worker.quiet()  # now quiet by its own choice too
        ojs.direct(worker.worker_id, "running")
        beats = worker.heartbeats
        wait_until(lambda: worker.heartbeats >= beats + 3, "heartbeats after running")
        assert worker.state is WorkerState.QUIET
        assert server_state() == "quiet"  # it reports its own quiet

        worker.resume()
        wait_until(lambda: worker.state is WorkerState.RUNNING, "the worker running again")
        job = ojs.push("upper", ["back"])
        assert ojs.wait_job(job, "completed")["result"] == "BACK"
        assert server_state() == "running"
