"""Helpers for the SDK's ZeroMQ tests: jobwire with ZeroMQ, MDP workers in threads, a
scripted broker. Every wait polls a condition up to a generous deadline; no outcome
depends on how fast anything is."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import zmq
from jobwire.protocols.zmq import mdp
from jobwire.sdk.zmq import MdpClient, MdpWorker
from tests.interop.gearman_raw import DEADLINE, wait_until
from tests.sdk import fixtures_mdp
from tests.servers import ServerProcess

#: Client settings for tests: a reply may take long on a busy machine; never resend.
PATIENT: dict[str, Any] = {"timeout": DEADLINE, "retries": 1}


def endpoint(server: ServerProcess) -> str:
    return f"tcp://127.0.0.1:{server.extra['zmq_port']}"


def fresh_worker(server: ServerProcess | str, *tasks: str, **options: Any) -> MdpWorker:
    """An MdpWorker with (some of) the fixture tasks and quick test settings."""
    settings: dict[str, Any] = {
        "heartbeat": 1.0,
        "reconnect_base": 0.05,
        "reconnect_cap": 0.2,
        "grace_period": 0.0,
    }
    settings.update(options)
    target = server if isinstance(server, str) else endpoint(server)
    worker = MdpWorker(target, **settings)
    chosen = tasks or tuple(fixtures_mdp.worker.tasks)
    worker.tasks = {name: fixtures_mdp.worker.tasks[name] for name in chosen}
    return worker


@contextmanager
def serving(worker: MdpWorker) -> Iterator[MdpWorker]:
    """`worker` serving in a background thread; stopped (grace period skipped) on exit."""
    thread = threading.Thread(target=worker.run, name="test-mdp-worker", daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        worker.stop()
        thread.join(DEADLINE)
        assert not thread.is_alive(), "worker did not stop"


def wait_served(server: ServerProcess | str, service: str, served: bool = True) -> None:
    """Wait until `mmi.service` says `service` has (or has no) worker."""
    target = server if isinstance(server, str) else endpoint(server)
    with MdpClient(target, **PATIENT) as client:
        wait_until(lambda: client.mmi_service(service) is served, f"{service} served={served}")


class FakeBroker:
    """A bound ROUTER driven by the test: it sees the workers' and clients' frames."""

    def __init__(self) -> None:
        self.context: zmq.Context[Any] = zmq.Context()
        self.sock: zmq.Socket[Any] = self.context.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind("tcp://127.0.0.1:*")
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def recv(self) -> tuple[bytes, list[bytes]]:
        if not self.sock.poll(int(DEADLINE * 1000)):
            raise AssertionError(f"the fake broker got nothing within {DEADLINE}s")
        identity, *frames = self.sock.recv_multipart()
        return identity, frames

    def recv_worker(self, kind: type) -> tuple[bytes, Any]:
        """The next worker command of `kind` (heartbeats skipped unless asked for)."""
        while True:
            identity, frames = self.recv()
            message = mdp.decode(frames)
            if isinstance(message, kind):
                return identity, message

    def send(self, identity: bytes, frames: list[bytes]) -> None:
        self.sock.send_multipart([identity, *frames])

    def close(self) -> None:
        self.sock.close(linger=0)
        self.context.term()


@contextmanager
def fake_broker() -> Iterator[FakeBroker]:
    broker = FakeBroker()
    try:
        yield broker
    finally:
        broker.close()
