"""CAN_DO_TIMEOUT as gearmand 1.1.20 has it (libgearman-server/connection.cc), through the
wire, against jobwire and gearmand alike.

gearmand reads the timeout in milliseconds and raises anything under 1000 to 1000: a worker
that asks for 5 ms (libgearman's tests do) holds its job at least a second. A job held past
its timeout is requeued with the attempt counted; the timed-out worker's late result gets
ERROR JOB_NOT_FOUND; once `--job-retries` attempts are spent the waiting client gets
WORK_FAIL. (With the default `--job-retries 0` gearmand requeues without limit, and so does
jobwire.)

Nothing here depends on how fast anything runs: requeues are awaited by polling `status`
up to a deadline, and the one clock reading is a lower bound that a slow machine only
makes easier to meet (the GRAB is sent after `before`, so the lease starts after it, and
the requeue is seen after it happened).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.interop.gearman_raw import (
    Cmd,
    GearmanSocket,
    register_worker,
    wait_for_status,
    wait_for_workers,
)
from tests.servers import ServerProcess, start_gearmand, start_jobwire

RETRIES = 2


@pytest.fixture(params=["jobwire", "gearmand"])
def server(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    args = ["--job-retries", str(RETRIES)]
    started = start_jobwire(args) if request.param == "jobwire" else start_gearmand(args)
    yield started
    started.stop()


def test_a_timeout_under_a_second_is_a_second_and_spent_retries_fail_the_job(
    server: ServerProcess,
) -> None:
    worker = register_worker(server, [])
    worker.send(Cmd.CAN_DO_TIMEOUT, b"slow\x005")  # 5 ms: under gearmand's least, 1000
    wait_for_workers(server, "slow", 1)
    with GearmanSocket(server) as client:
        handle = client.submit_fg("slow", "work")
        for attempt in range(1, RETRIES + 1):
            before = time.monotonic()
            assigned = worker.grab()
            assert assigned.type == Cmd.JOB_ASSIGN_UNIQ, f"attempt {attempt}: {assigned}"
            assert assigned.args[0].decode() == handle
            if attempt == RETRIES:
                break
            # The lease runs out and the job waits again: queued, not running.
            wait_for_status(server, "slow", lambda row: row[:2] == (1, 0), "job requeued")
            assert time.monotonic() - before >= 1.0, "held for less than gearmand's second"
            # The worker that let the timeout pass may not report any more.
            worker.send(Cmd.WORK_COMPLETE, handle.encode() + b"\0late")
            error = worker.expect(Cmd.ERROR)
            assert error.args[0] == b"JOB_NOT_FOUND"
        # The last attempt times out too: the client is told, the job is gone.
        failed = client.expect(Cmd.WORK_FAIL)
        assert failed.args[0].decode() == handle
        wait_for_status(server, "slow", lambda row: row[:2] == (0, 0), "job dropped")
    worker.close()


def test_a_result_within_the_timeout_reaches_the_client(server: ServerProcess) -> None:
    worker = register_worker(server, [])
    worker.send(Cmd.CAN_DO_TIMEOUT, b"quick\x0060000")
    wait_for_workers(server, "quick", 1)
    with GearmanSocket(server) as client:
        handle = client.submit_fg("quick", "work")
        assert worker.grab().type == Cmd.JOB_ASSIGN_UNIQ
        worker.send(Cmd.WORK_COMPLETE, handle.encode() + b"\0done")
        done = client.expect(Cmd.WORK_COMPLETE)
        assert done.args == (handle.encode(), b"done")
    worker.close()
