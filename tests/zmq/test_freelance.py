"""The Freelance server (RFC 10): PING/PONG, requests run as jobs, both client envelopes."""

from __future__ import annotations

import time

import zmq
from jobwire.protocols.zmq import freelance, mdp
from jobwire.protocols.zmq.mdp import Version
from tests.servers import ServerProcess, free_port, start_jobwire
from tests.zmq.support import DEADLINE, Peer, take_request, zmq_peers


def start_freelance() -> tuple[ServerProcess, str]:
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    server = start_jobwire(["--freelance-port", str(port), "--mdp-heartbeat", "10"], zmq=True)
    return server, endpoint


def router_client(peer: Peer, endpoint: str) -> None:
    """Ping the server by its identity until it answers: ROUTER to ROUTER drops messages
    sent before the connection is up, so this is how a client learns that it is."""
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        peer.send([endpoint.encode(), freelance.PING])
        if peer.sock.poll(50):
            assert peer.recv() == [endpoint.encode(), freelance.PONG]
            return
    raise AssertionError("no PONG")


def test_ping_and_a_request_served_by_an_mdp_worker() -> None:
    server, endpoint = start_freelance()
    try:
        with zmq_peers(server) as peers:
            client = peers.peer(zmq.ROUTER, endpoint)
            router_client(client, endpoint)
            worker = peers.worker(b"echo")
            client.send([endpoint.encode(), b"seq-1", b"echo", b"hello"])
            request = take_request(worker)
            worker.send(mdp.worker_reply(Version.V1, request.client, [b"HELLO"]))
            assert client.recv() == [endpoint.encode(), b"seq-1", b"HELLO"]
    finally:
        assert server.stop() == 0, server.log()


def test_a_shotgun_client_with_a_dealer_gets_its_envelope_back() -> None:
    server, endpoint = start_freelance()
    try:
        with zmq_peers(server) as peers:
            client = peers.peer(zmq.DEALER, endpoint)
            client.send([b"", freelance.PING])
            assert client.recv() == [b"", freelance.PONG]
            worker = peers.worker(b"echo")
            client.send([b"", b"7", b"echo", b"x"])
            request = take_request(worker)
            worker.send(mdp.worker_reply(Version.V1, request.client, [b"OK"]))
            assert client.recv() == [b"", b"7", b"OK"]
    finally:
        assert server.stop() == 0, server.log()


def test_invalid_freelance_messages_are_dropped() -> None:
    server, endpoint = start_freelance()
    try:
        with zmq_peers(server) as peers:
            client = peers.peer(zmq.DEALER, endpoint)
            client.send([b"only-a-control-frame"])
            client.send([b"ctl", b"", b"empty service"])
            assert client.quiet_for(0.3)
            client.send([freelance.PING])
            assert client.recv() == [freelance.PONG]
    finally:
        assert server.stop() == 0, server.log()
