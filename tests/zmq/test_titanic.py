"""Titanic inside the broker, on the SQLite store, across SIGKILL restarts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import zmq
from jobwire.protocols.zmq import mdp
from jobwire.protocols.zmq.mdp import Version
from tests.servers import ServerProcess, free_port, start_jobwire
from tests.zmq.support import Zmq, call, take_request, wait_until, zmq_peers

V1, V2 = Version.V1, Version.V2


@pytest.fixture
def servers() -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    yield started
    for server in started:
        server.kill()


def start(servers: list[ServerProcess], db: Path, port: int, zmq_port: int) -> ServerProcess:
    server = start_jobwire(
        ["--zmq-port", str(zmq_port), "--mdp-heartbeat", "10"], port=port, store=f"sqlite:{db}"
    )
    server.extra["zmq_port"] = zmq_port
    servers.append(server)
    return server


def test_request_reply_close_and_the_status_codes(
    tmp_path: Path, servers: list[ServerProcess]
) -> None:
    server = start(servers, tmp_path / "t.db", free_port(), free_port())
    with zmq_peers(server) as peers:
        client = peers.peer(zmq.DEALER)
        status, uuid = call(client, b"titanic.request", [b"echo", b"hi"], V2)
        assert status == b"200" and len(uuid) == 32 and int(uuid, 16) >= 0
        assert call(client, b"titanic.reply", [uuid]) == [b"300"]  # pending: no worker yet
        assert call(client, b"titanic.reply", [b"0" * 32]) == [b"400"]  # unknown
        assert call(client, b"titanic.reply", [b"not-a-uuid"]) == [b"400"]
        worker = peers.worker(b"echo")
        request = take_request(worker)
        assert request.body == (b"hi",)
        worker.send(mdp.worker_reply(V1, request.client, [b"HI", b"there"]))
        wait_until(lambda: call(client, b"titanic.reply", [uuid]) != [b"300"], "answered")
        assert call(client, b"titanic.reply", [uuid]) == [b"200", b"HI", b"there"]
        assert call(client, b"titanic.reply", [uuid]) == [b"200", b"HI", b"there"]  # idempotent
        assert call(client, b"titanic.close", [uuid]) == [b"200"]
        assert call(client, b"titanic.reply", [uuid]) == [b"400"]
        assert call(client, b"titanic.close", [b"f" * 32]) == [b"200"]  # unknown: 200 too
        assert call(client, b"titanic.request", [b"only-a-service"])[0] == b"500"


def test_an_accepted_request_and_a_stored_reply_survive_kill_9(
    tmp_path: Path, servers: list[ServerProcess]
) -> None:
    """200 on titanic.request means durable: killed right after it, the request still runs
    after the restart; and a reply answered once survives another kill -9."""
    db, port, zmq_port = tmp_path / "t.db", free_port(), free_port()
    server = start(servers, db, port, zmq_port)
    with zmq_peers(server) as peers:
        status, uuid = call(peers.peer(zmq.DEALER), b"titanic.request", [b"later", b"data"], V2)
        assert status == b"200"
    server.kill()

    server = start(servers, db, port, zmq_port)
    with zmq_peers(server) as peers:
        client = peers.peer(zmq.DEALER)
        assert call(client, b"titanic.reply", [uuid]) == [b"300"]
        worker = peers.worker(b"later")
        request = take_request(worker)
        assert request.body == (b"data",)
        worker.send(mdp.worker_reply(V1, request.client, [b"result"]))
        wait_until(lambda: call(client, b"titanic.reply", [uuid]) == [b"200", b"result"], "reply")
    server.kill()  # between the worker's reply and the next titanic.reply

    server = start(servers, db, port, zmq_port)
    with zmq_peers(server) as peers:
        client = peers.peer(zmq.DEALER)
        assert call(client, b"titanic.reply", [uuid]) == [b"200", b"result"]
        assert call(client, b"titanic.close", [uuid]) == [b"200"]
    server.stop()
    server = start(servers, db, port, zmq_port)
    with zmq_peers(server) as peers:
        assert call(peers.peer(zmq.DEALER), b"titanic.reply", [uuid]) == [b"400"]


def test_a_titanic_request_runs_on_a_gearman_worker(
    tmp_path: Path, servers: list[ServerProcess]
) -> None:
    from tests.interop.gearman_raw import Cmd, GearmanSocket

    server = start(servers, tmp_path / "t.db", free_port(), free_port())
    with zmq_peers(server) as peers, GearmanSocket(server) as worker:
        client: Zmq = peers
        status, uuid = call(client.peer(zmq.DEALER), b"titanic.request", [b"rev", b"abc"], V2)
        assert status == b"200"
        worker.send(Cmd.CAN_DO, "rev")
        worker.send(Cmd.GRAB_JOB)
        handle, _function, payload = worker.expect(Cmd.JOB_ASSIGN).args
        assert payload == b"abc"
        worker.send(Cmd.WORK_COMPLETE, handle, payload[::-1])
        answer = client.peer(zmq.DEALER)
        wait_until(lambda: call(answer, b"titanic.reply", [uuid]) == [b"200", b"cba"], "reply")
