"""The serial round trip with the SDK's sides swapped for plain ones, to see what each costs.

    .venv/bin/python bench/floor.py                  # 5,000 round trips per pairing
    .venv/bin/python bench/floor.py --jobs 20000 --repeat 3

One job at a time through a fresh jobwire server (memory store, Gearman only, as in
`bench/run.py`), p50 and p90 of the round trip for each pairing of a client and a worker:

- `raw`: written against the protocol on a blocking socket, no event loop (struct, sendall,
  recv); the raw worker holds GRABs with `grab-waits`, as the SDK's worker does;
- `sdk`: `AsyncClient.submit` on asyncio, or `Worker` (uvloop) with one async no-op task.

raw/raw is the floor for any Python client and worker on the machine: the kernel, the
wake-ups and the server, with next to no interpreter work. Each pairing also reports the
worker's CPU per job (user + system, /proc). Numbers move with the host: compare within a run.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

from harness import (
    JOBWIRE_MEMORY,
    machine_info,
    managed_processes,
    start_server,
    stop_server,
)
from sdk_instructions import packet, until_complete

FUNCTION = b"noop"
WARM = 200
_HEADER = struct.Struct(">4sII")
_TICK = 1 / 100  # /proc/PID/stat counts CPU in clock ticks (USER_HZ)


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


# ---------------------------------------------------------------------------- roles


def raw_client(port: int, jobs: int) -> list[float]:
    """SUBMIT_JOB, then read until its WORK_COMPLETE; one job at a time."""
    sock = _connect(port)
    buffer = b""
    latencies = []
    for number in range(WARM + jobs):
        start = time.perf_counter()
        sock.sendall(packet(7, FUNCTION, b"k%d" % number, b""))
        buffer = until_complete(sock, buffer)
        if number >= WARM:
            latencies.append((time.perf_counter() - start) * 1e6)
    return latencies


def raw_worker(port: int) -> None:
    """CAN_DO, grab-waits, one held GRAB_JOB_UNIQ; completes each job at once, empty."""
    sock = _connect(port)
    grab = packet(30)
    sock.sendall(packet(1, FUNCTION) + packet(26, b"grab-waits") + grab)
    buffer = b""
    while chunk := sock.recv(65536):
        buffer += chunk
        out = []
        while len(buffer) >= 12 and len(buffer) >= 12 + _HEADER.unpack_from(buffer)[2]:
            _, ptype, size = _HEADER.unpack_from(buffer)
            body, buffer = buffer[12 : 12 + size], buffer[12 + size :]
            if ptype == 31:  # JOB_ASSIGN_UNIQ
                out.append(packet(13, body.split(b"\0", 1)[0], b"") + grab)
        if out:
            sock.sendall(b"".join(out))


def sdk_client(port: int, jobs: int) -> list[float]:
    import asyncio

    from jobwire import AsyncClient

    async def main() -> list[float]:
        async with AsyncClient([f"127.0.0.1:{port}"]) as client:
            latencies = []
            for number in range(WARM + jobs):
                start = time.perf_counter()
                await client.submit(FUNCTION.decode())
                if number >= WARM:
                    latencies.append((time.perf_counter() - start) * 1e6)
            return latencies

    return asyncio.run(main())


def sdk_worker(port: int) -> None:
    from jobwire import Job, Worker

    worker = Worker([f"127.0.0.1:{port}"], concurrency=16)

    async def noop(job: Job) -> bytes:
        return b""

    worker.add_task(FUNCTION.decode(), noop)
    worker.run()


# ---------------------------------------------------------------------------- measuring


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * _TICK  # utime, stime


def _until_listening(port: int, worker: subprocess.Popen[bytes]) -> None:
    """Wait until a worker has registered: admin `status` lists the function with a worker."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if worker.poll() is not None:
            raise SystemExit(f"the worker exited with {worker.returncode}")
        with socket.create_connection(("127.0.0.1", port)) as admin:
            admin.sendall(b"status\n")
            reply = b""
            while not reply.endswith(b".\n"):
                reply += admin.recv(4096)
        for line in reply.decode().splitlines():
            parts = line.split("\t")
            if parts[0] == FUNCTION.decode() and len(parts) == 4 and int(parts[3]) > 0:
                return
        time.sleep(0.05)
    raise SystemExit("the worker did not register within 30 s")


def pairing(client: str, worker: str, jobs: int) -> dict[str, float]:
    with managed_processes() as procs:
        server = start_server(procs, JOBWIRE_MEMORY, label="floor")
        me = [sys.executable, __file__]
        working = procs.spawn([*me, "_role", f"{worker}-worker", str(server.port)])
        _until_listening(server.port, working)
        cpu0 = _cpu_seconds(working.pid)
        out = subprocess.run(
            [*me, "_role", f"{client}-client", str(server.port), str(jobs)],
            capture_output=True,
            check=True,
        ).stdout
        cpu = _cpu_seconds(working.pid) - cpu0
        procs.stop(working)
        stop_server(procs, server)
    latencies = sorted(json.loads(out))
    return {
        "p50_us": statistics.median(latencies),
        "p90_us": latencies[int(len(latencies) * 0.9)],
        "worker_cpu_us": cpu / (jobs + WARM) * 1e6,
    }


def _role(argv: list[str]) -> int:
    role, port = argv[0], int(argv[1])
    if role.endswith("-client"):
        run = raw_client if role == "raw-client" else sdk_client
        print(json.dumps(run(port, int(argv[2]))))
    else:
        (raw_worker if role == "raw-worker" else sdk_worker)(port)
    return 0


def main() -> int:
    if sys.argv[1:2] == ["_role"]:
        return _role(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5_000)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    info = machine_info()
    print(
        f"# {info['cpus']} CPUs ({info['cpu']}), Python {info['python']}, jobwire"
        f" {info['jobwire_rev']}, load {info['loadavg']}, ping-pong p50 {info['wakeup_us']} us"
    )
    print("client  worker  p50 us  p90 us  worker cpu us/job")
    for _ in range(args.repeat):
        for client, worker in (("raw", "raw"), ("raw", "sdk"), ("sdk", "raw"), ("sdk", "sdk")):
            row = pairing(client, worker, args.jobs)
            print(
                f"{client:6}  {worker:6}  {row['p50_us']:6.1f}  {row['p90_us']:6.1f}"
                f"  {row['worker_cpu_us']:6.1f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
