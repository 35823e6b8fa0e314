"""pygearman 0.2.6 (import name `gearman`) client, worker and admin client.

What pygearman sends (recorded against gearmand 1.1.20):
- GearmanClient: SUBMIT_JOB / _BG / _HIGH / _HIGH_BG / _LOW / _LOW_BG with a random 32-hex-digit
  unique unless one is given; it expects JOB_CREATED replies in submission order per
  connection. Results are looked up by handle in a WeakValueDictionary, so two requests on one
  connection that coalesce onto the same handle confuse it (only the last one is tracked).
- GearmanWorker: [SET_CLIENT_ID], RESET_ABILITIES, CAN_DO per task, PRE_SLEEP; on NOOP it sends
  GRAB_JOB_UNIQ and expects JOB_ASSIGN_UNIQ; after each job PRE_SLEEP again. Task names arrive
  as bytes, so tasks must be registered as bytes (`b"rev"`).
- GearmanAdminClient: ECHO_REQ for ping_server, text commands ending in "\n" otherwise. Its
  parser splits replies on "\n" only, keeps any "\r", and returns `version`/`getpid` replies
  with their "OK " prefix.

Workers run in a thread whose after_poll() hook stops the loop once the test is done; they
are only stopped after every job they were given has finished.
"""

from __future__ import annotations

import queue
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import gearman  # type: ignore[import-untyped]
import pytest
from gearman.constants import (  # type: ignore[import-untyped]
    JOB_COMPLETE,
    JOB_CREATED,
    JOB_FAILED,
    PRIORITY_HIGH,
    PRIORITY_LOW,
)
from gearman.errors import ProtocolError  # type: ignore[import-untyped]

from tests.interop.gearman_raw import (
    DEADLINE,
    Cmd,
    GearmanSocket,
    priority_status,
    register_worker,
    wait_for_status,
    wait_for_workers,
    wait_until,
)
from tests.servers import ServerProcess

pytestmark = pytest.mark.interop

Task = Callable[[Any, Any], bytes]


class ServerError(Exception):
    """An ERROR packet the server sent to a pygearman client."""

    def __init__(self, code: bytes, text: bytes) -> None:
        super().__init__(f"{code!r}: {text!r}")
        self.code = code
        self.text = text


class Client(gearman.GearmanClient):  # type: ignore[misc]
    """GearmanClient that raises on an ERROR packet.

    Stock pygearman only logs it and keeps waiting for a JOB_CREATED that never comes.
    """

    def on_gearman_error(self, error_code: bytes, error_text: bytes) -> bool:
        raise ServerError(error_code, error_text)


class StoppableWorker(gearman.GearmanWorker):  # type: ignore[misc]
    def __init__(self, host_list: list[str]) -> None:
        super().__init__(host_list)
        self.stop = threading.Event()

    def after_poll(self, any_activity: bool) -> bool:
        return not self.stop.is_set()


@contextmanager
def worker_thread(
    server: ServerProcess, tasks: dict[bytes, Task], client_id: str | None = None
) -> Iterator[StoppableWorker]:
    """A pygearman worker running `work()` in a thread, registered before this yields."""
    worker = StoppableWorker([server.address])
    if client_id is not None:
        worker.set_client_id(client_id)
    for name, callback in tasks.items():
        worker.register_task(name, callback)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.work(poll_timeout=0.05)  # how often the loop looks at `stop` when idle
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, name="pygearman-worker", daemon=True)
    thread.start()
    try:
        for name in tasks:
            wait_for_workers(server, name.decode())
        yield worker
    finally:
        worker.stop.set()
        thread.join(DEADLINE)
    assert not thread.is_alive(), "worker thread did not stop"
    assert not errors, f"worker thread failed: {errors[0]!r}"


def reverse(worker: Any, job: Any) -> bytes:
    return bytes(job.data[::-1])


