"""Worker: many-to-many with one concurrency budget, sleeping without polling, surviving dead
workers and restarted servers (Paranoid Pirate)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from jobwire import Client, Job
from jobwire.protocols.gearman import PacketType
from jobwire.sdk.worker import server_timeout_ms
from tests.interop.gearman_raw import status, wait_until
from tests.sdk.support import (
    PATIENT,
    Markers,
    client_thread,
    fake_server,
    fresh_worker,
    serving,
    wait_status,
    wait_workers,
    worker_processes,
    worker_thread,
)
from tests.servers import ServerProcess, free_port, start_gearmand, start_jobwire

P = PacketType
STARTERS: dict[str, Callable[..., ServerProcess]] = {
    "jobwire": start_jobwire,
    "gearmand": start_gearmand,
}


def test_one_concurrency_budget_across_servers(
    jobwire: ServerProcess, gearmand: ServerProcess
) -> None:
    markers = Markers()
    with worker_thread([jobwire.address, gearmand.address], concurrency=2):
        wait_workers(jobwire)
        wait_workers(gearmand)
        with Client([jobwire.address]) as to_jobwire, Client([gearmand.address]) as to_gearmand:
            to_jobwire.submit_background("block", markers.spec("j1"))
            to_gearmand.submit_background("block", markers.spec("g1"))
            to_jobwire.submit_background("block", markers.spec("j2"))
            to_gearmand.submit_background("block", markers.spec("g2"))

            def started() -> list[str]:
                return [j for j in ("j1", "j2", "g1", "g2") if markers.starts(j)]

            first = wait_until(lambda: len(started()) >= 2 and started(), "two jobs started")
            running = status(jobwire)["block"][1] + status(gearmand)["block"][1]
            assert (len(first), running) == (2, 2)  # the budget is shared: no third job
            for job_id in first:
                markers.release(job_id)
            wait_until(lambda: len(started()) == 4, "the other two jobs started")
            for job_id in ("j1", "j2", "g1", "g2"):
                markers.release(job_id)
            wait_status(jobwire, "block", 0, 0)
            wait_status(gearmand, "block", 0, 0)


def test_sleeps_instead_of_polling_and_reconnects_when_the_server_hangs() -> None:
    with fake_server() as server, worker_thread([server.address], heartbeat=0.05):
        # Registered, grabbed once, got NO_JOB, went to sleep; then only heartbeats.
        wait_until(lambda: P.ECHO_REQ in server.types(0), "a heartbeat")
        first = server.types(0)
        ping = first.index(P.ECHO_REQ)
        assert first[0] == P.SET_CLIENT_ID
        assert first[ping - 2 : ping] == [P.GRAB_JOB_UNIQ, P.PRE_SLEEP]
        assert first.count(P.GRAB_JOB_UNIQ) == 1
        # The server stops answering: the worker gives up on it and registers anew.
        server.answering = False
        wait_until(lambda: len(server.connections) >= 2, "a new connection")
        wait_until(lambda: P.GRAB_JOB_UNIQ in server.types(1), "a grab on it")
        again = server.connections[1]
        abilities = {p.args for p in again if p.type in (P.CAN_DO, P.CAN_DO_TIMEOUT)}
        assert (b"echo",) in abilities
        assert (b"stuck_thread", str(server_timeout_ms(0.5)).encode()) in abilities
        # Only ECHO_REQ pings were sent to the silent server before the worker dropped it.
        silent = server.types(0)[len(first) :]
        assert set(silent) <= {P.ECHO_REQ}


def test_grabs_are_pipelined_once_the_server_has_work() -> None:
    """One GRAB probes a server; once it brings a job, every free slot gets a GRAB, all in one
    write; the worker sleeps when the last of them comes back NO_JOB, and holds no more jobs
    than its slots."""
    markers = Markers()
    with fake_server() as server:
        server.jobs = [(b"block", json.dumps(markers.spec(f"p{i}")).encode()) for i in range(3)]
        with worker_thread([server.address], concurrency=4):
            pids = [markers.wait_started(f"p{i}") for i in range(3)]
            wait_until(lambda: P.PRE_SLEEP in server.types(0), "the worker went to sleep")
            grabs = [read.count(P.GRAB_JOB_UNIQ) for read in server.reads[0]]
            assert [n for n in grabs if n] == [1, 3]  # the probe, then one write for 3 slots
            assert len(pids) == 3 and not markers.starts("p3")
            for i in range(3):
                markers.release(f"p{i}")
            wait_until(lambda: server.types(0).count(P.WORK_COMPLETE) == 3, "three results")
            # Asleep: finishing jobs frees slots, but only a NOOP makes the worker grab again.
            assert server.types(0).count(P.GRAB_JOB_UNIQ) == 4


def test_with_grab_waits_every_free_slot_waits_on_the_server_and_none_sleeps() -> None:
    """A server that holds GRABs (jobwire) gets one per free slot, and never a PRE_SLEEP."""
    with fake_server() as server:
        server.grab_waits = True
        with worker_thread([server.address], concurrency=3, heartbeat=0.05):
            wait_until(lambda: server.types(0).count(P.ECHO_REQ) >= 3, "three heartbeats")
            sent = server.types(0)
            assert sent[:2] == [P.SET_CLIENT_ID, P.OPTION_REQ]
            assert sent.count(P.GRAB_JOB_UNIQ) == 3
            assert P.PRE_SLEEP not in sent


def test_a_job_that_never_waits_is_answered_in_the_loop_turn_it_ran() -> None:
    """The result goes out in the turn the job's task first runs: a flush queued when the
    task started runs behind its first step. Queued by the step itself, it would run a turn
    later, so a callback the task queues for the next turn would still find the result
    unsent."""
    unsent: list[int] = []

    async def quick(job: Job) -> bytes:
        conn = job._conn
        asyncio.get_running_loop().call_soon(lambda: unsent.append(len(conn._out)))
        return b"done"

    with fake_server() as server:
        server.grab_waits = True
        server.jobs = [(b"quick", b"")]
        worker = fresh_worker([server.address])
        worker.add_task("quick", quick)
        with serving(worker):
            wait_until(lambda: P.WORK_COMPLETE in server.types(0), "the result")
            wait_until(lambda: unsent, "the next turn")
    assert unsent == [0]


def test_reconnect_backoff_doubles_up_to_the_cap(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="jobwire.sdk.worker")
    refused = f"127.0.0.1:{free_port()}"

    def delays() -> list[float]:
        found = [re.search(r"retrying in (\S+)s", r.getMessage()) for r in caplog.records]
        return [float(m.group(1)) for m in found if m]

    with worker_thread([refused], reconnect_base=0.01, reconnect_cap=0.08):
        wait_until(lambda: len(delays()) >= 6, "six reconnect attempts")
    assert delays()[:6] == [0.01, 0.02, 0.04, 0.08, 0.08, 0.08]


@pytest.mark.parametrize("kind", STARTERS)
def test_sigkilled_worker_job_runs_on_another(kind: str) -> None:
    server = STARTERS[kind]()
    markers = Markers()
    try:
        with (
            worker_processes([server.address], 2, "--concurrency", "1") as workers,
            Client([server.address], **PATIENT) as client,
        ):
            wait_workers(server, 2)
            with client_thread(client, "block", markers.spec("k")) as outcome:
                (victim,) = markers.wait_started("k")
                next(w for w in workers if w.pid == victim).kill()
                pids = markers.wait_started("k", 2)
                markers.release("k")
            assert outcome == {"result": b"released k"}
            survivor = next(w.pid for w in workers if w.pid != victim)
            assert sorted(pids) == sorted([victim, survivor])
    finally:
        server.stop()


@contextmanager
def restartable(kind: str) -> Iterator[list[ServerProcess]]:
    """A server (list[0]) that a test may replace; the current one is stopped at the end."""
    servers = [STARTERS[kind]()]
    try:
        yield servers
    finally:
        servers[0].stop()


def restart(servers: list[ServerProcess], kind: str) -> None:
    """Kill the server abruptly and start a fresh one (empty queues) on the same port."""
    port = servers[0].port
    servers[0].kill()
    servers[0] = STARTERS[kind](port=port)


@pytest.mark.parametrize("kind", STARTERS)
def test_server_restart_while_workers_idle(kind: str) -> None:
    with (
        restartable(kind) as servers,
        worker_processes([servers[0].address], 2) as _workers,
        Client([servers[0].address], **PATIENT) as client,
    ):
        wait_workers(servers[0], 2)
        assert client.submit("echo", "before") == b"before"
        restart(servers, kind)
        wait_workers(servers[0], 2)  # both reconnected and registered again
        assert client.submit_many("reverse", ["after", "restart"]) == [b"retfa", b"tratser"]


@pytest.mark.parametrize("kind", STARTERS)
def test_server_restart_while_worker_busy(kind: str) -> None:
    """The running job's result cannot be delivered; the client resubmits (at least once)."""
    markers = Markers()
    with (
        restartable(kind) as servers,
        worker_processes([servers[0].address], 1, "--concurrency", "1") as (worker,),
        Client([servers[0].address], **PATIENT) as client,
    ):
        wait_workers(servers[0])
        with client_thread(client, "block", markers.spec("busy")) as outcome:
            markers.wait_started("busy")
            restart(servers, kind)
            wait_workers(servers[0])  # the busy worker registered again
            wait_status(servers[0], "block", 1, 0)  # the client's retry, queued: no free slot
            markers.release("busy")  # the first run ends; its result has nowhere to go
            pids = markers.wait_started("busy", 2)
        assert outcome == {"result": b"released busy"}
        assert pids == [worker.pid, worker.pid]
