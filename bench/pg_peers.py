"""PostgreSQL job queues side by side: jobwire on `--store postgresql://` vs pgqueuer and
procrastinate, in one run, on the local PostgreSQL.

    .venv/bin/python bench/pg_peers.py                         # 3 rounds, every system
    .venv/bin/python bench/pg_peers.py --rounds 5 --nodes 1,2,3 --json bench/out/pg_peers.json
    .venv/bin/python bench/pg_peers.py --systems jobwire --phases latency,fg --rounds 1

The peers are installed at bench time into bench/.venv-pg-peers (pinned below; never a
dependency of the project). The run creates its own database (`jobwire_pgbench_<pid>`, as the
role of `--pg`, which needs CREATEDB: `.ci/run` gives the role `jobwire` that) and drops it at
the end; every phase works in a fresh schema of it. No other database is touched.

Phases, each for every system, rounds interleaved (system order rotates per round):
  serial     --serial-jobs jobs enqueued one per call, each call waiting for its commit
             (pgqueuer `Queries.enqueue`, procrastinate `defer_async`, jobwire
             `Client.submit_background(..., wait=True)`); no workers.
  batch      --jobs jobs through the batch API, --batch per call (pgqueuer `enqueue` with
             lists, procrastinate `batch_defer_async`, jobwire `submit_many`); no workers.
  pipelined  jobwire only: a plain loop of `Client.submit_background` (pipelined) + flush.
  e2e        --jobs no-op jobs, enqueued through the batch API while one worker process with
             16 slots runs them; jobs/s from the first enqueue to the last job's start.
  latency    one job at a time on an idle worker: enqueue (serial API) to the task's start;
             the task sends its CLOCK_MONOTONIC time back over UDP. p50/p95.
  gearbench  jobwire only: the server's durable enqueue with the fast client of the Gearman
             comparisons (gearbench, C): 4 connections, 256 submits in flight each, --jobs
             x 5 jobs; the client's own CPU is small, so this is the server's and database's
             rate, where `pipelined` is the Python client's.
  fg         jobwire only: a foreground round trip (`Client.submit`, waits for the result);
             with several nodes the client talks to node 1 and the worker to the last node.

For every phase the database's cost per job is measured around the timed part: the CPU time
of the run database's backends (/proc/<pid>/stat of each pid pg_stat_activity lists for that
database, before and after; the clients keep their connections open until the second sample),
commits (`xact_commit`) and WAL bytes (`pg_current_wal_lsn`, cluster-wide: anything else
writing to this PostgreSQL meanwhile counts too). `py cpu` is the CPU of every process the
phase started (jobwire servers, workers, client), per job.

Ceilings, measured at the start of each round with psycopg (in a schema of their own): serial
single-row INSERT+COMMIT/s and rows/s of 500-row `INSERT ... SELECT unnest(...)` batches,
each with its backend's CPU, and LISTEN/NOTIFY delivery p50.

Workers: pgqueuer `QueueManager.run(max_concurrent_tasks=16, batch_size=8)` (it wants twice
the batch size in flight), procrastinate `run_worker_async(concurrency=16)` with its defaults,
jobwire `Worker(concurrency=16)`; each in one process. `--report FILE` prints the tables of a
run saved with `--json` again.

`--nodes 1,2,3` adds jobwire systems of 2 and 3 `jobwire serve` processes on the same schema;
when a node refuses to start (one node per database today), that system reports "cluster not
available" and is skipped for the rest of the run. Measurement, not a test: nothing asserts
on time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))

from e2e import Group, managed_group, percentile, read_counters, record, tree_cpu  # noqa: E402
from harness import build_gearbench, ensure_venv, free_port  # noqa: E402

PEERS_VENV = BENCH / ".venv-pg-peers"
PEERS_PYTHON = PEERS_VENV / "bin" / "python"
PEER_REQUIREMENTS = [
    "pgqueuer==1.6.0",
    "procrastinate==3.10.0",
    "asyncpg==0.32.0",
    "psycopg[binary,pool]==3.3.9",
]
PG = "postgresql://jobwire@127.0.0.1:5432"
TASK = "noop"
SLOTS = 16
E2E_WARMUP = 200
LATENCY_WARMUP = 20
DEADLINE = 900.0
PHASES = ["serial", "batch", "pipelined", "gearbench", "e2e", "latency", "fg"]
JOBWIRE_ONLY = {"pipelined", "gearbench", "fg"}
#: gearbench's connections and submits in flight on each.
GEARBENCH_CLIENTS = 4
GEARBENCH_PIPELINE = 256
DATAGRAM = struct.Struct("<d")


# ---------------------------------------------------------------------------- the task


def task_done() -> None:
    """What every system's no-op task does: count itself, and tell a latency client (if one
    listens on $PGB_NOTIFY_PORT) when it started."""
    started = time.monotonic()
    record()
    port = os.environ.get("PGB_NOTIFY_PORT")
    if port:
        global _notify_sock
        if _notify_sock is None:
            _notify_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with contextlib.suppress(OSError):
            _notify_sock.sendto(DATAGRAM.pack(started), ("127.0.0.1", int(port)))


_notify_sock: socket.socket | None = None


# ---------------------------------------------------------------------------- client roles


class Queue:
    """One system's client, synchronous: the timed loops run inside the library's own calls
    (a coroutine for the async peers, run once per phase, so no per-call loop hand-off)."""

    def serial(self, jobs: int) -> None:
        raise NotImplementedError

    def batch(self, jobs: int, size: int) -> None:
        raise NotImplementedError

    def pipelined(self, jobs: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no pipelined submission")

    def foreground(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no foreground submission")

    def close(self) -> None:
        pass


class AsyncQueue(Queue):
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    async def one(self) -> None:
        raise NotImplementedError

    async def many(self, count: int) -> None:
        raise NotImplementedError

    def serial(self, jobs: int) -> None:
        async def loop() -> None:
            for _ in range(jobs):
                await self.one()

        self.run(loop())

    def batch(self, jobs: int, size: int) -> None:
        async def loop() -> None:
            left = jobs
            while left:
                count = min(left, size)
                await self.many(count)
                left -= count

        self.run(loop())


class PgQueuerQueue(AsyncQueue):
    def __init__(self, db: str, schema: str) -> None:
        super().__init__()
        import asyncpg
        from pgqueuer.queries import Queries

        self.conn = self.run(asyncpg.connect(db, server_settings={"search_path": schema}))
        self.queries = Queries.from_asyncpg_connection(self.conn)

    def install(self) -> None:
        self.run(self.queries.install())

    async def one(self) -> None:
        await self.queries.enqueue(TASK, None)

    async def many(self, count: int) -> None:
        await self.queries.enqueue([TASK] * count, [None] * count, [0] * count)

    def close(self) -> None:
        self.run(self.conn.close())


def procrastinate_app(db: str, schema: str) -> Any:
    import procrastinate

    connector = procrastinate.PsycopgConnector(conninfo=with_schema(db, schema))
    app = procrastinate.App(connector=connector)

    @app.task(name=TASK)
    async def noop() -> None:
        task_done()

    return app


class ProcrastinateQueue(AsyncQueue):
    def __init__(self, db: str, schema: str) -> None:
        super().__init__()
        self.app = procrastinate_app(db, schema)
        self.run(self.app.open_async())
        self.task = self.app.tasks[TASK]

    def install(self) -> None:
        self.run(self.app.schema_manager.apply_schema_async())

    async def one(self) -> None:
        await self.task.defer_async()

    async def many(self, count: int) -> None:
        await self.task.batch_defer_async(*([{}] * count))

    def close(self) -> None:
        self.run(self.app.close_async())


class JobwireQueue(Queue):
    """The blocking SDK client, as a user's script would hold it."""

    def __init__(self, server: str) -> None:
        from jobwire import Client

        self.client = Client([server])
        self.client.status("H:bench:none")  # connected before the clock starts

    def serial(self, jobs: int) -> None:
        submit = self.client.submit_background
        for _ in range(jobs):
            submit(TASK, b"", wait=True)

    def pipelined(self, jobs: int) -> None:
        submit = self.client.submit_background
        for _ in range(jobs):
            submit(TASK, b"")
        self.client.flush()

    def batch(self, jobs: int, size: int) -> None:
        left = jobs
        while left:
            count = min(left, size)
            self.client.submit_many(TASK, [b""] * count, background=True)
            left -= count

    def foreground(self) -> None:
        self.client.submit(TASK)

    def close(self) -> None:
        self.client.close()


