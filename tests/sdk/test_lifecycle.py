"""Worker lifecycle under real signals: SIGTERM/SIGINT drain then exit 0, SIGTSTP/SIGCONT."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from jobwire import Client, JobFailed
from tests.sdk.support import (
    PATIENT,
    QUIET,
    RUNNING,
    Markers,
    WorkerProcess,
    client_thread,
    wait_status,
    wait_workers,
    worker_processes,
)
from tests.servers import ServerProcess


@pytest.fixture
def worker(any_server: ServerProcess) -> Iterator[WorkerProcess]:
    """One worker process (concurrency 2, grace period 30 s), registered."""
    with worker_processes([any_server.address], 1) as (proc,):
        wait_workers(any_server)
        yield proc


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_stop_signal_finishes_running_jobs_and_takes_no_new_ones(
    any_server: ServerProcess, worker: WorkerProcess, signum: signal.Signals
) -> None:
    markers = Markers()
    with (
        Client([any_server.address], **PATIENT) as one,
        Client([any_server.address], **PATIENT) as two,
        client_thread(one, "block", markers.spec("a")) as first,
        client_thread(two, "block_thread", markers.spec("b")) as second,
    ):
        markers.wait_started("a")
        markers.wait_started("b")
        worker.signal(signum)
        worker.wait_log(QUIET)
        one.submit_background("block", markers.spec("late"))
        wait_status(any_server, "block", 2, 1)  # "a" running, "late" queued
        markers.release("a")
        markers.release("b")
    assert first == {"result": b"released a"}
    assert second == {"result": b"released b"}
    assert worker.wait() == 0
    assert markers.starts("late") == []
    wait_status(any_server, "block", 1, 0)  # still there for the next worker


def test_running_jobs_are_failed_after_the_grace_period(any_server: ServerProcess) -> None:
    markers = Markers()
    with (
        worker_processes([any_server.address], 1, "--grace-period", "0.2") as (worker,),
        Client([any_server.address], **PATIENT) as one,
        Client([any_server.address], **PATIENT) as two,
    ):
        wait_workers(any_server)
        # Never released: one blocks the event loop's task, the other its own thread.
        with (
            client_thread(one, "block", markers.spec("a")) as first,
            client_thread(two, "block_thread", markers.spec("b")) as second,
        ):
            markers.wait_started("a")
            markers.wait_started("b")
            worker.signal(signal.SIGTERM)
        assert isinstance(first.get("error"), JobFailed)
        assert isinstance(second.get("error"), JobFailed)
        assert worker.wait() == 0  # a blocked task thread does not keep the process alive


def test_second_stop_signal_skips_the_grace_period(
    any_server: ServerProcess, worker: WorkerProcess
) -> None:
    markers = Markers()
    with (
        Client([any_server.address], **PATIENT) as client,
        client_thread(client, "block", markers.spec("a")) as outcome,
    ):
        markers.wait_started("a")
        worker.signal(signal.SIGTERM)
        worker.wait_log(QUIET)
        worker.signal(signal.SIGTERM)
    assert isinstance(outcome.get("error"), JobFailed)
    assert worker.wait() == 0


def test_sigtstp_quiets_and_sigcont_resumes(
    any_server: ServerProcess, worker: WorkerProcess
) -> None:
    markers = Markers()
    with Client([any_server.address], **PATIENT) as client:
        with client_thread(client, "block", markers.spec("held")) as held:
            markers.wait_started("held")
            worker.signal(signal.SIGTSTP)
            worker.wait_log(QUIET)
            # Quiet: new work waits, what runs goes on.
            client.submit_background("block", markers.spec("waits"))
            wait_status(any_server, "block", 2, 1)
            markers.release("held")
            wait_status(any_server, "block", 1, 0)
            # Holding nothing, it unregisters: the server no longer counts (or wakes) it.
            wait_workers(any_server, 0, "block")
        assert held == {"result": b"released held"}
        assert markers.starts("waits") == []
        worker.signal(signal.SIGCONT)
        worker.wait_log(RUNNING)
        markers.wait_started("waits")
        markers.release("waits")
        wait_status(any_server, "block", 0, 0)
        assert client.submit("echo", "running") == b"running"
    assert worker.proc.poll() is None  # SIGTSTP did not suspend the process
