"""A job taken back from a ZeroMQ worker while it runs (here: cancelled through OJS) must
not cost the worker its place: its late reply is dropped, and it gets the next request.

Before the fix the broker (and the PPP queue) dropped the late reply without asking the
engine for the worker's next job, so the worker stayed registered, alive and idle while
requests for its service waited for good."""

from __future__ import annotations

import json
import urllib.request

import zmq
from jobwire.protocols.zmq import mdp, ppp
from jobwire.protocols.zmq.mdp import Version
from tests.servers import ServerProcess, free_port, start_jobwire
from tests.zmq.support import Peer, Zmq, take_request, zmq_peers

V1 = Version.V1


def cancel(server: ServerProcess, job_id: bytes) -> None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.http_port}/ojs/v1/jobs/{job_id.decode()}", method="DELETE"
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert json.load(answer)["job"]["state"] == "cancelled"


def test_an_mdp_worker_gets_the_next_request_after_its_job_was_cancelled(peers: Zmq) -> None:
    worker = peers.worker(b"taken")
    first = peers.peer(zmq.DEALER)
    first.send(mdp.request(V1, b"taken", [b"1"]))
    request = take_request(worker)
    second = peers.peer(zmq.DEALER)
    second.send(mdp.request(V1, b"taken", [b"2"]))
    cancel(peers.server, request.client)
    assert mdp.decode_reply(first.recv()).body[1] == b"410"
    worker.send(mdp.worker_reply(V1, request.client, [b"too late"]))  # dropped
    request = take_request(worker)  # the waiting request comes to the free worker
    assert request.body == (b"2",)
    worker.send(mdp.worker_reply(V1, request.client, [b"two"]))
    assert mdp.decode_reply(second.recv()).body == (b"two",)


def take(worker: Peer) -> list[bytes]:
    while True:
        frames = worker.recv()
        if frames != [ppp.HEARTBEAT]:
            return frames


def test_a_ppp_worker_gets_the_next_request_after_its_job_was_cancelled() -> None:
    front, back = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    server = start_jobwire(
        ["--ppp-frontend", front, "--ppp-backend", back, "--ppp-function", "pp"], http=True
    )
    try:
        with zmq_peers(server) as peers:
            worker = peers.peer(zmq.DEALER, back)
            worker.send([ppp.READY])
            first = peers.peer(zmq.DEALER, front)
            first.send([b"", b"1"])
            request = take(worker)
            second = peers.peer(zmq.DEALER, front)
            second.send([b"", b"2"])
            cancel(server, request[0])
            assert first.recv()[0] == b""  # the client's error reply
            worker.send([*request[:2], b"too late"])  # dropped
            request = take(worker)
            assert request[1:] == [b"", b"2"]
            worker.send([*request[:2], b"two"])
            assert second.recv() == [b"", b"two"]
    finally:
        assert server.stop() == 0, server.log()