def recording(log: queue.Queue[Any]) -> Task:
    """A task that returns the reversed workload and puts the job it got on `log`."""

    def task(worker: Any, job: Any) -> bytes:
        log.put(job)
        return bytes(job.data[::-1])

    return task


def take(log: queue.Queue[Any], count: int) -> list[Any]:
    return [log.get(timeout=DEADLINE) for _ in range(count)]


# -- client + worker ----------------------------------------------------------------------------


def test_foreground_job(any_server: ServerProcess) -> None:
    log: queue.Queue[Any] = queue.Queue()
    with worker_thread(any_server, {b"rev": recording(log)}):
        client = Client([any_server.address])
        request = client.submit_job("rev", "hello", poll_timeout=DEADLINE)
        assert (request.state, request.result) == (JOB_COMPLETE, b"olleh")
        (job,) = take(log, 1)
    assert job.handle == request.job.handle
    assert (job.task, job.data) == (b"rev", b"hello")
    assert job.unique == request.job.unique.encode()
    assert re.fullmatch(rb"[0-9a-f]{32}", job.unique)  # pygearman's generated unique


def test_background_job_and_status(any_server: ServerProcess) -> None:
    client = Client([any_server.address])
    request = client.submit_job("rev", "queued", background=True, poll_timeout=DEADLINE)
    assert request.state == JOB_CREATED and request.complete
    # Nobody can run it yet: known, not running.
    client.get_job_status(request, poll_timeout=DEADLINE)
    status = request.status
    assert (status["known"], status["running"]) == (True, False)
    assert (status["numerator"], status["denominator"]) == (0, 0)

    log: queue.Queue[Any] = queue.Queue()
    with worker_thread(any_server, {b"rev": recording(log)}):
        (job,) = take(log, 1)
        assert (job.handle, job.data) == (request.job.handle, b"queued")

        def finished() -> bool:
            client.get_job_status(request, poll_timeout=DEADLINE)
            return request.status["known"] is False

        wait_until(finished, "background job to be finished")


def test_submit_multiple_jobs(any_server: ServerProcess) -> None:
    words = ["alpha", "beta", "gamma", "delta", "epsilon"]
    with worker_thread(any_server, {b"rev": reverse}):
        client = Client([any_server.address])
        requests = client.submit_multiple_jobs(
            [{"task": "rev", "data": w} for w in words], poll_timeout=DEADLINE
        )
        assert [(r.state, r.result) for r in requests] == [
            (JOB_COMPLETE, w[::-1].encode()) for w in words
        ]
        assert len({r.job.handle for r in requests}) == len(words)


def test_foreground_priorities(any_server: ServerProcess) -> None:
    # Queued (JOB_CREATED received) before any worker exists, then served high, normal, low.
    client = Client([any_server.address])
    jobs = [
        {"task": "prio", "data": "low", "priority": PRIORITY_LOW},
        {"task": "prio", "data": "normal"},
        {"task": "prio", "data": "high", "priority": PRIORITY_HIGH},
    ]
    requests = client.submit_multiple_jobs(jobs, wait_until_complete=False, poll_timeout=DEADLINE)
    assert [r.state for r in requests] == [JOB_CREATED] * 3
    assert priority_status(any_server)["prio"] == (1, 1, 1, 0)

    log: queue.Queue[Any] = queue.Queue()
    with worker_thread(any_server, {b"prio": recording(log)}):
        client.wait_until_jobs_completed(requests, poll_timeout=DEADLINE)
        assert [(r.state, r.result) for r in requests] == [
            (JOB_COMPLETE, b"wol"),
            (JOB_COMPLETE, b"lamron"),
            (JOB_COMPLETE, b"hgih"),
        ]
        assert [job.data for job in take(log, 3)] == [b"high", b"normal", b"low"]


