"""The SDK's Client and Worker on a Binary Star pair, through real processes (the Guide's
`bstarcli` next to the Freelance clients): SIGKILL the primary while a Client submits
foreground jobs in a loop and a Worker serves them; every submit succeeds from the backup;
background jobs the primary acknowledged wait in its SQLite file and run once it is back in
service; a restarted primary comes back passive."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from jobwire import Client, Job, Worker
from tests.sdk import fixtures_tasks
from tests.sdk.support import serving, wait_workers
from tests.servers import ServerProcess, free_port, start_jobwire
from tests.zmq.support import DEADLINE, wait_until
from tests.zmq.test_bstar import BEAT, role, serves

SETTLE = 2.0  # the Guide's settle delay


@pytest.fixture
def pair_servers() -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    yield started
    for server in started:
        server.kill()


def start(
    servers: list[ServerProcess], role_: str, local: int, remote: int, like: ServerProcess | None
) -> ServerProcess:
    """A server of the pair with its own SQLite store; `like`: restart that one (same port,
    same folder and so the same store)."""
    args = ["--bstar", role_, "--bstar-heartbeat", BEAT, "--verbose", "INFO"]
    args += ["--bstar-local", f"tcp://127.0.0.1:{local}"]
    args += ["--bstar-remote", f"tcp://127.0.0.1:{remote}"]
    server = start_jobwire(
        args,
        port=like.port if like else None,
        workdir=like.workdir if like else None,
        store="sqlite:jobwire.db",
        http=True,
    )
    servers.append(server)
    return server


def pair_worker(servers: list[str], **tasks: object) -> Worker:
    """A Worker of the pair with default backoff (1 s doubling to 32 s) capped by the settle
    delay, and the fixture tasks."""
    worker = Worker(servers, concurrency=2, grace_period=0.0, heartbeat=0.5, settle_delay=SETTLE)
    worker.tasks = dict(fixtures_tasks.worker.tasks)
    return worker


def test_settle_delay_needs_a_pair() -> None:
    with pytest.raises(ValueError, match="pair"):
        Client(["127.0.0.1:1"], settle_delay=SETTLE)
    with pytest.raises(ValueError, match="settle_delay"):
        Worker(["127.0.0.1:1"], settle_delay=0)
    # The passive's refusals must not push a worker's reconnects past the settle delay.
    worker = Worker(["127.0.0.1:1", "127.0.0.1:2"], settle_delay=SETTLE)
    assert worker.reconnect_cap == SETTLE and worker.reconnect_base <= SETTLE


def test_a_pair_fails_over_under_load_and_the_primary_comes_back_passive(
    pair_servers: list[ServerProcess],
) -> None:
    one, two = free_port(), free_port()
    primary = start(pair_servers, "primary", one, two, None)
    backup = start(pair_servers, "backup", two, one, None)
    wait_until(lambda: serves(primary), "the primary serves")
    wait_until(lambda: role(backup) == "passive", "the backup is passive")
    pair = [primary.address, backup.address]

    done: list[float] = []  # when each submit returned
    failures: list[BaseException] = []
    stop = threading.Event()
    with ExitStack() as stack:
        worker = stack.enter_context(serving(pair_worker(pair)))
        wait_workers(primary)
        client = stack.enter_context(
            Client(pair, settle_delay=SETTLE, retries=30, timeout=5.0, heartbeat=0.5)
        )
        # Acknowledged background jobs that nobody serves yet: they stay in the primary's
        # store when it dies.
        handles = [client.submit_background("later", f"bg-{n}") for n in range(5)]
        assert all(handle.server == primary.address for handle in handles)

        def loop() -> None:
            n = 0
            while not stop.is_set():
                try:
                    assert client.submit("echo", f"fg-{n}") == f"fg-{n}".encode()
                except BaseException as exc:  # reported by the test
                    failures.append(exc)
                    return
                done.append(time.monotonic())
                n += 1

        thread = threading.Thread(target=loop, daemon=True)
        stack.callback(thread.join, DEADLINE)
        stack.callback(stop.set)
        thread.start()
        wait_until(lambda: len(done) >= 30 or bool(failures), "30 jobs before the kill")
        primary.kill()
        killed, before = time.monotonic(), len(done)
        wait_until(lambda: len(done) >= before + 30 or bool(failures), "30 jobs after the kill")
        stop.set()
        thread.join(DEADLINE)
        assert not failures, failures
        gaps = [b - a for a, b in itertools.pairwise(done)]
        first_after = next(t for t in done if t > killed)
        # Reported, not asserted: the settle delay (2 s) plus the backup's takeover.
        print(
            f"\nbinary star, SDK: {len(done)} foreground jobs, longest gap {max(gaps):.2f} s; "
            f"first answer from the backup {first_after - killed:.2f} s after the kill"
        )
        assert serves(backup)
        wait_workers(backup)  # the worker serves on the backup

        # The primary restarted: it hears the active backup and comes back passive.
        restarted = start(pair_servers, "primary", one, two, primary)
        wait_until(lambda: role(restarted) == "passive", "the restarted primary is passive")
        assert client.submit("echo", b"still the backup") == b"still the backup"
        worker.stop()

    # The Guide's recovery: stop the backup; the primary takes over on the next client vote
    # and runs the background jobs it had acknowledged before it was killed (SQLite: each
    # server keeps its own queue).
    assert backup.stop() == 0, backup.log()
    ran: list[bytes] = []
    later = Worker([restarted.address], grace_period=0.0, heartbeat=0.5, settle_delay=SETTLE)

    @later.task("later")
    def record(job: Job) -> bytes:
        ran.append(job.payload)
        return b""

    with serving(later):
        wait_until(lambda: len(ran) >= 5, "the primary's acknowledged jobs ran")
    assert sorted(ran) == [f"bg-{n}".encode() for n in range(5)]
