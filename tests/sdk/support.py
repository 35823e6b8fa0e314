"""Helpers for the SDK tests: workers in-process or as processes, and job markers.

Tests synchronise on events they can observe (marker files written by a starting task, the
server's admin `status`), polled up to a generous deadline; no outcome depends on timing.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from jobwire import Client, Worker
from jobwire.protocols.gearman import Decoder, Packet, PacketType, encode
from tests.interop.gearman_raw import DEADLINE, status, wait_until
from tests.sdk import fixtures_tasks
from tests.servers import ServerProcess

P = PacketType
REPO = Path(__file__).resolve().parents[2]
#: What a worker logs when it turns quiet or running again (tests wait for these lines).
QUIET = "quiet: taking no new jobs"
RUNNING = "running: taking jobs again"

#: Client settings for tests: quick backoff, and enough retries to outlast a server restart.
PATIENT = {"timeout": 5.0, "retries": 60, "backoff": 0.05, "backoff_cap": 0.5, "heartbeat": 0.5}


class Markers:
    """The folder where `block` tasks record their starts and wait for their release."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="jobwire-sdk-"))

    def spec(self, job_id: str) -> dict[str, str]:
        """The payload of a `block` job."""
        return {"dir": str(self.dir), "id": job_id}

    def starts(self, job_id: str) -> list[Path]:
        return sorted(self.dir.glob(f"{job_id}.started.*"))

    def pids(self, job_id: str) -> list[int]:
        """The pids of the processes that started the job, one per start, in no order."""
        return [int(path.name.split(".")[2]) for path in self.starts(job_id)]

    def wait_started(self, job_id: str, count: int = 1) -> list[int]:
        """Wait until job `job_id` has started `count` times; the pids that ran it."""
        wait_until(lambda: len(self.starts(job_id)) >= count, f"{job_id} started {count}x")
        return self.pids(job_id)

    def release(self, job_id: str) -> None:
        (self.dir / f"{job_id}.release").touch()


def fresh_worker(servers: Sequence[str], **options: Any) -> Worker:
    """A Worker with the fixture tasks and quick test settings."""
    settings: dict[str, Any] = {
        "concurrency": 2,
        "grace_period": 0.0,
        "heartbeat": 0.5,
        "reconnect_base": 0.05,
        "reconnect_cap": 0.2,
    }
    settings.update(options)
    worker = Worker(servers, **settings)
    worker.tasks = dict(fixtures_tasks.worker.tasks)
    return worker


@contextmanager
def worker_thread(servers: Sequence[str], **options: Any) -> Iterator[Worker]:
    """A worker serving in a background thread (no signals there); stopped on exit."""
    with serving(fresh_worker(servers, **options)) as worker:
        yield worker


@contextmanager
def serving(worker: Worker) -> Iterator[Worker]:
    """`worker` serving in a background thread; stopped on exit."""
    thread = threading.Thread(target=worker.run, name="test-worker", daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        worker.stop()  # skip the grace period: leftover jobs are failed
        thread.join(DEADLINE)
        assert not thread.is_alive(), "worker did not stop"


def wait_workers(server: ServerProcess, count: int = 1, function: str = "echo") -> None:
    """Wait until exactly `count` workers have registered `function` on `server`."""
    wait_until(
        lambda: status(server).get(function, (0, 0, 0))[2] == count,
        f"{count} worker(s) for {function} on {server.address}",
    )


def wait_status(
    server: ServerProcess, function: str, total: int, running: int
) -> tuple[int, int, int]:
    """Wait until `function` has `total` jobs (queued + running), `running` of them running."""
    return wait_until(
        lambda: (row := status(server).get(function)) and row[:2] == (total, running) and row,
        f"{function}: total {total}, running {running}",
    )


class WorkerProcess:
    """`python -m jobwire worker tests.sdk.fixtures_tasks:worker` with its log kept."""

    def __init__(self, servers: Sequence[str], *args: str) -> None:
        self.log_path = Path(tempfile.mkstemp(prefix="jobwire-worker-", suffix=".log")[1])
        command = [sys.executable, "-m", "jobwire", "worker", "tests.sdk.fixtures_tasks:worker"]
        for server in servers:
            command += ["--server", server]
        command += ["--log-level", "DEBUG", *args]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=child_env()
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, signum: signal.Signals) -> None:
        self.proc.send_signal(signum)

    def wait(self) -> int:
        try:
            return self.proc.wait(DEADLINE)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker did not exit:\n{self.log()}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_log(self, text: str, count: int = 1) -> None:
        """Wait until the worker has logged `text` `count` times (e.g. that it is quiet)."""
        wait_until(lambda: self.log().count(text) >= count, f"worker log: {text!r} x{count}")


