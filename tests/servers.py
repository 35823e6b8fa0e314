"""Start real server processes (jobwire, gearmand) for tests.

Readiness is awaited by polling a TCP connect up to a generous deadline: the wait never
decides whether a test passes, it only avoids racing the server's start-up.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

START_DEADLINE = 30.0


def process_state(pid: int) -> str:
    """Process `pid`'s scheduler state from /proc: R running or runnable, S asleep, Z exited
    and not yet reaped, ...; FileNotFoundError once it is gone."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


_handed_out: set[int] = set()


def free_port() -> int:
    """A port nobody listens on, never one this process handed out before: a test that asks
    for several ports before anything binds them (a Binary Star pair's) gets distinct ones."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def wait_for_port(
    port: int, proc: subprocess.Popen[bytes], deadline: float = START_DEADLINE
) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"server did not listen on {port} within {deadline}s")


@dataclass
class ServerProcess:
    """A running server; `port` is its Gearman port."""

    name: str
    proc: subprocess.Popen[bytes]
    port: int
    workdir: Path
    http_port: int | None = None
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log(self) -> str:
        path = self.workdir / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""


def start_jobwire(
    args: Sequence[str] = (),
    *,
    port: int | None = None,
    store: str = "memory",
    workdir: Path | None = None,
    http: bool = False,
    zmq: bool = False,
    env: Mapping[str, str] | None = None,
) -> ServerProcess:
    """`zmq`: serve ZeroMQ (Majordomo) on a free port too (`extra["zmq_port"]`); without it,
    off, so that parallel servers do not all claim 5555. `env`: variables to add."""
    port = port or free_port()
    workdir = workdir or Path(tempfile.mkdtemp(prefix="jobwire-test-"))
    cmd = [sys.executable, "-m", "jobwire", "serve", "--port", str(port), "--store", store]
    http_port = None
    if http:
        http_port = free_port()
        cmd += ["--http-port", str(http_port)]
    else:
        cmd += ["--http-port", "0"]  # parallel servers must not all claim 8080
    zmq_port = free_port() if zmq else 0
    cmd += ["--zmq-port", str(zmq_port)]
    cmd += list(args)
    log = open(workdir / "server.log", "wb")  # noqa: SIM115 - owned by the process
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, cwd=workdir, env={**os.environ, **(env or {})}
    )
    wait_for_port(port, proc)
    if http_port is not None:
        wait_for_port(http_port, proc)
    if zmq_port:
        wait_for_port(zmq_port, proc)
    server = ServerProcess("jobwire", proc, port, workdir, http_port)
    if zmq_port:
        server.extra["zmq_port"] = zmq_port
    return server


def gearmand_path() -> str:
    path = shutil.which("gearmand") or (
        "/usr/sbin/gearmand" if os.path.exists("/usr/sbin/gearmand") else None
    )
    if path is None:
        raise RuntimeError("gearmand is not installed (apt-get install gearman-job-server)")
    return path


def start_gearmand(args: Sequence[str] = (), *, port: int | None = None) -> ServerProcess:
    port = port or free_port()
    workdir = Path(tempfile.mkdtemp(prefix="gearmand-test-"))
    cmd = [
        gearmand_path(),
        "-L",
        "127.0.0.1",
        "-p",
        str(port),
        "-l",
        str(workdir / "server.log"),
        "--verbose",
        "INFO",
        *args,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd=workdir)
    wait_for_port(port, proc)
    return ServerProcess("gearmand", proc, port, workdir)