def test_background_priorities(any_server: ServerProcess) -> None:
    client = Client([any_server.address])
    jobs = [
        {"task": "prio", "data": "low", "priority": PRIORITY_LOW},
        {"task": "prio", "data": "normal"},
        {"task": "prio", "data": "high", "priority": PRIORITY_HIGH},
    ]
    requests = client.submit_multiple_jobs(jobs, background=True, poll_timeout=DEADLINE)
    assert [r.state for r in requests] == [JOB_CREATED] * 3
    assert priority_status(any_server)["prio"] == (1, 1, 1, 0)

    log: queue.Queue[Any] = queue.Queue()
    with worker_thread(any_server, {b"prio": recording(log)}):
        assert [job.data for job in take(log, 3)] == [b"high", b"normal", b"low"]


def test_unique_coalesces(any_server: ServerProcess) -> None:
    # A foreground job with the unique of a queued background job joins it: same handle, and
    # the waiting client gets the result of the background job's workload.
    client = Client([any_server.address])
    background = client.submit_job(
        "rev", "first", unique="u1", background=True, poll_timeout=DEADLINE
    )
    waiting = client.submit_job(
        "rev", "second", unique="u1", wait_until_complete=False, poll_timeout=DEADLINE
    )
    assert waiting.state == JOB_CREATED
    assert waiting.job.handle == background.job.handle

    log: queue.Queue[Any] = queue.Queue()
    with worker_thread(any_server, {b"rev": recording(log)}):
        client.wait_until_jobs_completed([waiting], poll_timeout=DEADLINE)
        assert (waiting.state, waiting.result) == (JOB_COMPLETE, b"tsrif")
        (job,) = take(log, 1)
        assert (job.unique, job.data) == (b"u1", b"first")
        wait_for_status(any_server, "rev", lambda row: row[0] == 0, "no job left")
    assert log.empty()


def test_status_data_and_warning_from_worker(any_server: ServerProcess) -> None:
    proceed = threading.Event()

    def slow(worker: Any, job: Any) -> bytes:
        worker.send_job_status(job, 3, 10)
        worker.send_job_data(job, b"chunk")
        worker.send_job_warning(job, b"careful")
        assert proceed.wait(DEADLINE)
        return b"done"

    client = Client([any_server.address])
    request = client.submit_job("slow", "x", wait_until_complete=False, poll_timeout=DEADLINE)
    with worker_thread(any_server, {b"slow": slow}):
        # GET_STATUS while the worker holds the job, until its WORK_STATUS has been seen.
        def reported() -> bool:
            client.get_job_status(request, poll_timeout=DEADLINE)
            return bool(request.status["numerator"] == 3)

        wait_until(reported, "WORK_STATUS 3/10")
        status = request.status
        assert (status["known"], status["running"], status["denominator"]) == (True, True, 10)
        proceed.set()
        client.wait_until_jobs_completed([request], poll_timeout=DEADLINE)
    assert (request.state, request.result) == (JOB_COMPLETE, b"done")
    assert list(request.data_updates) == [b"chunk"]
    assert list(request.warning_updates) == [b"careful"]


def test_worker_exception_fails_the_job(any_server: ServerProcess) -> None:
    def broken(worker: Any, job: Any) -> bytes:
        raise RuntimeError("boom")

    with worker_thread(any_server, {b"broken": broken}):
        client = Client([any_server.address])
        request = client.submit_job("broken", "x", poll_timeout=DEADLINE)
        assert (request.state, request.result) == (JOB_FAILED, None)


# -- admin client ------------------------------------------------------------------------------


def test_admin_ping(any_server: ServerProcess) -> None:
    elapsed = gearman.GearmanAdminClient([any_server.address]).ping_server()
    assert isinstance(elapsed, float) and elapsed >= 0


def test_admin_version_and_pid(any_server: ServerProcess) -> None:
    admin = gearman.GearmanAdminClient([any_server.address], poll_timeout=DEADLINE)
    assert re.fullmatch(r"OK \d+(\.\d+)+\S*", admin.get_version())
    assert admin.get_pid() == f"OK {any_server.proc.pid}"


