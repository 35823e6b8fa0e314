"""Instructions per round trip of the Python SDK: its client and its worker under callgrind.

    .venv/bin/python bench/sdk_instructions.py              # both sides, against plain peers
    PYTHONPATH=/tmp/old/src .venv/bin/python bench/sdk_instructions.py   # another checkout

A serial round trip (one job at a time, memory store) has two SDK sides on its critical path.
Each is measured alone, the other side played by a plain peer that costs little:

- client: `AsyncClient.submit` one job at a time, run by a worker written against the raw
  protocol with asyncio (the `plain-worker` role);
- worker: `Worker` with one async no-op task, fed by a blocking-socket client (`plain-client`).

Then each side written plainly against the raw protocol with asyncio (`plain-async-client`,
`plain-worker`), for the floor: what asyncio and the protocol cost without the SDK.
callgrind counts user-space instructions, the same for the same code whatever else the
machine does (`bench/instructions.py` says more). Each side runs twice, with `--jobs` and
with `--base` round trips after the same warm-up; the difference divided by the difference
in jobs is the cost of one round trip, start-up and shutdown cancelled out.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import cast

from harness import JOBWIRE_MEMORY, OUT, Processes, managed_processes, start_server, stop_server

WARM = 200
FUNCTION = "noop"
_REQ = b"\0REQ"
_HEADER = struct.Struct(">4sII")


def packet(ptype: int, *args: bytes) -> bytes:
    body = b"\0".join(args)
    return _HEADER.pack(_REQ, ptype, len(body)) + body


# ---------------------------------------------------------------------------- roles


def plain_client(port: int, jobs: int) -> None:
    """SUBMIT_JOB and wait for WORK_COMPLETE, one at a time, on a blocking socket."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    submit = packet(7, FUNCTION.encode(), b"", b"x")
    buffer = b""
    for _ in range(WARM + jobs):
        sock.sendall(submit)
        buffer = until_complete(sock, buffer)


def until_complete(sock: socket.socket, buffer: bytes) -> bytes:
    """Read packets from a blocking socket up to a WORK_COMPLETE; returns the bytes after it."""
    while True:
        while len(buffer) < 12 or len(buffer) < 12 + _HEADER.unpack_from(buffer)[2]:
            chunk = sock.recv(65536)
            if not chunk:
                raise SystemExit("the server closed the connection")
            buffer += chunk
        _, ptype, size = _HEADER.unpack_from(buffer)
        buffer = buffer[12 + size :]
        if ptype == 13:  # WORK_COMPLETE
            return buffer


class _PlainWorker(asyncio.Protocol):
    """Holds a GRAB (jobwire's grab-waits) and completes each job at once, empty."""

    def __init__(self) -> None:
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        grab = packet(30)
        self.transport.write(packet(1, FUNCTION.encode()) + packet(26, b"grab-waits") + grab)

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.buffer += data
        out = []
        while len(self.buffer) >= 12:
            _, ptype, size = _HEADER.unpack_from(self.buffer)
            if len(self.buffer) < 12 + size:
                break
            body, self.buffer = self.buffer[12 : 12 + size], self.buffer[12 + size :]
            if ptype == 31:  # JOB_ASSIGN_UNIQ: complete it, hold the next GRAB
                out.append(packet(13, body.split(b"\0", 1)[0], b"") + packet(30))
            elif ptype in (6, 10):  # NOOP, NO_JOB (a server without grab-waits)
                out.append(packet(30) if ptype == 6 else packet(4))
        if out:
            self.transport.write(b"".join(out))


def plain_worker(port: int) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)  # exit cleanly: callgrind writes out
        await loop.create_connection(_PlainWorker, "127.0.0.1", port)
        await stop.wait()

    _run(main())


class _PlainClient(asyncio.Protocol):
    """Resolves `done` at each WORK_COMPLETE."""

    def __init__(self) -> None:
        self.buffer = b""
        self.done: asyncio.Future[None] | None = None

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= 12:
            _, ptype, size = _HEADER.unpack_from(self.buffer)
            if len(self.buffer) < 12 + size:
                break
            self.buffer = self.buffer[12 + size :]
            if ptype == 13 and self.done is not None:
                self.done.set_result(None)


def plain_async_client(port: int, jobs: int) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.create_connection(_PlainClient, "127.0.0.1", port)
        submit = packet(7, FUNCTION.encode(), b"", b"x")
        for _ in range(WARM + jobs):
            protocol.done = loop.create_future()
            transport.write(submit)
            await protocol.done
        transport.close()

    _run(main())


def sdk_client(port: int, jobs: int) -> None:
    from jobwire import AsyncClient

    async def main() -> None:
        # Without busy polling: under callgrind the wait for the reply is slowed down as much
        # as everything else, and its polling passes would be counted as work.
        async with AsyncClient([f"127.0.0.1:{port}"], busy_poll=0) as client:
            for _ in range(WARM + jobs):
                await client.submit(FUNCTION, b"x")

    _run(main())