def open_queue(args: argparse.Namespace) -> Queue:
    if args.system == "pgqueuer":
        return PgQueuerQueue(args.db, args.schema)
    if args.system == "procrastinate":
        return ProcrastinateQueue(args.db, args.schema)
    return JobwireQueue(args.server[0])


def _cpu() -> float:
    times = os.times()
    return times.user + times.system


def _await_line() -> None:
    """Block until the orchestrator writes a line (its 'go' or 'bye')."""
    if not sys.stdin.readline():
        raise SystemExit("the orchestrator went away")


def _say(value: Any) -> None:
    print(json.dumps(value), flush=True)


def client_role(args: argparse.Namespace) -> None:
    """Connect (and warm up), say ready, wait for go, run the phase, report, wait for bye:
    the orchestrator samples the database while the connections are open."""
    queue = open_queue(args)
    try:
        if args.role == "install":
            queue.install()  # type: ignore[attr-defined]
            _say({"installed": True})
            return
        if args.role == "latency":
            latency_role(queue, args)
            return
        if args.role == "fg":
            fg_role(queue, args)
            return
        if args.warm:
            queue.batch(args.warm, args.batch)
        _say("ready")
        _await_line()
        cpu0, t0 = _cpu(), time.monotonic()
        if args.role == "serial":
            queue.serial(args.jobs)
        elif args.role == "pipelined":
            queue.pipelined(args.jobs)
        else:  # batch, e2e
            queue.batch(args.jobs, args.batch)
        t1 = time.monotonic()
        _say({"t0": t0, "t1": t1, "cpu_s": _cpu() - cpu0})
        _await_line()
    finally:
        queue.close()


