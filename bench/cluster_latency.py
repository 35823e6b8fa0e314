"""Latency across two jobwire nodes on one PostgreSQL schema (docs/scaling.md, "The cluster").

    .venv/bin/python bench/cluster_latency.py --jobs 200

Starts two nodes (`--cluster-poll 60`, so every wake-up measured came by notification) on
a fresh schema of `--pg`, a Gearman worker on node B that sleeps between jobs, and a client on
node A, and measures one job at a time:

- bg: from sending SUBMIT_JOB_BG on A to the worker on B holding the job (JOB_ASSIGN): A
  writes the row as B's and sends it over their peer link as the commit begins, and B wakes
  the worker (with `--no-links`: the commit on A, its notification, B's claim);
- fg: from sending SUBMIT_JOB on A to the client holding WORK_COMPLETE, the worker on B
  completing at once: A hands the job to B over their peer link (`jobwire.store.peerlink`)
  and B sends the result back on it; with `--no-links`, the job goes as bg does, and B's
  result is notified back to A;
- fg-local: the same with the worker on A, for comparison (nothing goes through the database).

Prints p50/p90/max per scenario, and the database's commits, WAL bytes and backend CPU per
job over the cluster runs. Wall-clock figures: on a loaded machine they move with the load.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from durable import PG, PgRun
from harness import free_port

REQ, RES = b"\0REQ", b"\0RES"
CAN_DO, PRE_SLEEP, NOOP, SUBMIT_JOB, JOB_CREATED, GRAB_JOB = 1, 4, 6, 7, 8, 9
NO_JOB, JOB_ASSIGN, WORK_COMPLETE, SUBMIT_JOB_BG = 10, 11, 13, 18


class Gearman:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""

    def send(self, kind: int, *args: bytes) -> None:
        body = b"\0".join(args)
        self.sock.sendall(REQ + struct.pack(">II", kind, len(body)) + body)

    def recv(self) -> tuple[int, list[bytes]]:
        while True:
            if len(self.buffer) >= 12:
                kind, size = struct.unpack(">II", self.buffer[4:12])
                if len(self.buffer) >= 12 + size:
                    body = self.buffer[12 : 12 + size]
                    self.buffer = self.buffer[12 + size :]
                    return kind, body.split(b"\0")
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buffer += chunk

    def expect(self, kind: int) -> list[bytes]:
        got, args = self.recv()
        if got != kind:
            raise AssertionError(f"expected packet {kind}, got {got} {args!r}")
        return args


def start_node(dsn: str, log: Path, links: bool) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    cmd = [sys.executable, "-m", "jobwire", "serve", "--port", str(port), "--http-port", "0"]
    cmd += ["--zmq-port", "0", "--store", dsn, "--cluster-poll", "60", "--verbose", "INFO"]
    if not links:
        cmd += ["--peer-listen", "off"]
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"node did not start: {log.read_text()}")


def sleep_worker(worker: Gearman) -> None:
    worker.send(PRE_SLEEP)


def run(client: Gearman, worker: Gearman, jobs: int, foreground: bool) -> list[float]:
    """Milliseconds per job; the worker sleeps before each submit."""
    samples = []
    for number in range(jobs):
        started = time.perf_counter()
        payload = b"job %d" % number
        client.send(SUBMIT_JOB if foreground else SUBMIT_JOB_BG, b"lat", b"", payload)
        worker.expect(NOOP)
        worker.send(GRAB_JOB)
        handle = worker.expect(JOB_ASSIGN)[0]
        if not foreground:
            samples.append((time.perf_counter() - started) * 1000)
        worker.send(WORK_COMPLETE, handle, b"ok")
        client.expect(JOB_CREATED)
        if foreground:
            client.expect(WORK_COMPLETE)
            samples.append((time.perf_counter() - started) * 1000)
        worker.send(GRAB_JOB)
        worker.expect(NO_JOB)
        sleep_worker(worker)
    return samples


def worker_on(port: int) -> Gearman:
    worker = Gearman(port)
    worker.send(CAN_DO, b"lat")
    worker.send(GRAB_JOB)
    worker.expect(NO_JOB)
    sleep_worker(worker)
    return worker


def summary(name: str, samples: list[float]) -> str:
    ordered = sorted(samples)
    p90 = ordered[int(len(ordered) * 0.9) - 1]
    return (
        f"{name:9} p50 {statistics.median(ordered):7.2f} ms  p90 {p90:7.2f} ms"
        f"  max {ordered[-1]:7.2f} ms  ({len(ordered)} jobs)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--pg", default=PG)
    parser.add_argument(
        "--no-links",
        action="store_true",
        help="nodes without peer links: foreground jobs go by the shared queue",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="jobwire-cluster-bench-"))
    pg = PgRun(args.pg)
    nodes: list[subprocess.Popen[bytes]] = []
    try:
        links = not args.no_links
        first, first_port = start_node(pg.dsn, work / "a.log", links)
        second, second_port = start_node(pg.dsn, work / "b.log", links)
        nodes += [first, second]
        deadline = time.monotonic() + 60
        while "cluster: 2 nodes" not in (work / "a.log").read_text():
            if time.monotonic() > deadline:
                raise RuntimeError("the nodes did not meet")
            time.sleep(0.05)
        client = Gearman(first_port)
        remote = worker_on(second_port)
        pg.start = pg.sample()
        bg = run(client, remote, args.jobs, foreground=False)
        fg = run(client, remote, args.jobs, foreground=True)
        costs = pg.costs(2 * args.jobs)
        remote.sock.close()
        local = worker_on(first_port)
        fg_local = run(client, local, args.jobs, foreground=True)
        print(summary("bg", bg))
        print(summary("fg", fg))
        print(summary("fg-local", fg_local))
        print(
            "database per cross-node job (bg and fg): "
            f"{costs['pg_commits_per_job']:.2f} commits, "
            f"{costs['pg_wal_bytes_per_job']:.0f} WAL bytes, "
            f"{costs['pg_cpu_us_per_job']:.0f} us backend CPU"
        )
    finally:
        for node in nodes:
            node.kill()
            node.wait()
        pg.close()


if __name__ == "__main__":
    main()
