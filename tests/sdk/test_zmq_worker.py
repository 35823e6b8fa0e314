"""`MdpWorker` through real sockets: reconnect after a server restart, DISCONNECT, heartbeats
while a long task runs, stop and quiet, and serving clients of other protocols."""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator

import pytest

from jobwire import Client
from jobwire.protocols.zmq import mdp
from jobwire.protocols.zmq.mdp import Version
from jobwire.sdk.zmq import MdpClient, ServiceError
from tests.interop.gearman_raw import status, wait_until
from tests.sdk.support import Markers
from tests.sdk.zmq_support import (
    PATIENT,
    endpoint,
    fake_broker,
    fresh_worker,
    serving,
    wait_served,
)
from tests.servers import ServerProcess, free_port, start_jobwire

V1, V2 = Version.V1, Version.V2


@pytest.fixture
def servers() -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    yield started
    for server in started:
        server.kill()


def start(
    servers: list[ServerProcess], *args: str, zmq_port: int = 0, http: bool = False
) -> ServerProcess:
    """jobwire with ZeroMQ on `zmq_port` (a free one if 0); its heartbeat is the test
    workers' (1 s) unless `args` say otherwise."""
    zmq_port = zmq_port or free_port()
    if "--mdp-heartbeat" not in args:
        args = ("--mdp-heartbeat", "1", *args)
    server = start_jobwire(["--zmq-port", str(zmq_port), *args], http=http)
    server.extra["zmq_port"] = zmq_port
    servers.append(server)
    return server


@pytest.mark.parametrize("version", [V1, V2])
def test_the_worker_readies_again_after_the_server_restarts(
    servers: list[ServerProcess], version: Version
) -> None:
    """Killed and started again on the same port, the server does not know the worker: the
    worker's next heartbeat gets DISCONNECT (or its liveness runs out), and it READYs on a
    new socket and serves."""
    first = start(servers, "--mdp-heartbeat", "0.5")
    zmq_port = int(first.extra["zmq_port"])  # type: ignore[call-overload]
    worker = fresh_worker(first, "upper", version=version, heartbeat=0.5)
    with serving(worker):
        wait_served(first, "upper")
        with MdpClient(endpoint(first), version=version, **PATIENT) as client:
            assert client.request("upper", b"before") == [b"BEFORE"]
        first.kill()
        second = start(servers, "--mdp-heartbeat", "0.5", zmq_port=zmq_port)
        wait_served(second, "upper")
        with MdpClient(endpoint(second), version=version, **PATIENT) as client:
            assert client.request("upper", b"after") == [b"AFTER"]
        assert worker.reconnects >= 1


@pytest.mark.parametrize("version", [V1, V2])
def test_disconnect_makes_a_new_socket_and_a_new_ready(version: Version) -> None:
    with fake_broker() as broker:
        worker = fresh_worker(broker.endpoint, "upper", version=version)
        with serving(worker):
            first, ready = broker.recv_worker(mdp.Ready)
            assert ready == mdp.Ready(version, b"upper")
            broker.send(first, mdp.disconnect(version))
            second, ready = broker.recv_worker(mdp.Ready)
            assert second != first and ready == mdp.Ready(version, b"upper")
            broker.send(second, mdp.worker_request(version, b"client-1", [b"hi"]))
            identity, reply = broker.recv_worker(mdp.WorkerReply)
            assert identity == second
            assert reply == mdp.WorkerReply(version, b"client-1", (b"HI",), True)
            assert worker.reconnects == 1
        # stop(): the worker says goodbye.
        identity, _ = broker.recv_worker(mdp.Disconnect)
        assert identity == second


def test_a_worker_sends_heartbeats_and_reconnects_when_the_broker_is_silent() -> None:
    """A broker that never beats: after `liveness` silent intervals the idle worker gives the
    connection up and READYs on a new socket (meanwhile it beat on the old one)."""
    with fake_broker() as broker:
        worker = fresh_worker(broker.endpoint, "upper", heartbeat=0.1, liveness=3)
        with serving(worker):
            first, _ = broker.recv_worker(mdp.Ready)
            beat, _ = broker.recv_worker(mdp.Heartbeat)
            assert beat == first
            second, _ = broker.recv_worker(mdp.Ready)
            assert second != first


