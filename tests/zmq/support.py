"""Real ZeroMQ peers for the listener tests: every receive waits up to a generous deadline
(nothing depends on how fast the server is), and a missing message fails the test."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import zmq
from jobwire.protocols.zmq import mdp
from jobwire.protocols.zmq.mdp import Version
from tests.servers import ServerProcess

DEADLINE = 30.0


class Peer:
    """One socket connected to the server's Majordomo endpoint (or another endpoint)."""

    def __init__(self, context: zmq.Context[Any], kind: int, endpoint: str) -> None:
        self.sock: zmq.Socket[Any] = context.socket(kind)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    def send(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames)

    def recv(self, deadline: float = DEADLINE) -> list[bytes]:
        if not self.sock.poll(int(deadline * 1000)):
            raise AssertionError(f"nothing received within {deadline}s")
        frames: list[bytes] = self.sock.recv_multipart()
        return frames

    def recv_until(self, wanted: Callable[[list[bytes]], bool]) -> list[bytes]:
        """The first message `wanted` accepts (others, e.g. heartbeats, are skipped)."""
        end = time.monotonic() + DEADLINE
        while True:
            frames = self.recv(max(0.01, end - time.monotonic()))
            if wanted(frames):
                return frames

    def quiet_for(self, seconds: float) -> bool:
        """True if nothing arrives within `seconds` (only for 'must not answer' checks, whose
        failure mode is a message arriving, never a slow server)."""
        return not self.sock.poll(int(seconds * 1000))

    def close(self) -> None:
        self.sock.close(linger=0)


class Zmq:
    """Sockets for one test against one server; all closed at the end."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.context: zmq.Context[Any] = zmq.Context()
        self.peers: list[Peer] = []

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.server.extra['zmq_port']}"

    def peer(self, kind: int, endpoint: str | None = None) -> Peer:
        peer = Peer(self.context, kind, endpoint or self.endpoint)
        self.peers.append(peer)
        return peer

    def worker(self, service: bytes, version: Version = Version.V1) -> Peer:
        peer = self.peer(zmq.DEALER)
        peer.send(mdp.ready(version, service))
        return peer

    def close(self) -> None:
        for peer in self.peers:
            peer.close()
        self.context.term()


def is_request(frames: list[bytes]) -> bool:
    try:
        return isinstance(mdp.decode_for_worker(frames), mdp.WorkerRequest)
    except mdp.MdpError:
        return False


def take_request(worker: Peer) -> mdp.WorkerRequest:
    """The next REQUEST the worker gets (heartbeats skipped)."""
    message = mdp.decode_for_worker(worker.recv_until(is_request))
    assert isinstance(message, mdp.WorkerRequest)
    return message


def call(
    peer: Peer, service: bytes, body: list[bytes], version: Version = Version.V1
) -> list[bytes]:
    """A DEALER client's request and its final reply's body."""
    peer.send(mdp.request(version, service, body))
    while True:
        reply = mdp.decode_reply(peer.recv())
        if reply.final:
            return list(reply.body)


def take_request_beating(worker: Peer, version: Version) -> mdp.WorkerRequest:
    """The next REQUEST, while the worker sends HEARTBEAT every 20 ms meanwhile (so only
    a worker that stops beating expires, however long the wait)."""
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        if worker.sock.poll(20):
            message = mdp.decode_for_worker(worker.sock.recv_multipart())
            if isinstance(message, mdp.WorkerRequest):
                return message
        worker.send(mdp.heartbeat(version))
    raise AssertionError(f"no request within {DEADLINE}s")


@contextmanager
def zmq_peers(server: ServerProcess) -> Iterator[Zmq]:
    peers = Zmq(server)
    try:
        yield peers
    finally:
        peers.close()


def wait_until(condition: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError(f"not within {DEADLINE}s: {what}")
