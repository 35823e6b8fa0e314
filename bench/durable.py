"""Durable enqueue rate, background throughput and replay time: jobwire vs gearmand.

    .venv/bin/python bench/durable.py                       # everything, 3 rounds
    .venv/bin/python bench/durable.py --servers sqlite-batch,memory --rounds 5
    .venv/bin/python bench/durable.py --replay 1000000 --skip-throughput

Servers (each run starts a fresh one on an empty file):
  memory          jobwire --store memory
  sqlite-batch    jobwire --store sqlite:FILE (--fsync batch, the default)
  sqlite-always   jobwire --store sqlite:FILE --fsync always
  sqlite-off      jobwire --store sqlite:FILE --fsync off
  gearmand        gearmand (in memory, default threads)
  gearmand-sqlite gearmand -q libsqlite3 --libsqlite3-db FILE
  postgresql      jobwire --store postgresql://... (a fresh schema per run in --pg's
                  database; not in the default list: it needs the local PostgreSQL)
  postgresql-serial  the same with one commit in flight (JOBWIRE_PG_IN_FLIGHT=1), not two

Scenarios, with gearbench (/work/shared/bench/gearbench.c, built into bench/out/):
  enqueue  --clients C submit --jobs N background jobs, --pipeline D outstanding each, no
           workers: acknowledged jobs per second.
  bg       clients and --workers W together: completed jobs per second.
Rounds interleave the servers, so background load on a shared machine hits them alike; the
table shows the median and the best round. gearmand's sqlite queue is slow, so it runs
--slow-jobs jobs. Replay: fill a jobwire sqlite file with --replay jobs through the server,
stop it, start it again and read the replay time it logs. Not a test: nothing is asserted.

Each row also gives the server process's CPU per job over the scenario (user + system, from
/proc: it moves little with the machine's load, unlike the rates).
For postgresql, each row also gives the database's cost per job over the run: commits
(`xact_commit` of the database), WAL bytes (`pg_current_wal_lsn`, cluster-wide: other
activity on the same PostgreSQL counts too) and the CPU seconds of the node's backends
(from /proc, as the node's application_name finds them).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "bench" / "out"
GEARBENCH_SRC = Path(os.environ.get("GEARBENCH_SRC", REPO.parent / "shared/bench/gearbench.c"))
JOBWIRE = [sys.executable, "-m", "jobwire", "serve", "--http-port", "0", "--zmq-port", "0"]
SERVERS = {
    "memory": ["--store", "memory"],
    "sqlite-batch": ["--store", "sqlite:{db}", "--fsync", "batch"],
    "sqlite-always": ["--store", "sqlite:{db}", "--fsync", "always"],
    "sqlite-off": ["--store", "sqlite:{db}", "--fsync", "off"],
    "gearmand": [],
    "gearmand-sqlite": ["-q", "libsqlite3", "--libsqlite3-db", "{db}"],
    "postgresql": ["--store", "{pg}"],
    "postgresql-serial": ["--store", "{pg}"],
}
#: Environment of a server: postgresql-serial keeps one commit in flight instead of two.
SERVER_ENV = {"postgresql-serial": {"JOBWIRE_PG_IN_FLIGHT": "1"}}
DEFAULT_SERVERS = [name for name in SERVERS if not name.startswith("postgresql")]
#: The database the postgresql runs use (`--pg`); each run makes a schema there and drops it.
PG = "postgresql://jobwire@127.0.0.1:5432/jobwire_test"
APPLICATION = "jobwire_bench_node"


class PgRun:
    """A schema for one run, and what the database spent on it."""

    def __init__(self, base: str) -> None:
        import psycopg

        self.base = base
        self.schema = f"jobwire_bench_{os.getpid()}_{time.monotonic_ns()}"
        self.admin = psycopg.connect(base, autocommit=True)
        self.admin.execute(f"CREATE SCHEMA {self.schema}")
        self.start = self.sample()

    @property
    def dsn(self) -> str:
        options = f"options=-csearch_path%3D{self.schema}&application_name={APPLICATION}"
        return f"{self.base}?{options}"

    def sample(self) -> tuple[int, int]:
        row = self.admin.execute(
            "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, xact_commit FROM pg_stat_database"
            " WHERE datname = current_database()"
        ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    def costs(self, jobs: int) -> dict[str, float]:
        """Per job since the start: WAL bytes, commits, CPU microseconds of the backends."""
        wal, commits = self.sample()
        pids = self.admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (APPLICATION,)
        ).fetchall()
        ticks = 0
        for (pid,) in pids:
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
                ticks += int(fields[11]) + int(fields[12])
        seconds = ticks / os.sysconf("SC_CLK_TCK")
        return {
            "pg_wal_bytes_per_job": (wal - self.start[0]) / jobs,
            # The sampling queries' own transactions are left out (two).
            "pg_commits_per_job": (commits - self.start[1] - 2) / jobs,
            "pg_cpu_us_per_job": seconds / jobs * 1e6,
        }

    def close(self) -> None:
        self.admin.execute(f"DROP SCHEMA {self.schema} CASCADE")
        self.admin.close()


PG_RUN: PgRun | None = None


def build_gearbench() -> Path:
    binary = OUT / "gearbench"
    if not binary.exists() or binary.stat().st_mtime < GEARBENCH_SRC.stat().st_mtime:
        OUT.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cc", "-O2", "-o", str(binary), str(GEARBENCH_SRC)], check=True)
    return binary


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def server(name: str, workdir: Path, *extra: str) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """Start `name` on a free port with its files in `workdir`; stop it (SIGTERM) after."""
    port = free_port()
    pg = PG_RUN.dsn if PG_RUN is not None else ""
    args = [arg.format(db=workdir / "jobs.db", pg=pg) for arg in SERVERS[name]]
    if name.startswith("gearmand"):
        gearmand = shutil.which("gearmand") or "/usr/sbin/gearmand"
        cmd = [gearmand, "-L", "127.0.0.1", "-p", str(port), "-l", "none", *args]
    else:
        cmd = [*JOBWIRE, "--port", str(port), *args, *extra]
    with open(workdir / "server.log", "ab") as log:
        env = {**os.environ, **SERVER_ENV.get(name, {})}
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=workdir, env=env)
    try:
        deadline = time.monotonic() + 600
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited: {(workdir / 'server.log').read_text()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        yield port, proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cpu_seconds(pid: int) -> float:
    """The CPU time (user and system) a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def gearbench(binary: Path, port: int, *args: str) -> dict[str, Any]:
    cmd = [str(binary), "--port", str(port), "--timeout", "600", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    line = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "{}"
    result: dict[str, Any] = json.loads(line)
    if done.returncode or not result.get("complete"):
        result["failed"] = done.stderr.strip() or "incomplete"
    return result


def throughput(args: argparse.Namespace, binary: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for round_number in range(args.rounds):
        for name in args.servers.split(","):
            jobs = args.slow_jobs if name == "gearmand-sqlite" else args.jobs
            common = ["--jobs", str(jobs), "--clients", str(args.clients)]
            common += ["--pipeline", str(args.pipeline)]
            for mode in ("enqueue", "bg"):
                extra = ["--workers", str(args.workers)] if mode == "bg" else []
                global PG_RUN
                PG_RUN = PgRun(args.pg) if name.startswith("postgresql") else None
                try:
                    with (
                        tempfile.TemporaryDirectory(prefix="durable-", dir=args.tmp) as tmp,
                        server(name, Path(tmp)) as (port, proc),
                    ):
                        started = cpu_seconds(proc.pid)
                        result = gearbench(binary, port, "--mode", mode, *common, *extra)
                        spent = cpu_seconds(proc.pid) - started
                        result["server_cpu_us_per_job"] = spent / jobs * 1e6
                        if PG_RUN is not None:
                            result.update(PG_RUN.costs(jobs))
                finally:
                    if PG_RUN is not None:
                        PG_RUN.close()
                        PG_RUN = None
                row = {"round": round_number, "server": name, "mode": mode, **result}
                row["loadavg"] = os.getloadavg()[0]
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def summarize(rows: list[dict[str, Any]]) -> None:
    print(f"\n{'server':<16} {'mode':<8} {'median/s':>10} {'best/s':>10}  rounds")
    seen: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        if "failed" not in row:
            seen.setdefault((row["server"], row["mode"]), []).append(row["jobs_per_s"])
    for (name, mode), rates in seen.items():
        print(
            f"{name:<16} {mode:<8} {statistics.median(rates):>10,.0f} {max(rates):>10,.0f}"
            f"  {len(rates)}"
        )
    for name, mode in sorted({(row["server"], row["mode"]) for row in rows}):
        spent = [
            row["server_cpu_us_per_job"]
            for row in rows
            if (row["server"], row["mode"]) == (name, mode) and "failed" not in row
        ]
        if spent:
            print(f"{name} {mode}: server CPU per job (median) {statistics.median(spent):.1f} us")
    costs = [row for row in rows if "pg_cpu_us_per_job" in row and "failed" not in row]
    for name, mode in sorted({(row["server"], row["mode"]) for row in costs}):
        of_mode = [row for row in costs if (row["server"], row["mode"]) == (name, mode)]
        if of_mode:
            print(
                f"{name} {mode}: per job (median of {len(of_mode)})"
                + "".join(
                    f", {key.removeprefix('pg_').removesuffix('_per_job')}"
                    f" {statistics.median(row[key] for row in of_mode):.2f}"
                    for key in ("pg_commits_per_job", "pg_wal_bytes_per_job", "pg_cpu_us_per_job")
                )
            )


def replay(args: argparse.Namespace, binary: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="replay-", dir=args.tmp) as tmp:
        workdir = Path(tmp)
        with server("sqlite-batch", workdir) as (port, _):
            filled = gearbench(binary, port, "--mode", "enqueue", "--jobs", str(args.replay))
        print("filled:", json.dumps(filled), flush=True)
        size = sum(path.stat().st_size for path in workdir.glob("jobs.db*"))
        started = time.monotonic()
        with server("sqlite-batch", workdir, "--verbose", "INFO") as (port, proc):
            listening = time.monotonic() - started
            rss = next(
                int(line.split()[1]) // 1024
                for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
                if line.startswith("VmRSS:")
            )
        log = (workdir / "server.log").read_text()
        match = re.search(r"restored (\d+) jobs from the store in ([\d.]+)s", log)
        restored = f"{match[1]} jobs in {match[2]}s" if match else "no replay logged"
        print(
            f"replay: {restored}; process start to listening {listening:.2f}s;"
            f" file {size / 2**20:.0f} MiB; RSS after replay {rss} MiB"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", default=",".join(DEFAULT_SERVERS))
    parser.add_argument("--pg", default=PG, help="database of the postgresql server's runs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--slow-jobs", type=int, default=20_000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--pipeline", type=int, default=64)
    parser.add_argument("--replay", type=int, default=1_000_000, help="0: skip")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--tmp", default=None, help="directory for the database files")
    args = parser.parse_args()
    binary = build_gearbench()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}", flush=True)
    if not args.skip_throughput:
        summarize(throughput(args, binary))
    if args.replay:
        replay(args, binary)


if __name__ == "__main__":
    main()