def test_admin_listings(any_server: ServerProcess) -> None:
    with GearmanSocket(any_server) as raw:
        handles = {u: raw.submit_bg("queued", u, unique=u) for u in ("u-a", "u-b")}
    with worker_thread(any_server, {b"idle": reverse}, client_id="py-worker"):
        admin = gearman.GearmanAdminClient([any_server.address], poll_timeout=DEADLINE)

        assert sorted(admin.get_status(), key=lambda row: row["task"]) == [
            {"task": "idle", "queued": 0, "running": 0, "workers": 1},
            {"task": "queued", "queued": 2, "running": 0, "workers": 0},
        ]

        workers = admin.get_workers()
        ours = [w for w in workers if w["client_id"] == "py-worker"]
        assert len(ours) == 1
        assert ours[0]["ip"] == "127.0.0.1" and ours[0]["tasks"] == ("idle",)
        for entry in workers:
            assert entry["file_descriptor"].isdigit()
            if entry is not ours[0]:
                assert (entry["client_id"], entry["tasks"]) == ("-", ())

        # show jobs: "queued" is really the retry count, "enabled" the persisted flag.
        jobs = [(r["handle"], r["queued"], r["canceled"], r["enabled"]) for r in admin.get_jobs()]
        assert sorted(jobs) == sorted((h, 0, 0, 1) for h in handles.values())
        assert sorted(row["unique"] for row in admin.get_unique_jobs()) == [["u-a"], ["u-b"]]


def test_admin_cancel_job(any_server: ServerProcess) -> None:
    with GearmanSocket(any_server) as raw:
        keep = raw.submit_bg("queued", "keep")
        drop = raw.submit_bg("queued", "drop")
    admin = gearman.GearmanAdminClient([any_server.address], poll_timeout=DEADLINE)
    # The reply is "OK\r\n"; pygearman splits on "\n" only, so the "\r" stays.
    assert admin.cancel_job(drop).rstrip("\r") == "OK"
    assert admin.cancel_job("H:nowhere:1").rstrip("\r") == "ERR UNKNOWN_JOB"

    with register_worker(any_server, ["queued"]) as worker:
        first = worker.grab()
        assert first.type is Cmd.JOB_ASSIGN_UNIQ and first.args[0] == keep.encode()
        assert worker.grab().type is Cmd.NO_JOB


def test_admin_maxqueue(any_server: ServerProcess) -> None:
    """`maxqueue F 2` through pygearman, then a third job for F is refused.

    gearmand answers "OK\\r\\n". pygearman reads admin replies line by line splitting on "\\n"
    only and insists on exactly "OK", so against gearmand send_maxqueue raises ProtocolError
    although the server applied the limit. jobwire deliberately answers in a form pygearman
    accepts: here we follow the real client rather than gearmand's exact bytes, because the
    point of the reply is that clients can tell the command worked, and gearmand's bytes make
    that impossible for the most common Python client.
    """
    with GearmanSocket(any_server) as raw:
        raw.submit_bg("limited", "1")  # gearmand ignores maxqueue for a function it doesn't know

    admin = gearman.GearmanAdminClient([any_server.address], poll_timeout=DEADLINE)
    if any_server.name == "gearmand":
        with pytest.raises(ProtocolError, match="Expected 'OK'"):
            admin.send_maxqueue("limited", 2)
    else:
        assert admin.send_maxqueue("limited", 2) == "OK"

    client = Client([any_server.address])
    second = client.submit_job("limited", "2", background=True, poll_timeout=DEADLINE)
    assert second.state == JOB_CREATED
    with pytest.raises(ServerError) as refused:
        client.submit_job("limited", "3", background=True, poll_timeout=DEADLINE)
    assert refused.value.code == b"QUEUE_ERROR"