def sdk_worker(port: int) -> None:
    from jobwire import Job, Worker

    worker = Worker([f"127.0.0.1:{port}"], concurrency=16)

    async def noop(job: Job) -> bytes:
        return b""

    worker.add_task(FUNCTION, noop)
    worker.run()


def _run(main: object) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)  # type: ignore[arg-type]
    else:
        uvloop.run(main)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- measuring


def _role(name: str, port: int, jobs: int = 0) -> list[str]:
    return [sys.executable, __file__, "--role", name, "--port", str(port), "--jobs", str(jobs)]


def _callgrind(out: Path) -> list[str]:
    return ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-instr=no"]


def _total(out: Path) -> int:
    for line in out.read_text().splitlines():
        match = re.match(r"(?:totals|summary):\s+(\d+)", line)
        if match:
            return int(match.group(1))
    raise RuntimeError(f"no totals in {out}")


def _wait_for_worker(port: int, procs: Processes, env: dict[str, str]) -> None:
    """One submission answered: the worker is connected and registered."""
    probe = procs.spawn(_role("plain-client", port, 1), env=env)
    if probe.wait(timeout=300) != 0:
        raise RuntimeError("the worker did not answer")


def client_side(procs: Processes, port: int, jobs: int, role: str, env: dict[str, str]) -> int:
    """Instructions of the `role` client for `jobs` round trips (a plain worker answers)."""
    worker = procs.spawn(_role("plain-worker", port), env=env)
    try:
        _wait_for_worker(port, procs, env)
        out = OUT / f"cg-sdk-{role}-{jobs}.out"
        run = procs.spawn(
            [*_callgrind(out), *_role(role, port, jobs)], env=env, stderr=subprocess.DEVNULL
        )
        if run.wait(timeout=1200) != 0:
            raise RuntimeError(f"{role} failed")
        return _total(out)
    finally:
        procs.stop(worker)


def worker_side(procs: Processes, port: int, jobs: int, role: str, env: dict[str, str]) -> int:
    """Instructions of the `role` worker for `jobs` round trips (a plain client submits)."""
    out = OUT / f"cg-sdk-{role}-{jobs}.out"
    worker = procs.spawn([*_callgrind(out), *_role(role, port)], env=env, stderr=subprocess.DEVNULL)
    try:
        _wait_for_worker(port, procs, env)  # it takes seconds to start under valgrind
        run = procs.spawn(_role("plain-client", port, jobs), env=env)
        if run.wait(timeout=1200) != 0:
            raise RuntimeError("the plain client failed")
    finally:
        procs.stop(worker)  # SIGTERM: the worker stops gracefully and callgrind writes out
    return _total(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--role",
        choices=["plain-client", "plain-async-client", "plain-worker", "sdk-client", "sdk-worker"],
        help="run one side only (the benchmark starts these itself)",
    )
    parser.add_argument("--port", type=int, default=4730)
    parser.add_argument("--jobs", type=int, default=2_000, help="round trips measured")
    parser.add_argument("--base", type=int, default=200, help="round trips of the base run")
    args = parser.parse_args()
    if args.role is not None:  # one side of a round trip, in a process of its own
        clients = {
            "plain-client": plain_client,
            "plain-async-client": plain_async_client,
            "sdk-client": sdk_client,
        }
        workers = {"plain-worker": plain_worker, "sdk-worker": sdk_worker}
        if args.role in clients:
            clients[args.role](args.port, args.jobs)
        else:
            workers[args.role](args.port)
        return 0
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    env = dict(os.environ)
    sides = [
        ("SDK client (AsyncClient)", client_side, "sdk-client"),
        ("plain asyncio client", client_side, "plain-async-client"),
        ("SDK worker (Worker)", worker_side, "sdk-worker"),
        ("plain asyncio worker", worker_side, "plain-worker"),
    ]
    OUT.mkdir(parents=True, exist_ok=True)
    rows = []
    with managed_processes() as procs:
        server = start_server(procs, JOBWIRE_MEMORY, "sdk-instr")
        try:
            for label, measure, role in sides:
                counts = [measure(procs, server.port, n, role, env) for n in (args.jobs, args.base)]
                per_trip = (counts[0] - counts[1]) / (args.jobs - args.base)
                rows.append((label, per_trip))
                print(f"  {label:<26} {per_trip:>10,.0f} instr/round trip", flush=True)
        finally:
            stop_server(procs, server)
    print()
    print(f"{'side':<26} {'instr/round trip':>16}")
    for label, per_trip in rows:
        print(f"{label:<26} {per_trip:>16,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