def latency_role(queue: Queue, args: argparse.Namespace) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", args.notify_port))
    sock.settimeout(60)

    def trip() -> float:
        start = time.monotonic()
        queue.serial(1)
        (started,) = DATAGRAM.unpack(sock.recv(64))
        return started - start

    for _ in range(LATENCY_WARMUP):
        trip()
    _say("ready")
    _await_line()
    cpu0 = _cpu()
    samples = [trip() for _ in range(args.jobs)]
    _say({"lat_s": samples, "cpu_s": _cpu() - cpu0})
    _await_line()


def fg_role(queue: Queue, args: argparse.Namespace) -> None:
    for _ in range(LATENCY_WARMUP):
        queue.foreground()
    _say("ready")
    _await_line()
    cpu0 = _cpu()
    samples = []
    for _ in range(args.jobs):
        start = time.perf_counter()
        queue.foreground()
        samples.append(time.perf_counter() - start)
    _say({"lat_s": samples, "cpu_s": _cpu() - cpu0})
    _await_line()


# ---------------------------------------------------------------------------- worker roles


def worker_role(args: argparse.Namespace) -> None:
    if args.system == "pgqueuer":
        asyncio.run(pgqueuer_worker(args.db, args.schema))
    elif args.system == "procrastinate":
        app = procrastinate_app(args.db, args.schema)

        async def work() -> None:
            async with app.open_async():
                await app.run_worker_async(concurrency=SLOTS)

        asyncio.run(work())
    else:
        from jobwire import Job, Worker

        worker = Worker(args.server, concurrency=SLOTS)

        async def noop(job: Job) -> bytes:
            task_done()
            return b""

        worker.add_task(TASK, noop)
        worker.run()


async def pgqueuer_worker(db: str, schema: str) -> None:
    import asyncpg
    from pgqueuer import QueueManager
    from pgqueuer.queries import Queries

    conn = await asyncpg.connect(db, server_settings={"search_path": schema})
    manager = QueueManager(Queries.from_asyncpg_connection(conn))

    @manager.entrypoint(TASK)
    async def noop(job: Any) -> None:
        task_done()

    # pgqueuer wants at least twice the batch size in flight: 16 slots, batches of 8.
    await manager.run(max_concurrent_tasks=SLOTS, batch_size=SLOTS // 2)


def role_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="pg_peers.py _role")
    parser.add_argument("system", choices=["pgqueuer", "procrastinate", "jobwire"])
    parser.add_argument("role")
    parser.add_argument("--db", default="")
    parser.add_argument("--schema", default="")
    parser.add_argument("--server", action="append", default=[])
    parser.add_argument("--jobs", type=int, default=0)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--warm", type=int, default=0)
    parser.add_argument("--notify-port", type=int, default=0)
    args = parser.parse_args(argv)
    if args.role == "worker":
        worker_role(args)
    else:
        client_role(args)


# ---------------------------------------------------------------------------- database


def with_schema(db: str, schema: str) -> str:
    return f"{db}?options=-csearch_path%3D{schema}"


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Sample:
    wal: int
    commits: int
    backends: dict[int, float]


