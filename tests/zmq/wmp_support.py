"""Real WMP peers and processes for the WMP tests: managers (jobwire servers with
`--wmp-port`), devices (`jobwire device`), SDK workers (`jobwire worker --wmp`) and raw
DEALER workers. Every receive waits up to a generous deadline; nothing depends on timing."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
from jobwire.protocols.zmq import wmp
from jobwire.protocols.zmq.wmp import Message
from tests.servers import ServerProcess, free_port, start_jobwire, wait_for_port

DEADLINE = 30.0


def start_manager(args: Sequence[str] = (), *, http: bool = True) -> ServerProcess:
    """jobwire with a WMP manager (`extra["wmp"]` is its endpoint). Workers that announce no
    heartbeat may stay silent for 30 s (`--wmp-heartbeat 10`)."""
    port = free_port()
    extra = [] if "--wmp-heartbeat" in args else ["--wmp-heartbeat", "10"]
    server = start_jobwire(["--wmp-port", str(port), *extra, *args], http=http)
    wait_for_port(port, server.proc)
    server.extra["wmp"] = f"tcp://127.0.0.1:{port}"
    return server


def endpoint(server: ServerProcess) -> str:
    return str(server.extra["wmp"])


@dataclass
class Process:
    """A helper process (device or worker) with its log."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    endpoint: str = ""

    def stop(self, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def _spawn(args: list[str], env: Mapping[str, str] | None = None) -> Process:
    workdir = Path(tempfile.mkdtemp(prefix="jobwire-wmp-"))
    log_path = workdir / "process.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobwire", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
    return Process(proc, log_path)


def start_device(managers: Sequence[str]) -> Process:
    port = free_port()
    bind = f"tcp://127.0.0.1:{port}"
    args = ["device", "--bind", bind, "--log-level", "INFO"]
    for manager in managers:
        args += ["--manager", manager]
    device = _spawn(args)
    device.endpoint = bind
    wait_for_port(port, device.proc)
    return device


def start_worker(
    managers: Sequence[str],
    task_log: Path,
    *,
    slots: int = 2,
    roles: Sequence[str] = (),
    name: str = "worker",
) -> Process:
    args = ["worker", "tests.zmq.wmp_tasks:worker", "-c", str(slots), "--log-level", "INFO"]
    for manager in managers:
        args += ["--wmp", manager]
    for role in roles:
        args += ["--role", role]
    env = {"WMP_TASK_LOG": str(task_log), "WMP_WORKER_NAME": name, "PYTHONPATH": os.getcwd()}
    return _spawn(args, env)


@dataclass
class RawWorker:
    """A DEALER speaking WMP by hand."""

    context: zmq.Context[Any]
    endpoint: str
    sock: zmq.Socket[Any] = field(init=False)

    def __post_init__(self) -> None:
        self.sock = self.context.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(self.endpoint)

    def send(
        self,
        command: bytes,
        headers: Mapping[str, object] | None = None,
        payload: Sequence[bytes] = (),
    ) -> None:
        self.sock.send_multipart([b"", *wmp.encode(command, headers, payload)])

    def send_frames(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames)

    def ready(self, slot: str = "0", functions: str = "echo", **headers: object) -> None:
        self.send(wmp.READY, {"slot": slot, "functions": functions, **headers})

    def recv(self, deadline: float = DEADLINE) -> Message:
        if not self.sock.poll(int(deadline * 1000)):
            raise AssertionError(f"nothing received within {deadline}s")
        frames = self.sock.recv_multipart()
        hops, body = wmp.split_envelope(frames)
        assert hops == (), frames
        return wmp.decode(body)

    def expect(self, command: bytes) -> Message:
        """The next message with `command` (heartbeats skipped; anything else fails)."""
        end = time.monotonic() + DEADLINE
        while True:
            message = self.recv(max(0.01, end - time.monotonic()))
            if message.command == wmp.HEARTBEAT:
                continue
            assert message.command == command, message
            return message

    def quiet_for(self, seconds: float) -> bool:
        """True if nothing arrives within `seconds` (only for 'must not send' checks, whose
        failure mode is a message arriving, never a slow server)."""
        return not self.sock.poll(int(seconds * 1000))

    def close(self) -> None:
        self.sock.close(linger=0)


def wait_until(condition: Callable[[], bool], what: str, deadline: float = DEADLINE) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {deadline}s: {what}")


def task_lines(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    return [line.split() for line in path.read_text().splitlines() if line.strip()]
