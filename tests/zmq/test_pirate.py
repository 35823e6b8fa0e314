"""The Paranoid Pirate queue on its own endpoints: Lazy Pirate clients, PPP workers,
heartbeats and expiry, and requests served by a worker of another protocol."""

from __future__ import annotations

import time

import zmq
from jobwire.protocols.zmq import ppp
from tests.interop.gearman_raw import Cmd, GearmanSocket, status
from tests.servers import ServerProcess, free_port, start_jobwire
from tests.zmq.support import DEADLINE, Peer, wait_until, zmq_peers


def start_pirate(*args: str) -> tuple[ServerProcess, str, str]:
    front, back = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    server = start_jobwire(
        ["--ppp-frontend", front, "--ppp-backend", back, "--ppp-function", "pp", *args]
    )
    return server, front, back


def take(worker: Peer, *, beat: bool = False) -> list[bytes]:
    """The next request a PPP worker gets (queue heartbeats skipped); with `beat`, the worker
    sends its own heartbeat every 20 ms meanwhile."""
    while True:
        if beat and not worker.sock.poll(20):
            worker.send([ppp.HEARTBEAT])
            continue
        frames = worker.recv()
        if frames != [ppp.HEARTBEAT]:
            return frames


def test_a_lazy_pirate_client_and_a_ppp_worker() -> None:
    server, front, back = start_pirate()
    try:
        with zmq_peers(server) as peers:
            worker = peers.peer(zmq.DEALER, back)
            worker.send([ppp.READY])
            client = peers.peer(zmq.REQ, front)
            client.send([b"1"])
            request = take(worker)
            assert len(request) == 3 and request[1:] == [b"", b"1"]  # as ppworker expects
            worker.send(request)  # ppworker echoes the request back
            assert client.recv() == [b"1"]
    finally:
        assert server.stop() == 0, server.log()


def test_queue_heartbeats_and_a_silent_worker_expires_with_its_request_requeued() -> None:
    server, front, back = start_pirate("--mdp-liveness", "3")
    try:
        with zmq_peers(server) as peers:
            stuck = peers.peer(zmq.DEALER, back)
            stuck.send([ppp.READY])
            client = peers.peer(zmq.DEALER, front)
            client.send([b"", b"job"])
            take(stuck, beat=True)  # and then it says nothing more
            healthy = peers.peer(zmq.DEALER, back)
            healthy.send([ppp.READY])
            request = take(healthy, beat=True)  # once the stuck one expired (3 s)
            healthy.send([*request[:2], b"done"])
            assert client.recv() == [b"", b"done"]
    finally:
        assert server.stop() == 0, server.log()


def test_a_pirate_request_runs_on_a_gearman_worker() -> None:
    server, front, _back = start_pirate()
    try:
        with zmq_peers(server) as peers:
            client = peers.peer(zmq.REQ, front)
            client.send([b"abc"])
            wait_until(lambda: status(server).get("pp", (0, 0, 0))[0] == 1, "queued")
            with GearmanSocket(server) as worker:
                worker.send(Cmd.CAN_DO, "pp")
                worker.send(Cmd.GRAB_JOB)
                handle, _function, payload = worker.expect(Cmd.JOB_ASSIGN).args
                worker.send(Cmd.WORK_COMPLETE, handle, payload.upper())
            assert client.recv() == [b"ABC"]
    finally:
        assert server.stop() == 0, server.log()


def test_invalid_pirate_messages_are_dropped() -> None:
    server, front, back = start_pirate()
    try:
        with zmq_peers(server) as peers:
            bad_worker = peers.peer(zmq.DEALER, back)
            bad_worker.send([b"\x07"])  # not READY or HEARTBEAT
            bad_worker.send([b"no-empty-frame", b"x"])
            bad_client = peers.peer(zmq.DEALER, front)
            bad_client.send([b"no-empty-frame"])
            assert bad_client.quiet_for(0.3)
            worker = peers.peer(zmq.DEALER, back)
            worker.send([ppp.READY])
            client = peers.peer(zmq.REQ, front)
            client.send([b"ok"])
            worker.send(take(worker))
            assert client.recv(DEADLINE) == [b"ok"]
    finally:
        assert server.stop() == 0, server.log()


def test_idle_workers_get_the_queues_heartbeats() -> None:
    server, _front, back = start_pirate()
    try:
        with zmq_peers(server) as peers:
            worker = peers.peer(zmq.DEALER, back)
            worker.send([ppp.READY])
            end = time.monotonic() + DEADLINE
            while time.monotonic() < end:
                if worker.sock.poll(20):
                    assert worker.recv() == [ppp.HEARTBEAT]
                    return
                worker.send([ppp.HEARTBEAT])
            raise AssertionError("no heartbeat from the queue")
    finally:
        assert server.stop() == 0, server.log()