class Database:
    """The run's own database, created here and dropped at the end, and its costs."""

    def __init__(self, server: str) -> None:
        import psycopg

        self.server = server
        self.name = f"jobwire_pgbench_{os.getpid()}"
        with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {self.name}")
        self.url = f"{server}/{self.name}"
        self.conn = psycopg.connect(self.url, autocommit=True)
        self.schemas = 0

    @contextlib.contextmanager
    def schema(self, label: str) -> Iterator[str]:
        self.schemas += 1
        name = f"{label.replace('-', '_')}_{self.schemas}"
        self.conn.execute(f"CREATE SCHEMA {name}")
        try:
            yield name
        finally:
            self.conn.execute(f"DROP SCHEMA {name} CASCADE")

    def sample(self) -> Sample:
        row = self.conn.execute(
            "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn,"
            " (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),"
            " array(SELECT pid FROM pg_stat_activity"
            "       WHERE datname = current_database() AND pid <> pg_backend_pid())"
        ).fetchone()
        assert row is not None
        backends = {}
        for pid in row[2]:
            with contextlib.suppress(OSError):
                backends[pid] = process_cpu(pid)
        return Sample(int(row[0]), int(row[1]), backends)

    @staticmethod
    def costs(before: Sample, after: Sample, jobs: int) -> dict[str, float]:
        cpu = sum(t - before.backends.get(pid, 0.0) for pid, t in after.backends.items())
        return {
            "db_cpu_us": cpu / jobs * 1e6,
            # The second sample's own transaction is left out.
            "db_commits": (after.commits - before.commits - 1) / jobs,
            "db_wal_bytes": (after.wal - before.wal) / jobs,
        }

    def drop(self) -> None:
        import psycopg

        self.conn.close()
        with psycopg.connect(f"{self.server}/postgres", autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")


def ceilings(db: Database, seconds: float) -> dict[str, float]:
    """What this PostgreSQL does raw, now: serial INSERT+COMMIT/s, 500-row unnest rows/s,
    LISTEN/NOTIFY delivery p50."""
    import psycopg

    out: dict[str, float] = {}
    with (
        db.schema("ceiling") as schema,
        psycopg.connect(with_schema(db.url, schema), autocommit=True) as conn,
    ):
        conn.execute("CREATE TABLE t (id bigserial PRIMARY KEY, payload bytea)")
        backend = conn.info.backend_pid
        count, end = 0, time.monotonic() + seconds
        start, cpu = time.monotonic(), process_cpu(backend)
        while time.monotonic() < end:
            conn.execute("INSERT INTO t (payload) VALUES (%b)", (b"x",))
            count += 1
        out["insert_commit_per_s"] = count / (time.monotonic() - start)
        out["insert_commit_db_cpu_us"] = (process_cpu(backend) - cpu) / count * 1e6
        rows = [b"x"] * 500
        count, end = 0, time.monotonic() + seconds
        start, cpu = time.monotonic(), process_cpu(backend)
        while time.monotonic() < end:
            conn.execute("INSERT INTO t (payload) SELECT unnest(%b::bytea[])", (rows,))
            count += 500
        out["unnest500_rows_per_s"] = count / (time.monotonic() - start)
        out["unnest500_db_cpu_us_per_row"] = (process_cpu(backend) - cpu) / count * 1e6
        with psycopg.connect(db.url, autocommit=True) as listener:
            listener.execute("LISTEN pgbench_ceiling")
            delays = []
            for _ in range(200):
                start = time.perf_counter()
                conn.execute("NOTIFY pgbench_ceiling")
                for _note in listener.notifies(timeout=30, stop_after=1):
                    delays.append(time.perf_counter() - start)
            out["notify_p50_ms"] = statistics.median(delays) * 1e3
    return out


# ---------------------------------------------------------------------------- orchestration


@dataclass(frozen=True)
class System:
    name: str
    family: str  # pgqueuer, procrastinate, jobwire
    nodes: int = 1


@dataclass
class Result:
    round: int
    system: str
    phase: str
    jobs: int = 0
    per_s: float | None = None
    enqueue_per_s: float | None = None
    p50_ms: float | None = None
    p95_ms: float | None = None
    costs: dict[str, float] = field(default_factory=dict)
    load1: float = 0.0
    error: str = ""


class Unavailable(RuntimeError):
    """The system cannot run in this run at all (a cluster whose second node refuses)."""


class Phase:
    """One phase of one system in a fresh schema: its servers, workers and client."""

    def __init__(self, group: Group, db: Database, system: System, args: argparse.Namespace):
        self.group, self.db, self.system, self.args = group, db, system, args
        self.servers: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.workers: list[subprocess.Popen[bytes]] = []
        self.workdir = BENCH / "out" / "pg_peers"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.counters = self.workdir / f"counters-{os.getpid()}"
        self.counters.mkdir(exist_ok=True)
        for slot in self.counters.glob("*.slot"):
            slot.unlink()
        self.notify_port = free_udp_port()
        self.schema = ""

    # -- processes
    def python(self) -> str:
        return sys.executable if self.system.family == "jobwire" else str(PEERS_PYTHON)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("VIRTUAL_ENV", None)
        env.update(E2E_COUNTERS=str(self.counters), PGB_NOTIFY_PORT=str(self.notify_port))
        return env

    def role(self, role: str, *extra: str, servers: Sequence[str] = ()) -> list[str]:
        cmd = [self.python(), __file__, "_role", self.system.family, role]
        cmd += ["--db", self.db.url, "--schema", self.schema]
        for server in servers:
            cmd += ["--server", server]
        return [*cmd, *extra]

    def start_nodes(self) -> None:
        dsn = with_schema(self.db.url, self.schema) + "&application_name=jobwire_pgbench"
        for index in range(self.system.nodes):
            port = free_port()
            log = open(self.workdir / f"node-{index}.log", "wb")  # noqa: SIM115
            cmd = [sys.executable, "-m", "jobwire", "serve", "--port", str(port)]
            cmd += ["--http-port", "0", "--zmq-port", "0", "--store", dsn]
            proc = self.group.spawn(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env())
            log.close()
            try:
                wait_listening(proc, port, self.workdir / f"node-{index}.log")
            except RuntimeError as exc:
                if index == 0:
                    raise
                raise Unavailable(f"cluster not available: node {index + 1} {exc}") from None
            self.servers.append((f"127.0.0.1:{port}", proc))

    def start_worker(self) -> None:
        # With several nodes the worker sits on the last one, the clients on the first.
        servers = [self.servers[-1][0]] if self.servers else []
        log = open(self.workdir / f"worker-{self.system.name}.log", "wb")  # noqa: SIM115
        cmd = self.role("worker", servers=servers)
        self.workers.append(
            self.group.spawn(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env(), cwd=BENCH)
        )
        log.close()

    def client(self, role: str, *extra: str) -> Client:
        servers = [self.servers[0][0]] if self.servers else []
        cmd = self.role(role, *extra, servers=servers)
        log = self.workdir / f"client-{self.system.name}-{role}.log"
        with open(log, "wb") as stderr:
            proc = self.group.spawn(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=self.env(),
                cwd=BENCH,
            )
        return Client(proc, log)

    def pids(self) -> list[int]:
        return [proc.pid for _, proc in self.servers] + [proc.pid for proc in self.workers]

    def stop(self) -> None:
        self.group.stop_all([*self.workers, *(proc for _, proc in self.servers)])

    def install(self) -> None:
        if self.system.family != "jobwire":
            done = subprocess.run(self.role("install"), capture_output=True, env=self.env())
            if done.returncode:
                raise RuntimeError(f"install: {done.stderr.decode(errors='replace')[-800:]}")

    def completions(self) -> tuple[int, float]:
        return read_counters(self.counters)

    def wait_completions(self, target: int, deadline: float) -> tuple[int, float]:
        while True:
            count, last = self.completions()
            if count >= target or time.monotonic() > deadline:
                return count, last
            if any(proc.poll() is not None for proc in self.workers):
                log = self.workdir / f"worker-{self.system.name}.log"
                raise RuntimeError(f"the worker exited; see {log}")
            time.sleep(0.01)


class Client:
    """A client role: ready, go, its report, bye (see client_role)."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc, self.log = proc, log

    def line(self) -> Any:
        assert self.proc.stdout is not None
        text = self.proc.stdout.readline()
        if not text:
            self.proc.wait(30)
            tail = self.log.read_text(errors="replace").strip().splitlines()[-6:]
            raise RuntimeError(f"client exited {self.proc.returncode}: " + " | ".join(tail))
        return json.loads(text)

    def send(self, word: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(word.encode() + b"\n")
        self.proc.stdin.flush()

    def finish(self) -> None:
        with contextlib.suppress(BrokenPipeError):
            self.send("bye")
        self.proc.wait(60)


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_listening(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(f"refused to start (exit {proc.returncode}): " + " | ".join(tail))
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("did not listen within 120 s")
        time.sleep(0.02)


def run_phase(phase_name: str, system: System, rnd: int, ctx: Context) -> Result:
    args = ctx.args
    result = Result(rnd, system.name, phase_name, load1=os.getloadavg()[0])
    phase = Phase(ctx.group, ctx.db, system, args)
    try:
        with ctx.db.schema(system.name) as schema:
            phase.schema = schema
            try:
                if system.family == "jobwire":
                    phase.start_nodes()
                phase.install()
                measure(phase_name, phase, result)
            finally:
                phase.stop()
    except Unavailable:
        raise
    except (RuntimeError, OSError, subprocess.TimeoutExpired, json.JSONDecodeError) as exc:
        result.error = str(exc)[:500]
    return result


def measure(name: str, phase: Phase, result: Result) -> None:
    args = phase.args
    if name == "gearbench":
        measure_gearbench(phase, result)
        return
    jobs = {"serial": args.serial_jobs, "latency": args.latency_jobs, "fg": args.latency_jobs}
    result.jobs = jobs.get(name, args.jobs)
    workers = name in ("e2e", "latency", "fg")
    if workers:
        phase.start_worker()
    extra = ["--jobs", str(result.jobs), "--batch", str(args.batch)]
    if name == "e2e":
        extra += ["--warm", str(E2E_WARMUP)]
    if name == "latency":
        extra += ["--notify-port", str(phase.notify_port)]
    role = "batch" if name == "e2e" else name
    client = phase.client(role, *extra)
    try:
        if client.line() != "ready":
            raise RuntimeError("client did not say ready")
        if name == "e2e":
            count, _ = phase.wait_completions(E2E_WARMUP, time.monotonic() + 120)
            if count < E2E_WARMUP:
                raise RuntimeError(f"warm-up: {count} of {E2E_WARMUP} ran in 120 s")
            time.sleep(0.5)  # the warm-up's tail (acks, deletes) settles
        base, _ = phase.completions()
        pids = [*phase.pids(), client.proc.pid]
        py0, before = tree_cpu(pids), phase.db.sample()
        client.send("go")
        if name == "e2e":
            target = base + result.jobs
            count, last = phase.wait_completions(target, time.monotonic() + DEADLINE)
            report = client.line()
            if count < target:
                raise RuntimeError(f"timeout: {count - base} of {result.jobs} ran")
            result.per_s = result.jobs / (last - report["t0"])
            result.enqueue_per_s = result.jobs / (report["t1"] - report["t0"])
        else:
            report = client.line()
        after, py1 = phase.db.sample(), tree_cpu(pids)
        if "lat_s" in report:
            samples = report["lat_s"]
            result.p50_ms = percentile(samples, 0.50) * 1e3
            result.p95_ms = percentile(samples, 0.95) * 1e3
        elif name != "e2e":
            result.per_s = result.jobs / (report["t1"] - report["t0"])
        result.costs = Database.costs(before, after, result.jobs)
        result.costs["py_cpu_us"] = (py1 - py0) / result.jobs * 1e6
    finally:
        if client.proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                client.finish()
        phase.group.stop(client.proc, grace=5)


def measure_gearbench(phase: Phase, result: Result) -> None:
    """gearbench's enqueue against node 1 (waits for every JOB_CREATED, each after its
    commit); the database sampled around it."""
    result.jobs = phase.args.jobs * 5
    host, _, port = phase.servers[0][0].rpartition(":")
    cmd = [str(build_gearbench()), "--host", host, "--port", port, "--mode", "enqueue"]
    cmd += ["--clients", str(GEARBENCH_CLIENTS), "--pipeline", str(GEARBENCH_PIPELINE)]
    cmd += ["--jobs", str(result.jobs), "--func", TASK]
    pids = phase.pids()
    py0, before = tree_cpu(pids), phase.db.sample()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=DEADLINE)
    after, py1 = phase.db.sample(), tree_cpu(pids)
    if done.returncode:
        raise RuntimeError(f"gearbench: {done.stderr[-500:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if report.get("errors") or not report.get("complete"):
        raise RuntimeError(f"gearbench: {report}")
    result.per_s = float(report["jobs_per_s"])
    result.costs = Database.costs(before, after, result.jobs)
    result.costs["py_cpu_us"] = (py1 - py0) / result.jobs * 1e6


@dataclass
class Context:
    args: argparse.Namespace
    group: Group
    db: Database


def systems_of(args: argparse.Namespace) -> list[System]:
    out = []
    for name in args.systems.split(","):
        if name != "jobwire":
            out.append(System(name, name))
            continue
        for nodes in (int(n) for n in args.nodes.split(",")):
            out.append(System("jobwire" if nodes == 1 else f"jobwire-{nodes}n", "jobwire", nodes))
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    systems = systems_of(args)
    if any(s.family != "jobwire" for s in systems):
        ensure_venv(PEERS_VENV, PEER_REQUIREMENTS)
    phases = args.phases.split(",")
    results: list[Result] = []
    ceiling_rows: list[dict[str, float]] = []
    unavailable: dict[str, str] = {}
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}", flush=True)
    db = Database(args.pg)
    try:
        with managed_group() as group:
            ctx = Context(args, group, db)
            for rnd in range(args.rounds):
                if args.ceiling_seconds > 0:
                    ceiling_rows.append(ceilings(db, args.ceiling_seconds))
                    print(json.dumps({"round": rnd, "ceilings": ceiling_rows[-1]}), flush=True)
                order = systems[rnd % len(systems) :] + systems[: rnd % len(systems)]
                for name in phases:
                    for system in order:
                        if system.name in unavailable:
                            continue
                        if name in JOBWIRE_ONLY and system.family != "jobwire":
                            continue
                        try:
                            result = run_phase(name, system, rnd, ctx)
                        except Unavailable as exc:
                            unavailable[system.name] = str(exc)
                            print(f"{system.name}: {exc}", flush=True)
                            continue
                        results.append(result)
                        print(json.dumps(result.__dict__), flush=True)
    finally:
        db.drop()
    return {"results": results, "ceilings": ceiling_rows, "unavailable": unavailable}


# ---------------------------------------------------------------------------- report


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


CEILINGS = (
    ("insert_commit_per_s", ",.0f", "serial INSERT+COMMIT/s"),
    ("insert_commit_db_cpu_us", ".0f", "its backend CPU us"),
    ("unnest500_rows_per_s", ",.0f", "500-row unnest rows/s"),
    ("unnest500_db_cpu_us_per_row", ".1f", "backend CPU us/row"),
    ("notify_p50_ms", ".2f", "NOTIFY delivery p50 ms"),
)


def ceiling_lines(rows: list[dict[str, float]]) -> list[str]:
    lines = []
    for key, spec, label in CEILINGS:
        values = [row[key] for row in rows if key in row]
        if values:
            each = ", ".join(format(v, spec) for v in values)
            lines.append(f"  {label:<24} {format(statistics.median(values), spec):>9}  ({each})")
    return ["ceilings, median (per round):", *lines, ""] if lines else []


def medians(results: Sequence[Result]) -> dict[tuple[str, str], dict[str, float | None]]:
    """Per (system, phase): the medians over the rounds that did not fail."""
    grouped: dict[tuple[str, str], list[Result]] = {}
    for row in results:
        if not row.error:
            grouped.setdefault((row.system, row.phase), []).append(row)
    out: dict[tuple[str, str], dict[str, float | None]] = {}
    for key, rows in grouped.items():
        values: dict[str, float | None] = {
            name: _median([getattr(r, name) for r in rows])
            for name in ("per_s", "enqueue_per_s", "p50_ms", "p95_ms")
        }
        for name in rows[0].costs:
            values[name] = _median([r.costs.get(name) for r in rows])
        out[key] = values
    return out


def table(outcome: dict[str, Any]) -> str:
    results: list[Result] = outcome["results"]
    lines = ceiling_lines(outcome["ceilings"])
    head = f"{'system':<14} {'phase':<10} {'n':>3} {'jobs/s':>9} {'enq/s':>9} {'p50 ms':>7}"
    head += f" {'p95 ms':>7} {'db us/job':>9} {'jobs/commit':>11} {'WAL B/job':>9}"
    lines.append(head + f" {'py us/job':>9}  per round")
    keys: dict[tuple[str, str], list[Result]] = {}
    for row in results:
        keys.setdefault((row.system, row.phase), []).append(row)
    summary = medians(results)
    for (system, phase), rows in keys.items():
        ok = [r for r in rows if not r.error]
        if not ok:
            lines.append(f"{system:<14} {phase:<10} failed: {rows[-1].error}")
            continue
        main = "p50_ms" if phase in ("latency", "fg") else "per_s"
        spec = ".2f" if main == "p50_ms" else ",.0f"
        rounds = ", ".join(_fmt(getattr(r, main), spec) for r in ok)
        m = summary[(system, phase)]
        commits = m.get("db_commits")
        per_commit = 1 / commits if commits and commits > 0 else None
        lines.append(
            f"{system:<14} {phase:<10} {len(ok):>3} {_fmt(m['per_s'], ',.0f'):>9}"
            f" {_fmt(m['enqueue_per_s'], ',.0f'):>9} {_fmt(m['p50_ms'], '.2f'):>7}"
            f" {_fmt(m['p95_ms'], '.2f'):>7} {_fmt(m.get('db_cpu_us'), '.1f'):>9}"
            f" {_fmt(per_commit, ',.1f'):>11} {_fmt(m.get('db_wal_bytes'), ',.0f'):>9}"
            f" {_fmt(m.get('py_cpu_us'), ',.0f'):>9}  {rounds}"
            + (f"  ({len(rows) - len(ok)} failed)" if len(ok) < len(rows) else "")
        )
    for name, why in outcome["unavailable"].items():
        lines.append(f"{name:<14} {why}")
    lines += ["", *targets(summary, outcome["unavailable"]), *ratios(results)]
    return "\n".join(lines)


def ratios(results: Sequence[Result]) -> list[str]:
    """jobwire over pgqueuer within each round (the same minutes of a shared machine)."""
    by_round: dict[int, dict[tuple[str, str], float]] = {}
    for row in results:
        if not row.error and row.per_s:
            by_round.setdefault(row.round, {})[(row.system, row.phase)] = row.per_s
    enqueue, served, e2e = [], [], []
    for rates in by_round.values():
        ours = max(rates.get(("jobwire", "batch"), 0), rates.get(("jobwire", "pipelined"), 0))
        if ours and rates.get(("pgqueuer", "batch")):
            enqueue.append(f"{ours / rates[('pgqueuer', 'batch')]:.2f}")
        if rates.get(("jobwire", "gearbench")) and rates.get(("pgqueuer", "batch")):
            served.append(f"{rates[('jobwire', 'gearbench')] / rates[('pgqueuer', 'batch')]:.2f}")
        if rates.get(("jobwire", "e2e")) and rates.get(("pgqueuer", "e2e")):
            e2e.append(f"{rates[('jobwire', 'e2e')] / rates[('pgqueuer', 'e2e')]:.1f}")
    lines = []
    if enqueue:
        lines.append(f"  per round, durable enqueue / pgqueuer's batched: {', '.join(enqueue)}")
    if served:
        lines.append(f"  per round, gearbench's enqueue / pgqueuer's batched: {', '.join(served)}")
    if e2e:
        lines.append(f"  per round, end to end / pgqueuer's: {', '.join(e2e)}")
    return lines


def targets(
    summary: dict[tuple[str, str], dict[str, float | None]], unavailable: dict[str, str]
) -> list[str]:
    """Issue 36's targets against this run's medians."""

    def get(system: str, phase: str, name: str) -> float | None:
        return summary.get((system, phase), {}).get(name)

    def verdict(value: float | None, ok: bool) -> str:
        return "not measured" if value is None else ("met" if ok else "NOT met")

    lines = ["targets (issue 36), this run's medians:"]
    # jobwire's durable enqueue: the better of submit_many and the pipelined loop.
    enqueues = [v for p in ("batch", "pipelined") if (v := get("jobwire", p, "per_s"))]
    enqueue = max(enqueues, default=None)
    pgq = get("pgqueuer", "batch", "per_s")
    if enqueue is not None and pgq:
        ok = enqueue >= 2 * pgq and enqueue >= 40_000
        lines.append(
            f"  durable enqueue >= 2x pgqueuer's batched and >= 40,000/s: {enqueue:,.0f}/s ="
            f" {enqueue / pgq:.2f}x pgqueuer's {pgq:,.0f}/s: {verdict(enqueue, ok)}"
        )
    served = get("jobwire", "gearbench", "per_s")
    if served is not None and pgq:
        ok = served >= 2 * pgq and served >= 40_000
        lines.append(
            f"  the same with the C client (gearbench): {served:,.0f}/s ="
            f" {served / pgq:.2f}x: {verdict(served, ok)}"
        )
    e2e, pgq_e2e = get("jobwire", "e2e", "per_s"), get("pgqueuer", "e2e", "per_s")
    if e2e is not None and pgq_e2e:
        lines.append(
            f"  end to end >= 10x pgqueuer's: {e2e:,.0f}/s = {e2e / pgq_e2e:.1f}x"
            f" pgqueuer's {pgq_e2e:,.0f}/s: {verdict(e2e, e2e >= 10 * pgq_e2e)}"
        )
    idle = get("jobwire", "latency", "p50_ms")
    if idle is not None:
        lines.append(f"  idle enqueue->run p50 <= 1 ms: {idle:.2f} ms: {verdict(idle, idle <= 1)}")
    cross = [
        (system, value)
        for (system, phase), m in summary.items()
        if phase == "fg" and system != "jobwire" and (value := m.get("p50_ms")) is not None
    ]
    for system, value in cross:
        lines.append(
            f"  cross-node fg p50 <= 2 ms ({system}): {value:.2f} ms: {verdict(value, value <= 2)}"
        )
    if not cross:
        why = next(iter(unavailable.values()), "run with --nodes 1,2")
        lines.append(f"  cross-node fg p50 <= 2 ms: not measured ({why})")
    return lines


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_role":
        role_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg", default=PG, help="PostgreSQL server URL, without a database")
    parser.add_argument("--systems", default="pgqueuer,procrastinate,jobwire")
    parser.add_argument("--phases", default=",".join(PHASES))
    parser.add_argument("--nodes", default="1", help="jobwire cluster sizes, e.g. 1,2,3")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=20_000, help="batch, pipelined, e2e")
    parser.add_argument("--serial-jobs", type=int, default=1_000)
    parser.add_argument("--latency-jobs", type=int, default=200, help="latency and fg")
    parser.add_argument("--batch", type=int, default=1_000, help="jobs per batch call")
    parser.add_argument("--ceiling-seconds", type=float, default=2.0, help="0: no ceilings")
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument("--report", help="print the tables of a run saved with --json")
    args = parser.parse_args()
    if args.report:
        saved = json.loads(Path(args.report).read_text())
        saved["results"] = [Result(**row) for row in saved["results"]]
        print(table(saved))
        return
    outcome = run(args)
    print()
    print(table(outcome))
    if args.json:
        raw = {**outcome, "results": [r.__dict__ for r in outcome["results"]]}
        raw["args"] = vars(args)
        Path(args.json).write_text(json.dumps(raw, indent=1))


if __name__ == "__main__":
    main()