def child_env() -> dict[str, str]:
    """The environment for child processes: this checkout first on the import path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


@contextmanager
def worker_processes(
    servers: Sequence[str], count: int = 1, *args: str
) -> Iterator[list[WorkerProcess]]:
    procs = [WorkerProcess(servers, *args) for _ in range(count)]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()


@contextmanager
def client_thread(
    client: Client, function: str, payload: Any, **options: Any
) -> Iterator[dict[str, Any]]:
    """Run `client.submit(...)` in a thread; the dict gets "result" or "error" when it ends."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = client.submit(function, payload, **options)
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield outcome
    finally:
        thread.join(DEADLINE)
        assert not thread.is_alive(), "submit did not return"


def as_json(data: bytes) -> Any:
    return json.loads(data)


class FakeServer:
    """A scripted Gearman server that records every packet, per connection.

    While `answering`, it answers grabs with the next of `jobs` (function, payload) as
    JOB_ASSIGN_UNIQ or with NO_JOB, pings with ECHO_RES, options with OPTION_RES and SUBMIT_JOB
    and SUBMIT_JOB_BG with JOB_CREATED (and then never runs the job); otherwise it reads and
    stays silent, like a hung server. With `answer_pings` off it answers everything but pings.
    `reads` holds the packet types of each read, per connection: what the peer sent in one
    write.
    """

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.answering = True
        self.answer_pings = True
        self.connections: list[list[Packet]] = []
        self.reads: list[list[list[PacketType]]] = []
        self.jobs: list[tuple[bytes, bytes]] = []
        #: Accept OPTION_REQ grab-waits and leave GRABs unanswered while there is no job (as
        #: jobwire does); False answers UNKNOWN_OPTION and NO_JOB, as gearmand does.
        self.grab_waits = False
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            packets: list[Packet] = []
            reads: list[list[PacketType]] = []
            self.connections.append(packets)
            self.reads.append(reads)
            self.sockets.append(sock)
            threading.Thread(target=self._serve, args=(sock, packets, reads), daemon=True).start()

    def _serve(
        self, sock: socket.socket, packets: list[Packet], reads: list[list[PacketType]]
    ) -> None:
        decoder = Decoder()
        while data := _recv(sock):
            messages = decoder.feed(data)
            reads.append([PacketType(m.type) for m in messages if isinstance(m, Packet)])
            for packet in messages:
                assert isinstance(packet, Packet)
                packets.append(packet)
                if not self.answering:
                    continue
                if packet.type == P.GRAB_JOB_UNIQ and self.jobs:
                    function, payload = self.jobs.pop(0)
                    handle = b"H:fake:%d" % len(packets)
                    sock.sendall(encode(P.JOB_ASSIGN_UNIQ, handle, function, handle, payload))
                elif packet.type == P.GRAB_JOB_UNIQ and not self.grab_waits:
                    sock.sendall(encode(P.NO_JOB))
                elif packet.type == P.ECHO_REQ and self.answer_pings:
                    sock.sendall(encode(P.ECHO_RES, packet.args[0]))
                elif packet.type == P.OPTION_REQ and packet.args[0] == b"grab-waits":
                    if self.grab_waits:
                        sock.sendall(encode(P.OPTION_RES, packet.args[0]))
                    else:
                        sock.sendall(encode(P.ERROR, b"UNKNOWN_OPTION", b"Unknown option"))
                elif packet.type == P.OPTION_REQ:
                    sock.sendall(encode(P.OPTION_RES, packet.args[0]))
                elif packet.type in (P.SUBMIT_JOB, P.SUBMIT_JOB_BG):
                    sock.sendall(encode(P.JOB_CREATED, b"H:fake:%d" % len(packets)))

    def types(self, connection: int) -> list[PacketType]:
        """Packet types received on the n-th connection (none if it is not open yet)."""
        packets = self.connections[connection] if connection < len(self.connections) else []
        return [PacketType(packet.type) for packet in packets]

    def close(self) -> None:
        self.listener.close()
        for sock in self.sockets:
            sock.close()


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


@contextmanager
def fake_server() -> Iterator[FakeServer]:
    server = FakeServer()
    try:
        yield server
    finally:
        server.close()