def test_the_busy_worker_beats_while_its_task_runs(servers: list[ServerProcess]) -> None:
    """Server heartbeat 0.2 s: a task that runs many times liveness x heartbeat keeps its
    worker, because the worker beats from its event loop while the task runs. The request
    runs once, its reply arrives, and the worker never had to reconnect."""
    server = start(servers, "--mdp-heartbeat", "0.2", "--mdp-liveness", "3")
    markers = Markers()
    worker = fresh_worker(server, "block", heartbeat=0.2, liveness=3)
    with serving(worker):
        wait_served(server, "block")
        with MdpClient(endpoint(server), **PATIENT) as client:
            outcome: dict[str, list[bytes]] = {}
            thread = threading.Thread(
                target=lambda: outcome.update(reply=client.request("block", markers.spec("long"))),
                daemon=True,
            )
            thread.start()
            markers.wait_started("long")
            beats = worker.heartbeats_sent
            # 15 beats of 0.2 s while the task runs: 3 s, five times what the server allows
            # a silent worker (liveness 3 x 0.2 s).
            wait_until(lambda: worker.heartbeats_sent >= beats + 15, "15 heartbeats")
            assert status(server)["block"] == (1, 1, 1)  # still running, on its worker
            markers.release("long")
            thread.join(30)
        assert outcome["reply"] == [b"released long"]
        assert len(markers.starts("long")) == 1
        assert worker.reconnects == 0


def test_stop_disconnects_and_quiet_resume(servers: list[ServerProcess]) -> None:
    server = start(servers)
    worker = fresh_worker(server, "upper", "echo", concurrency=2)
    with serving(worker):
        wait_served(server, "upper")
        wait_until(lambda: status(server).get("upper", (0, 0, 0))[2] == 2, "2 sockets")
        worker.quiet()
        wait_served(server, "upper", served=False)  # DISCONNECT: the broker forgot them
        worker.resume()
        wait_served(server, "upper")
        with MdpClient(endpoint(server), **PATIENT) as client:
            assert client.request("upper", b"again") == [b"AGAIN"]
    wait_served(server, "upper", served=False)
    wait_served(server, "echo", served=False)


def test_a_request_running_past_the_grace_period_goes_back_to_the_queue(
    servers: list[ServerProcess],
) -> None:
    """stop() with a task still running: the socket DISCONNECTs, and the broker gives the
    request to the next worker."""
    server = start(servers)
    markers = Markers()
    first = fresh_worker(server, "block")
    client = MdpClient(endpoint(server), **PATIENT)
    outcome: dict[str, list[bytes]] = {}
    with serving(first):
        wait_served(server, "block")
        thread = threading.Thread(
            target=lambda: outcome.update(reply=client.request("block", markers.spec("handed"))),
            daemon=True,
        )
        thread.start()
        markers.wait_started("handed")
    # Stopped (grace period 0): the request waits for another worker.
    wait_until(lambda: status(server).get("block") == (1, 0, 0), "requeued")
    markers.release("handed")
    with serving(fresh_worker(server, "block")):
        thread.join(30)
    client.close()
    assert outcome["reply"] == [b"released handed"]
    assert len(markers.starts("handed")) == 2


def test_gearman_clients_are_served_by_an_mdp_worker(servers: list[ServerProcess]) -> None:
    server = start(servers)
    with serving(fresh_worker(server, "upper", "raise", version=V2)):
        wait_served(server, "upper")
        with Client([server.address]) as gearman:
            assert gearman.submit("upper", b"cross") == b"CROSS"


def test_the_worker_serves_on_after_its_request_is_cancelled(
    servers: list[ServerProcess],
) -> None:
    """Cancelled (OJS DELETE) while its task runs: the client gets 410, the task's late
    reply is dropped by the broker, and the worker gets the next request."""
    server = start(servers, http=True)
    markers = Markers()
    with serving(fresh_worker(server, "block")), MdpClient(endpoint(server), **PATIENT) as c:
        wait_served(server, "block")
        outcome: dict[str, BaseException] = {}

        def call() -> None:
            try:
                c.request("block", markers.spec("cancelled"))
            except BaseException as exc:
                outcome["error"] = exc

        thread = threading.Thread(target=call, daemon=True)
        thread.start()
        markers.wait_started("cancelled")
        job_id = markers.starts("cancelled")[0].read_text()  # the task wrote job.handle
        url = f"http://127.0.0.1:{server.http_port}/ojs/v1/jobs/{job_id}"
        with urllib.request.urlopen(urllib.request.Request(url, method="DELETE"), timeout=30):
            pass
        thread.join(30)
        error = outcome["error"]
        assert isinstance(error, ServiceError) and error.status == 410
        markers.release("cancelled")  # its reply comes too late: dropped
        markers.release("next")
        assert c.request("block", markers.spec("next")) == [b"released next"]
