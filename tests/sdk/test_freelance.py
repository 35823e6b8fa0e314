"""The Freelance clients (RFC 10) through real sockets against real jobwire processes:
each model's round trip, errors, the shotgun's first reply, and the agent routing around a
server killed mid-stream. The service is served by SDK Gearman workers on the same servers.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from jobwire import Job, Worker
from jobwire.sdk.errors import ServerUnavailable, ServiceError
from jobwire.sdk.freelance import FailoverClient, FreelanceClient, ShotgunClient
from tests.sdk.support import serving, wait_workers, worker_thread
from tests.servers import ServerProcess, free_port, start_jobwire
from tests.zmq.support import DEADLINE, wait_until


def start_freelance() -> tuple[ServerProcess, str]:
    """A jobwire server answering Freelance on a free port; its endpoint (its identity)."""
    port = free_port()
    server = start_jobwire(["--freelance-port", str(port)], zmq=True)
    return server, f"tcp://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def trio() -> Iterator[list[str]]:
    """Three servers, one fixture worker (echo, raise, ...) on all three; their endpoints."""
    started = [start_freelance() for _ in range(3)]
    servers = [server for server, _ in started]
    try:
        with worker_thread([server.address for server in servers]):
            for server in servers:
                wait_workers(server)
            yield [endpoint for _, endpoint in started]
    finally:
        for server in servers:
            assert server.stop() == 0, server.log()


def dead_endpoint() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


# ------------------------------------------------------------------ model 1: failover


def test_failover_client_round_trip(trio: list[str]) -> None:
    with FailoverClient(trio[0]) as client:
        assert client.request("echo", b"hello") == [b"hello"]
        assert client.request("reverse", "abc") == [b"cba"]


def test_failover_client_skips_a_dead_server(trio: list[str]) -> None:
    with FailoverClient([dead_endpoint(), trio[1]], timeout=1.0) as client:
        assert client.request("echo", b"via the second") == [b"via the second"]


def test_failover_client_gives_up_after_its_retries() -> None:
    with (
        FailoverClient(dead_endpoint(), timeout=0.2, retries=3) as client,
        pytest.raises(ServerUnavailable, match="3 attempt"),
    ):
        client.request("echo", b"nobody")


def test_failover_client_raises_the_servers_error(trio: list[str]) -> None:
    with FailoverClient(trio[2]) as client, pytest.raises(ServiceError) as caught:
        client.request("raise", b"oops")
    assert caught.value.status == 500 and caught.value.service == "raise"


# ------------------------------------------------------------------ model 2: the shotgun


def test_shotgun_round_trip_on_every_server(trio: list[str]) -> None:
    with ShotgunClient(trio, timeout=DEADLINE) as client:
        for n in range(20):
            assert client.request("echo", f"shot {n}") == [f"shot {n}".encode()]
        with pytest.raises(ServiceError) as caught:
            client.request("raise", b"oops")
        assert caught.value.status == 500
        # The other servers' answers to the failed request are dropped, not taken for this.
        assert client.request("echo", b"after") == [b"after"]


def test_shotgun_times_out_without_servers() -> None:
    with (
        ShotgunClient([dead_endpoint(), dead_endpoint()], timeout=0.3) as client,
        pytest.raises(ServerUnavailable, match="2 server"),
    ):
        client.request("echo", b"x")


def test_shotgun_returns_the_first_reply_and_drops_late_ones() -> None:
    """Server A's worker answers at once; B's holds its jobs until released. The first
    request is answered by A while B still holds it; B's late answer to it is then
    dropped, not taken as the answer to the next request."""
    (a, a_endpoint), (b, b_endpoint) = start_freelance(), start_freelance()
    release, held = threading.Event(), threading.Event()
    fast = Worker([a.address], concurrency=2, grace_period=0.0, heartbeat=0.5)
    slow = Worker([b.address], concurrency=2, grace_period=0.0, heartbeat=0.5)

    @fast.task("tag")
    def fast_tag(job: Job) -> bytes:
        return b"A:" + job.payload

    @slow.task("tag")
    def slow_tag(job: Job) -> bytes:
        held.set()
        release.wait(DEADLINE)
        return b"B:" + job.payload

    try:
        with serving(fast), serving(slow), ShotgunClient([a_endpoint, b_endpoint]) as client:
            wait_workers(a, function="tag")
            wait_workers(b, function="tag")
            client.timeout = DEADLINE
            assert client.request("tag", b"one") == [b"A:one"]
            wait_until(held.is_set, "B's worker holds the first request")
            release.set()
            for n in range(5):  # B now answers too: each time the first matching reply
                assert client.request("tag", f"{n}")[0] in (f"A:{n}".encode(), f"B:{n}".encode())
    finally:
        release.set()
        for server in (a, b):
            assert server.stop() == 0, server.log()


# ------------------------------------------------------------------ model 3: the agent


def test_agent_round_trip_and_errors(trio: list[str]) -> None:
    with FreelanceClient(timeout=DEADLINE) as client:
        for endpoint in trio:
            client.connect(endpoint)
        for n in range(50):
            assert client.request("echo", b"n", str(n)) == [f"n{n}".encode()]
        with pytest.raises(ServiceError) as caught:
            client.request("raise", b"oops")
        assert caught.value.status == 500
        assert client.request("reverse", b"ok") == [b"ko"]
    with pytest.raises(RuntimeError, match="closed"):
        client.request("echo", b"")


def test_agent_without_live_servers_fails_after_its_timeout() -> None:
    with (
        FreelanceClient([dead_endpoint()], timeout=0.3) as client,
        pytest.raises(ServerUnavailable, match="no live server"),
    ):
        client.request("echo", b"x")


def test_agent_routes_around_a_server_killed_mid_stream() -> None:
    """Three servers, requests in a loop from another thread; SIGKILL the server answering
    them: every request still succeeds, and the survivors answer the rest."""
    started = [start_freelance() for _ in range(3)]
    servers = [server for server, _ in started]
    endpoints = [endpoint for _, endpoint in started]
    done: list[bytes] = []
    failures: list[BaseException] = []
    stop = threading.Event()
    with ExitStack() as stack:
        stack.callback(lambda: [server.kill() for server in servers])
        stack.enter_context(worker_thread([server.address for server in servers]))
        for server in servers:
            wait_workers(server)
        # The global timeout is generous for a busy machine; the resend after 1 s is what
        # routes a request lost with the server to the next one.
        client = stack.enter_context(FreelanceClient(endpoints, timeout=DEADLINE))

        def loop() -> None:
            n = 0
            while not stop.is_set():
                try:
                    reply = client.request("echo", f"{n}")
                    assert reply == [f"{n}".encode()], reply
                    done.append(reply[0])
                except BaseException as exc:  # reported by the test
                    failures.append(exc)
                    return
                n += 1

        thread = threading.Thread(target=loop, daemon=True)
        stack.callback(thread.join, DEADLINE)
        stack.callback(stop.set)
        thread.start()
        wait_until(lambda: len(done) >= 50 or bool(failures), "50 requests answered")
        servers[0].kill()  # the first live server: the agent's choice while it lives
        killed_at = len(done)
        wait_until(lambda: len(done) >= killed_at + 100 or bool(failures), "100 more")
        stop.set()
        thread.join(DEADLINE)
        assert not failures, failures
        assert servers[0].proc.returncode == -9
