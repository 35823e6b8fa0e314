"""The pipelined plain loop: `Client.submit_background` returns a Receipt at once, `flush()`,
`close()` and leaving the `with` block wait for every acknowledgement and raise for failures.

Every test drives a real server process (or the scripted fake, for a connection that drops)
through the Gearman wire protocol; waits poll up to generous deadlines.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwire import AsyncClient, Client
from jobwire.sdk import Handle, NotAcknowledged, Receipt, ServerError
from tests.interop.gearman_raw import Cmd, GearmanSocket, admin, priority_status, wait_until
from tests.sdk.support import P, fake_server
from tests.servers import ServerProcess, start_jobwire


@pytest.fixture
def sqlite_server(tmp_path: Path) -> Iterator[ServerProcess]:
    server = start_jobwire(store=f"sqlite:{tmp_path / 'jobs.db'}")
    try:
        yield server
    finally:
        server.kill()


def cap(server: ServerProcess, function: str, limit: int) -> None:
    """Queue one job of `function` (the server limits the queues of known functions only),
    then cap its queue at `limit` jobs."""
    with Client([server.address]) as client:
        client.submit_background(function, "first", wait=True)
    assert admin(server, f"maxqueue {function} {limit}").startswith("OK")


def queued(server: ServerProcess, function: str) -> int:
    high, normal, low, _ = priority_status(server).get(function, (0, 0, 0, 0))
    return high + normal + low


def test_plain_loop_returns_receipts_and_exit_waits_for_every_acknowledgement(
    sqlite_server: ServerProcess,
) -> None:
    with Client([sqlite_server.address]) as client:
        receipts = [client.submit_background("plain", f"job {i}") for i in range(300)]
        assert all(isinstance(receipt, Receipt) for receipt in receipts)
    # Leaving the block flushed: every job is acknowledged, so queued (and on disk).
    assert all(receipt.done() for receipt in receipts)
    handles = [receipt.result() for receipt in receipts]
    assert all(isinstance(handle, Handle) for handle in handles)
    assert len(set(handles)) == 300
    assert queued(sqlite_server, "plain") == 300


def test_receipt_waits_for_its_own_handle_and_status_takes_it(
    sqlite_server: ServerProcess,
) -> None:
    with Client([sqlite_server.address]) as client:
        receipt = client.submit_background("later", "x")
        assert receipt.server == sqlite_server.address  # waits for the acknowledgement
        assert str(receipt) == receipt.result()
        assert client.status(receipt).known
        assert client.unacknowledged == 0
        # The blocking call that waits for its own acknowledgement is still there.
        handle = client.submit_background("later", "y", wait=True)
        assert isinstance(handle, Handle) and handle.server == sqlite_server.address


def test_jobs_reach_the_queue_in_the_order_of_the_loop(sqlite_server: ServerProcess) -> None:
    with Client([sqlite_server.address]) as client:
        for i in range(200):
            client.submit_background("ordered", str(i))
        client.flush()
    payloads = []
    with GearmanSocket(sqlite_server) as worker:
        worker.send(Cmd.CAN_DO, "ordered")
        for _ in range(200):
            packet = worker.grab()
            assert packet.type == Cmd.JOB_ASSIGN_UNIQ
            payloads.append(int(packet.args[3]))
    assert payloads == list(range(200))


def test_refused_submissions_are_raised_at_flush(sqlite_server: ServerProcess) -> None:
    cap(sqlite_server, "capped", 3)
    with Client([sqlite_server.address]) as client:
        receipts = [client.submit_background("capped", str(i)) for i in range(4)]
        with pytest.raises(NotAcknowledged) as raised:
            client.flush()
        failures = raised.value.failures
        assert [receipt for receipt, _ in failures] == receipts[2:]
        assert all(isinstance(error, ServerError) for _, error in failures)
        assert isinstance(raised.value.__cause__, ServerError)
        assert all(isinstance(receipt.result(), Handle) for receipt in receipts[:2])
        with pytest.raises(ServerError, match="QUEUE_ERROR"):
            receipts[3].result()
        client.flush()  # reported once: nothing new has failed
        assert isinstance(client.submit_background("uncapped", "x").result(), Handle)
    assert queued(sqlite_server, "capped") == 3


def test_leaving_the_block_raises_what_failed(sqlite_server: ServerProcess) -> None:
    cap(sqlite_server, "capped2", 2)
    with pytest.raises(NotAcknowledged) as raised, Client([sqlite_server.address]) as client:
        for i in range(3):
            client.submit_background("capped2", str(i))
    assert len(raised.value.failures) == 2
    assert queued(sqlite_server, "capped2") == 2


def test_leaving_the_block_on_an_exception_keeps_that_exception(
    sqlite_server: ServerProcess,
) -> None:
    cap(sqlite_server, "capped3", 2)
    with pytest.raises(KeyError), Client([sqlite_server.address]) as client:
        for i in range(3):
            client.submit_background("capped3", str(i))
        raise KeyError("the caller's own error")
    assert queued(sqlite_server, "capped3") == 2


def test_outstanding_submissions_on_a_dropped_connection_are_resent(
    sqlite_server: ServerProcess,
) -> None:
    """The fake server reads the submissions and never answers; its connection then drops
    with all of them unacknowledged: flush retries them on the next server."""
    with fake_server() as silent:
        silent.answering = False
        with Client([silent.address, sqlite_server.address], timeout=60, retries=3) as client:
            receipts = [client.submit_background("moved", str(i)) for i in range(40)]

            def submissions() -> bool:
                return silent.types(0).count(P.SUBMIT_JOB_BG) == 20

            wait_until(submissions, "the fake server to read its 20 submissions")
            assert client.unacknowledged >= 20
            silent.sockets[0].shutdown(socket.SHUT_RDWR)
            client.flush()
        assert {receipt.server for receipt in receipts} == {sqlite_server.address}
    assert queued(sqlite_server, "moved") == 40


def test_kill_9_after_flush_loses_nothing(tmp_path: Path) -> None:
    db = tmp_path / "jobs.db"
    server = start_jobwire(store=f"sqlite:{db}")
    try:
        with Client([server.address]) as client:
            for i in range(1000):
                client.submit_background("kept", str(i))
            client.flush()
            server.kill()  # SIGKILL right after the flush returned
        server = start_jobwire(store=f"sqlite:{db}")
        assert queued(server, "kept") == 1000
    finally:
        server.kill()


def test_async_client_nowait_and_flush(sqlite_server: ServerProcess) -> None:
    async def main() -> None:
        async with AsyncClient([sqlite_server.address]) as client:
            receipts = [client.submit_background_nowait("async-plain", str(i)) for i in range(50)]
            with pytest.raises(RuntimeError, match="not acknowledged yet"):
                receipts[0].result()
            handle = await receipts[0]
            assert isinstance(handle, Handle)
            await client.flush()
            assert all(receipt.done() for receipt in receipts)
            assert client.unacknowledged == 0

    asyncio.run(main())
    assert queued(sqlite_server, "async-plain") == 50


def test_the_window_bounds_what_is_outstanding(sqlite_server: ServerProcess) -> None:
    with Client([sqlite_server.address], max_unacked=8) as client:
        for i in range(100):
            client.submit_background("windowed", str(i))
            assert client.unacknowledged < 8
    assert queued(sqlite_server, "windowed") == 100
