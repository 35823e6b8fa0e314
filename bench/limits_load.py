"""Load test of the connection bounds (docs/limits.md): do 10,000 idle connections and 100
slow readers hurt the normal clients, and does the server's memory stay bounded?

    .venv/bin/python bench/limits_load.py                # 3 rounds, unloaded and loaded in turn
    .venv/bin/python bench/limits_load.py --rounds 1 --idle 2000 --slow 20

Each round starts a fresh jobwire (compiled, memory store, Gearman only) twice: once
unloaded, once loaded with
  - `--idle` Gearman connections that spoke once (an ECHO) and then say nothing, opened from
    20 loopback addresses so that the default per-address bound (1,000) holds, and
  - `--slow` slow readers: clients that pipeline ECHO_REQ packets of 64 KiB and never read
    their replies (the server stops reading them once their output passes the transport's
    high-water mark, so they cannot make it buffer without bound),
and, once the slow readers can send no more (the kernel's buffers are full and the server
stopped reading them), runs the same gearbench scenarios against both: `fg` (16 clients x 16
pipelined, 32 workers: throughput) and `fg-serial` (one job at a time: p50 round trip). The
unloaded and
loaded runs alternate, so both see the same machine; the table gives every round's figures,
the loaded/unloaded ratio of the medians, and the server's RSS: at start, with the load
connected, and after the measured runs.

Measurement, not a test: nothing here decides a pass or a failure; the acceptance (within
20 %, RSS bounded) is read off the table. Needs `ulimit -n` above the connection count: the
script raises its own soft limit to the hard one and starts the server with `-f`.
"""

from __future__ import annotations

import argparse
import os
import resource
import selectors
import socket
import statistics
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import harness
from harness import (
    JOBWIRE_MEMORY,
    BenchResult,
    Processes,
    build_gearbench,
    managed_processes,
    rss_kib,
    run_gearbench,
    start_server,
    stop_server,
)

SCENARIOS = {
    "fg": ("--mode", "fg", "--clients", "16", "--workers", "32", "--pipeline", "16"),
    "fg-serial": ("--mode", "fg", "--clients", "1", "--workers", "1", "--pipeline", "1"),
}
JOBS = {"fg": 50_000, "fg-serial": 5_000}
SOURCES = [f"127.0.0.{n}" for n in range(2, 22)]  # 20 addresses for the idle connections
SLOW_SOURCE = "127.0.0.99"
ECHO = 16  # ECHO_REQ
SLOW_PAYLOAD = b"s" * 65536


def packet(kind: int, body: bytes) -> bytes:
    return b"\0REQ" + struct.pack("!II", kind, len(body)) + body


@dataclass
class Load:
    """The idle connections and slow readers of one loaded run."""

    idle: list[socket.socket] = field(default_factory=list)
    slow: list[socket.socket] = field(default_factory=list)
    refused: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    feeder: threading.Thread | None = None
    sent: int = 0  # bytes the slow readers got the server to take

    def open(self, port: int, idle: int, slow: int) -> None:
        ping = packet(ECHO, b"x")
        batch: list[socket.socket] = []
        for n in range(idle):
            sock = _connect(port, SOURCES[n % len(SOURCES)])
            sock.sendall(ping)
            batch.append(sock)
            if len(batch) == 200:  # read the echoes a batch at a time: the backlog is 1024
                self._settle(batch)
                batch = []
        self._settle(batch)
        for _ in range(slow):
            sock = _connect(port, SLOW_SOURCE)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            self.slow.append(sock)
        self.feeder = threading.Thread(target=self._feed, daemon=True)
        self.feeder.start()

    def saturated(self, quiet: float = 2.0, limit: float = 120.0) -> float:
        """Wait until the slow readers can send no more (every buffer between them and the
        server is full and the server stopped reading them): the steady state the load
        is about, not the seconds it takes to get there. Returns the seconds waited."""
        start = time.monotonic()
        last, since = -1, start
        while time.monotonic() - start < limit:
            if self.sent != last:
                last, since = self.sent, time.monotonic()
            elif time.monotonic() - since >= quiet:
                break
            time.sleep(0.1)
        return time.monotonic() - start

    def _settle(self, batch: list[socket.socket]) -> None:
        for sock in batch:
            reply = sock.recv(64)
            if b"SERVER_BUSY" in reply or not reply:
                self.refused += 1
                sock.close()
            else:
                self.idle.append(sock)

    def _feed(self) -> None:
        """Keep every slow reader's send buffer full; never read a reply."""
        data = packet(ECHO, SLOW_PAYLOAD) * 4
        selector = selectors.DefaultSelector()
        for sock in self.slow:
            selector.register(sock, selectors.EVENT_WRITE)
        while not self.stop.is_set():
            for key, _ in selector.select(timeout=0.2):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    self.sent += sock.send(data)
                except BlockingIOError:
                    pass
                except OSError:  # closed by the server
                    selector.unregister(sock)
            time.sleep(0.05)  # a slow reader is also a slow writer; do not spin

    def close(self) -> None:
        self.stop.set()
        if self.feeder is not None:
            self.feeder.join()
        for sock in self.idle + self.slow:
            sock.close()


