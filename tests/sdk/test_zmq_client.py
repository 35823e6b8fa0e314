"""`MdpClient` and `AsyncMdpClient` through real sockets against a real jobwire process:
both versions each way, PARTIALs, error replies, Lazy Pirate retries, MMI, many requests
in flight on the async client."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

import zmq
from jobwire.protocols.zmq import mdp
from jobwire.protocols.zmq.mdp import Version
from jobwire.sdk.zmq import (
    ERROR_MARK,
    AsyncMdpClient,
    BadReply,
    MdpClient,
    ServerUnavailable,
    ServiceError,
)
from jobwire.server.zmq import majordomo
from tests.interop.gearman_raw import status, wait_until
from tests.sdk.support import Markers, worker_thread
from tests.sdk.zmq_support import (
    PATIENT,
    endpoint,
    fake_broker,
    fresh_worker,
    serving,
    wait_served,
)
from tests.servers import ServerProcess, start_jobwire

V1, V2 = Version.V1, Version.V2


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """jobwire with ZeroMQ and HTTP, shared by the module (each test has its own services);
    an unserved request gets its 404 after 0.3 s."""
    proc = start_jobwire(
        ["--mdp-heartbeat", "1", "--mdp-request-timeout", "0.3"], http=True, zmq=True
    )
    yield proc
    assert proc.stop() == 0, proc.log()


@pytest.fixture(scope="module")
def workers(server: ServerProcess) -> Iterator[dict[Version, str]]:
    """An MDP worker of each version with every fixture task, as services `v1.NAME` and
    `v2.NAME` (one request at a time per socket, two sockets per task)."""
    made = {}
    for version in (V1, V2):
        worker = fresh_worker(server, version=version, concurrency=2)
        worker.tasks = {f"v{version.value}.{name}": task for name, task in worker.tasks.items()}
        made[version] = worker
    with serving(made[V1]), serving(made[V2]):
        for version in (V1, V2):
            wait_served(server, f"v{version.value}.block")
        yield {version: f"v{version.value}." for version in (V1, V2)}


def client(server: ServerProcess, version: Version = V1, **options: Any) -> MdpClient:
    settings = dict(PATIENT)
    settings.update(options)
    return MdpClient(endpoint(server), version=version, **settings)


def test_the_error_mark_is_the_brokers() -> None:
    assert ERROR_MARK == majordomo.ERROR_MARK


@pytest.mark.parametrize("client_version", [V1, V2])
@pytest.mark.parametrize("worker_version", [V1, V2])
def test_round_trip_each_version_with_each(
    server: ServerProcess,
    workers: dict[Version, str],
    client_version: Version,
    worker_version: Version,
) -> None:
    prefix = workers[worker_version]
    with client(server, client_version) as c:
        assert c.request(prefix + "echo", b"a", b"", b"\x00\xff") == [b"a", b"", b"\x00\xff"]
        assert c.request(prefix + "upper", "text") == [b"TEXT"]
        assert json.loads(c.request(prefix + "json", {"k": [1]})[0]) == {"got": {"k": [1]}}
        assert c.request(prefix + "echo") == [b""]  # MDP needs a body: one empty frame
        assert c.sockets_opened == 1  # one socket, reused while it works


def test_partials_reach_a_v2_client_in_order(
    server: ServerProcess, workers: dict[Version, str]
) -> None:
    for prefix in (workers[V2] + "stream", workers[V2] + "thread_stream"):
        parts: list[list[bytes]] = []
        with client(server, V2) as c:
            assert c.request(prefix, b"", on_partial=parts.append) == [b"done"]
        if prefix.endswith(".stream"):
            assert parts == [[b"one"], [b"two"], [b'{"n":3}']]
        else:
            assert parts == [[b"from a thread"]]
    with client(server, V1) as c:  # 0.1 has no partials: the FINAL only
        assert c.request(workers[V2] + "stream", b"") == [b"done"]
    with client(server, V2) as c:  # a 0.1 worker cannot send partials: dropped
        parts = []
        assert c.request(workers[V1] + "stream", b"", on_partial=parts.append) == [b"done"]
        assert parts == []


@pytest.mark.parametrize("version", [V1, V2])
def test_error_replies_raise_service_error(
    server: ServerProcess, workers: dict[Version, str], version: Version
) -> None:
    prefix = workers[version]
    with client(server, version) as c:
        with pytest.raises(ServiceError) as raised:
            c.request(prefix + "raise", "oops")
        assert (raised.value.status, raised.value.text) == (500, "ValueError: bad input: oops")
        assert raised.value.service == prefix + "raise"
        with pytest.raises(ServiceError) as raised:
            c.request(prefix + "fail", "x")
        assert (raised.value.status, raised.value.text) == (500, "refused")
        with pytest.raises(ServiceError) as raised:
            c.request(prefix + "stuck", "x")
        assert (raised.value.status, raised.value.text) == (500, "timed out after 0.3s")
        # Nobody serves it: the broker's 404 after --mdp-request-timeout.
        with pytest.raises(ServiceError) as raised:
            c.request(f"nobody-{version.value}", "x")
        assert raised.value.status == 404
        assert c.request(prefix + "upper", "still fine") == [b"STILL FINE"]


def test_a_failed_gearman_job_is_a_500_for_the_mdp_client(server: ServerProcess) -> None:
    """The broker's own error reply: a Gearman worker's task raised."""
    with worker_thread([server.address]):
        wait_served(server, "raise")
        with client(server) as c, pytest.raises(ServiceError) as raised:
            c.request("raise", b"gearman")
    assert raised.value.status == 500 and "bad input: gearman" in raised.value.text


def test_a_cancelled_job_is_a_410(server: ServerProcess) -> None:
    with MdpClient(endpoint(server), timeout=None) as c, zmq.Context() as context:
        worker = context.socket(zmq.DEALER)
        worker.setsockopt(zmq.LINGER, 0)
        worker.connect(endpoint(server))
        worker.send_multipart(mdp.ready(V1, b"cancel-me"))
        wait_served(server, "cancel-me")
        outcome: dict[str, BaseException] = {}

        def call() -> None:
            try:
                c.request("cancel-me", b"x")
            except BaseException as exc:
                outcome["error"] = exc

        thread = threading.Thread(target=call, daemon=True)
        thread.start()
        assert worker.poll(30_000)
        request = mdp.decode_for_worker(worker.recv_multipart())
        assert isinstance(request, mdp.WorkerRequest)
        job_id = request.client.decode()
        cancel = urllib.request.Request(
            f"http://127.0.0.1:{server.http_port}/ojs/v1/jobs/{job_id}", method="DELETE"
        )
        with urllib.request.urlopen(cancel, timeout=30) as answer:
            assert answer.status == 200
        thread.join(30)
        worker.close(linger=0)
    error = outcome["error"]
    assert isinstance(error, ServiceError) and error.status == 410


def test_lazy_pirate_gives_up_after_its_attempts(server: ServerProcess) -> None:
    """A worker that never answers: three attempts, each on a new socket, each a request the
    server saw (the first runs on the silent worker, the others wait behind it)."""
    with zmq.Context() as context:
        silent = context.socket(zmq.DEALER)
        silent.setsockopt(zmq.LINGER, 0)
        silent.connect(endpoint(server))
        silent.send_multipart(mdp.ready(V1, b"silent"))
        wait_served(server, "silent")
        c = MdpClient(endpoint(server), timeout=0.3, retries=3)
        with pytest.raises(ServerUnavailable, match="no reply in 3 attempt"):
            c.request("silent", b"anyone?")
        c.close()
        assert c.sockets_opened == 3
        # total 3, running 1, workers 1
        wait_until(lambda: status(server).get("silent") == (3, 1, 1), "three requests")
        assert silent.poll(30_000)
        request = mdp.decode_for_worker(silent.recv_multipart())
        assert isinstance(request, mdp.WorkerRequest) and request.body == (b"anyone?",)
        silent.close(linger=0)


@pytest.mark.parametrize("version", [V1, V2])
def test_lazy_pirate_resends_the_same_request_on_a_new_socket(version: Version) -> None:
    """A broker that loses the first request and answers the rest: the client gets its
    reply from a resend, sent on a new socket (a new identity) with the same frames."""
    with fake_broker() as broker:
        seen: list[tuple[bytes, list[bytes]]] = []

        def serve() -> None:
            while True:
                try:
                    identity, frames = broker.recv()
                except (AssertionError, zmq.ZMQError):
                    return
                seen.append((identity, frames))
                if len(seen) > 1:
                    request = mdp.decode(frames)
                    assert isinstance(request, mdp.Request)
                    broker.send(identity, mdp.reply(version, request.service, [b"at last"]))
                    return

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        # The first attempt must time out (nobody answers it): 1 s, then up to 4 resends.
        with MdpClient(broker.endpoint, version=version, timeout=1.0, retries=5) as c:
            assert c.request("svc", b"same", b"frames") == [b"at last"]
        thread.join(30)
    assert len(seen) >= 2
    assert len({identity for identity, _ in seen}) == len(seen)  # a new socket each time
    assert all(frames == seen[0][1] for _, frames in seen)
    assert mdp.decode(seen[0][1]) == mdp.Request(version, b"svc", (b"same", b"frames"))


def test_a_reply_for_another_service_is_a_bad_reply() -> None:
    with fake_broker() as broker, MdpClient(broker.endpoint, **PATIENT) as c:
        thread = threading.Thread(
            target=lambda: broker.send(broker.recv()[0], mdp.reply(V1, b"other", [b"x"])),
            daemon=True,
        )
        thread.start()
        with pytest.raises(BadReply):
            c.request("svc", b"x")
        thread.join(30)


def test_mmi_helpers(server: ServerProcess, workers: dict[Version, str]) -> None:
    with client(server) as c:
        assert c.mmi_service(workers[V1] + "echo") is True
        assert c.mmi_service("nobody-serves-this") is False
        assert {workers[V1] + "echo", workers[V2] + "echo"} <= set(c.services())
        assert c.request("mmi.other", b"x") == [b"501"]


# ---------------------------------------------------------------- AsyncMdpClient


def test_async_client_keeps_many_requests_in_flight(
    server: ServerProcess, workers: dict[Version, str]
) -> None:
    """Four requests run at once (both workers' sockets hold one each), each reply reaches
    its own request; then many more through a pool of 8 sockets."""
    markers = Markers()

    async def main() -> None:
        async with AsyncMdpClient(
            endpoint(server), concurrency=8, timeout=PATIENT["timeout"], retries=1
        ) as c:
            blocked = [
                asyncio.ensure_future(
                    c.request(workers[version] + "block", markers.spec(f"async-{version}-{n}"))
                )
                for version in (V1, V2)
                for n in range(2)
            ]
            loop = asyncio.get_running_loop()
            for version in (V1, V2):
                for n in range(2):
                    await loop.run_in_executor(None, markers.wait_started, f"async-{version}-{n}")
            for version in (V1, V2):
                for n in range(2):
                    markers.release(f"async-{version}-{n}")
            results = await asyncio.gather(*blocked)
            assert results == [
                [f"released async-{version}-{n}".encode()] for version in (V1, V2) for n in range(2)
            ]
            many = await asyncio.gather(
                *(c.request(workers[V1 if n % 2 else V2] + "upper", f"r{n}") for n in range(60))
            )
            assert many == [[f"R{n}".encode()] for n in range(60)]
            assert c.sockets_opened <= 8

    asyncio.run(main())


def test_async_stream_partials_then_final_and_errors(
    server: ServerProcess, workers: dict[Version, str]
) -> None:
    async def main() -> None:
        async with AsyncMdpClient(endpoint(server), timeout=PATIENT["timeout"]) as c:
            replies = [r async for r in c.stream(workers[V2] + "stream", b"")]
            assert [(r.body, r.final) for r in replies] == [
                ((b"one",), False),
                ((b"two",), False),
                ((b'{"n":3}',), False),
                ((b"done",), True),
            ]
            parts: list[list[bytes]] = []
            done = await c.request(workers[V2] + "stream", b"", on_partial=parts.append)
            assert done == [b"done"] and len(parts) == 3
            with pytest.raises(ServiceError) as raised:
                await c.request(workers[V1] + "raise", "async")
            assert raised.value.status == 500
            assert await c.mmi_service(workers[V1] + "upper") is True
            # The sockets of finished requests, errors included, were reused.
            assert c.sockets_opened == 1

        async with AsyncMdpClient(endpoint(server), version=V1, timeout=PATIENT["timeout"]) as c:
            assert await c.request(workers[V2] + "echo", b"x", b"y") == [b"x", b"y"]

    asyncio.run(main())


def test_async_client_gives_up_after_its_attempts(server: ServerProcess) -> None:
    with zmq.Context() as context:
        silent = context.socket(zmq.DEALER)
        silent.setsockopt(zmq.LINGER, 0)
        silent.connect(endpoint(server))
        silent.send_multipart(mdp.ready(V2, b"async-silent"))
        wait_served(server, "async-silent")

        async def main() -> None:
            async with AsyncMdpClient(endpoint(server), timeout=0.3, retries=2) as c:
                with pytest.raises(ServerUnavailable, match="no reply in 2 attempt"):
                    await c.request("async-silent", b"x")
                assert c.sockets_opened == 2

        asyncio.run(main())
        wait_until(lambda: status(server).get("async-silent") == (2, 1, 1), "two requests")
        silent.close(linger=0)