def _connect(port: int, source: str) -> socket.socket:
    for _ in range(100):
        sock = socket.socket()
        sock.bind((source, 0))
        try:
            sock.connect(("127.0.0.1", port))
            return sock
        except OSError:  # the listen backlog overflowed: try again shortly
            sock.close()
            time.sleep(0.01)
    raise RuntimeError(f"cannot connect from {source}")


@dataclass
class Run:
    loaded: bool
    results: dict[str, BenchResult] = field(default_factory=dict)
    rss_start: int = 0
    rss_loaded: int = 0
    rss_end: int = 0
    idle: int = 0
    slow: int = 0
    refused: int = 0
    waited: float = 0.0
    slow_sent: int = 0


def one_run(procs: Processes, gearbench: Path, loaded: bool, idle: int, slow: int) -> Run:
    run = Run(loaded)
    server = start_server(procs, JOBWIRE_MEMORY, label="loaded" if loaded else "unloaded")
    load = Load()
    try:
        run.rss_start = rss_kib(server.pid)
        if loaded:
            load.open(server.port, idle, slow)
            run.waited = load.saturated()
            run.idle, run.slow, run.refused = len(load.idle), len(load.slow), load.refused
            run.slow_sent = load.sent
        run.rss_loaded = rss_kib(server.pid)
        for name, args in SCENARIOS.items():
            result = run_gearbench(
                procs, gearbench, server.port, [*args, "--jobs", str(JOBS[name])], timeout=300
            )
            run.results[name] = result
        run.rss_end = rss_kib(server.pid)
    finally:
        load.close()
        stop_server(procs, server)
    return run


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle", type=int, default=10_000)
    parser.add_argument("--slow", type=int, default=100)
    args = parser.parse_args()

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = args.idle + args.slow + 1_000
    if hard < needed:
        raise SystemExit(f"the open files hard limit is {hard}; this load needs {needed}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    # The server: room for the load, and every other bound at its default (the total is the
    # one default the load exceeds by design).
    total = args.idle + args.slow + 500
    harness.JOBWIRE_EXTRA_ARGS[:] = [
        *harness.JOBWIRE_EXTRA_ARGS,
        "-f",
        str(min(hard, needed + 1_000)),
        "--max-connections",
        str(total),
    ]
    gearbench = build_gearbench()
    runs: list[Run] = []
    with managed_processes() as procs:
        for round_ in range(args.rounds):
            for loaded in (False, True) if round_ % 2 == 0 else (True, False):
                run = one_run(procs, gearbench, loaded, args.idle, args.slow)
                runs.append(run)
                fg, serial = run.results["fg"], run.results["fg-serial"]
                print(
                    f"round {round_ + 1} {'loaded  ' if loaded else 'unloaded'}: "
                    f"fg {fg.jobs_per_s or 0:,.0f} jobs/s p50 {fg.data.get('p50_ms')} ms; "
                    f"fg-serial {serial.jobs_per_s or 0:,.0f} jobs/s "
                    f"p50 {serial.data.get('p50_ms')} ms; "
                    f"RSS start/loaded/end {run.rss_start // 1024}/{run.rss_loaded // 1024}/"
                    f"{run.rss_end // 1024} MiB"
                    + (
                        f"; idle {run.idle} (refused {run.refused}), slow {run.slow} "
                        f"(took {run.slow_sent / 1e6:.0f} MB in {run.waited:.0f}s, then none)"
                        if loaded
                        else ""
                    ),
                    flush=True,
                )
    print()
    print(f"load average {os.getloadavg()[0]:.1f} (2 cores)")
    for name in SCENARIOS:
        rows = {}
        for loaded in (False, True):
            picked = [r.results[name] for r in runs if r.loaded is loaded]
            rows[loaded] = (
                [float(r.jobs_per_s or 0) for r in picked],
                [float(r.data.get("p50_ms") or 0) for r in picked],
            )
        (tu, pu), (tl, pl) = rows[False], rows[True]
        print(
            f"{name:10} jobs/s unloaded {median(tu):,.0f} [{min(tu):,.0f}-{max(tu):,.0f}] "
            f"loaded {median(tl):,.0f} [{min(tl):,.0f}-{max(tl):,.0f}] "
            f"ratio {median(tl) / median(tu):.2f}; "
            f"p50 ms unloaded {median(pu):.3f} loaded {median(pl):.3f} "
            f"ratio {median(pl) / median(pu):.2f}"
        )
    loaded_runs = [r for r in runs if r.loaded]
    print(
        "server RSS MiB, loaded runs: start "
        + ", ".join(str(r.rss_start // 1024) for r in loaded_runs)
        + "; with the load "
        + ", ".join(str(r.rss_loaded // 1024) for r in loaded_runs)
        + "; after the runs "
        + ", ".join(str(r.rss_end // 1024) for r in loaded_runs)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
