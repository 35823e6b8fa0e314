"""End to end: no-op jobs through jobwire's Python SDK vs Dramatiq, Celery, RQ and arq.

    make bench-e2e                                   # creates bench/.venv-peers, runs all
    .venv/bin/python bench/e2e.py                    # the same (creates the peers' venv too)
    .venv/bin/python bench/e2e.py --quick            # 2,000 jobs, 500 round trips
    .venv/bin/python bench/e2e.py --systems jobwire-memory,jobwire-sqlite --repeat 3
    .venv/bin/python bench/e2e.py --list             # the systems and how each is set up

Every system gets the same workload and 16 worker slots, each worker in its own subprocess
(own session, killed on exit), a fresh jobwire server on a free port (memory store or the
default SQLite store) or the machine's Redis (127.0.0.1:6379, a dedicated database: --redis-db,
default 13, flushed before and after each run and never touched otherwise; the script refuses
to start if that database is not empty) or RabbitMQ (127.0.0.1:5672, guest/guest; the run's
queues are purged before and deleted after).

1. warm-up: 200 jobs, run to completion, not measured (workers connected and imported).
2. throughput: a client process enqueues `--jobs` no-op jobs (20,000) the library's usual way
   while the workers run them; jobs/s = jobs / (first submit .. last completion).
   `enqueue/s` is how fast the client got them all in.
3. round trip: one client submits a job and waits for its result, `--latency-jobs` times (2,000)
   in a row or until `--latency-budget` seconds (30) have passed; p50/p99 of the round trip.

Completions are seen without adding broker traffic: each no-op task calls `record()`, which
bumps a per-process counter and timestamp (CLOCK_MONOTONIC, comparable across processes) in a
16-byte shared-memory file that this script polls. `cpu us/job` is the CPU time (user + system)
of everything that ran the throughput phase (client, workers with their children, the jobwire
server or the broker process: redis-server / beam.smp, which are machine-wide, so other users of
Redis or RabbitMQ count too), divided by the jobs: the steadier figure on a busy machine;
`worker` and `broker` are those two parts of it (`broker` is the jobwire server for jobwire).
`--profile` runs py-spy (from .venv) on the workers, the server and the client of both phases
and prints the top functions (raw stacks in bench/out/e2e/SYSTEM-RUN/profile-*.txt).
Measurement, not a test: nothing asserts on time. Raw rows go to bench/out/e2e.jsonl, worker
logs to bench/out/e2e/.

Clients, workers and result waits, per system, are listed by `--list` (SYSTEMS below).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import mmap
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import Processes, ensure_venv

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
OUT = BENCH / "out"
PEERS_VENV = BENCH / ".venv-peers"
PEERS_PYTHON = PEERS_VENV / "bin" / "python"
#: arq 0.28 needs redis<6; kombu's redis extra from 5.6 on needs redis>=6.4: hence Celery 5.5.
PEER_REQUIREMENTS = [
    "dramatiq[rabbitmq,redis]==2.2.1",
    "celery[redis]==5.5.3",
    "kombu[redis]==5.5.4",
    "redis[hiredis]==5.2.1",
    "rq==3.0.0",
    "arq==0.28.0",
]
REDIS = ("127.0.0.1", 6379)
RABBITMQ = ("127.0.0.1", 5672)
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
QUEUE = "jobwire_e2e"
SLOTS = 16
WARMUP = 200
POLL = 0.01

# ---------------------------------------------------------------------------- completions

_SLOT = struct.Struct("<qd")  # completions, CLOCK_MONOTONIC of the last one
_recorder: tuple[int, mmap.mmap] | None = None


def _open_slot() -> mmap.mmap:
    directory = Path(os.environ["E2E_COUNTERS"])
    by_parent = os.environ.get("E2E_KEY_BY_PARENT") == "1"  # rq: one forked horse per job
    key = os.getppid() if by_parent else os.getpid()
    fd = os.open(directory / f"{key}.slot", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if os.fstat(fd).st_size < _SLOT.size:
            os.ftruncate(fd, _SLOT.size)
        return mmap.mmap(fd, _SLOT.size)
    finally:
        os.close(fd)


def record() -> None:
    """Count one finished job in this process's slot (called by every no-op task)."""
    global _recorder
    pid = os.getpid()
    if _recorder is None or _recorder[0] != pid:
        _recorder = (pid, _open_slot())
    slot = _recorder[1]
    _SLOT.pack_into(slot, 0, _SLOT.unpack_from(slot)[0] + 1, time.monotonic())


def read_counters(directory: Path) -> tuple[int, float]:
    """Total completions over all slots, and the latest completion time."""
    total, last = 0, 0.0
    for path in directory.glob("*.slot"):
        with contextlib.suppress(OSError, struct.error):
            count, when = _SLOT.unpack(path.read_bytes()[: _SLOT.size])
            total += count
            last = max(last, when)
    return total, last


# ---------------------------------------------------------------------------- systems


@dataclass(frozen=True)
class System:
    name: str
    family: str  # jobwire, dramatiq, celery, rq, arq
    broker: str
    client: str  # how the throughput client enqueues
    worker: str  # how the 16 slots are provided
    wait: str  # how the round-trip client waits for the result
    store: str = ""  # jobwire: memory or sqlite
    task: str = "async"  # jobwire: async def or plain def task
    links: int = 1  # jobwire experiment: the worker lists the server this many times
    processes: int = 1  # worker processes sharing the 16 slots (jobwire, dramatiq)
    loop: str = "asyncio"  # jobwire experiment: "uvloop" for the clients too (workers always)
    blocking: bool = False  # jobwire: the round trip through the blocking Client
    plain: str = ""  # jobwire: the throughput client is a plain loop ("receipt" or "wait")
    env: tuple[tuple[str, str], ...] = ()
    default: bool = True

    @property
    def needs(self) -> list[tuple[str, tuple[str, int]]]:
        if self.family == "jobwire":
            return []
        if self.name == "dramatiq-rabbitmq":
            return [("RabbitMQ", RABBITMQ), ("Redis", REDIS)]
        return [("Redis", REDIS)]


_JW_CLIENT = "AsyncClient.submit_many(background=True), 1,000 per call"
_JW_WAIT = "AsyncClient.submit (foreground: WORK_COMPLETE)"
_JW_PLAIN = "with Client(...): Client.submit_background() in a for loop (pipelined; flush on exit)"
_JW_PLAIN_WAIT = "Client.submit_background(wait=True) in a for loop (a round trip per job)"
_JW_WORKER = "Worker(concurrency=16), async def task, 1 process (Worker.run: uvloop)"
SYSTEMS: list[System] = [
    System(
        "jobwire-sqlite-plain",
        "jobwire",
        "jobwire (SQLite store, default)",
        _JW_PLAIN,
        _JW_WORKER,
        "Client.submit (blocking; foreground: WORK_COMPLETE)",
        store="sqlite",
        blocking=True,
        plain="receipt",
    ),
    System(
        "jobwire-memory-plain",
        "jobwire",
        "jobwire --store memory",
        _JW_PLAIN,
        _JW_WORKER,
        "Client.submit (blocking; foreground: WORK_COMPLETE)",
        store="memory",
        blocking=True,
        plain="receipt",
    ),
    System(
        "jobwire-sqlite-plain-wait",
        "jobwire",
        "jobwire (SQLite store, default)",
        _JW_PLAIN_WAIT,
        _JW_WORKER,
        "Client.submit (blocking; foreground: WORK_COMPLETE)",
        store="sqlite",
        blocking=True,
        plain="wait",
        default=False,
    ),
    System(
        "jobwire-memory",
        "jobwire",
        "jobwire --store memory",
        _JW_CLIENT,
        "Worker(concurrency=16), async def task, 1 process (Worker.run: uvloop)",
        _JW_WAIT,
        store="memory",
    ),
    System(
        "jobwire-sqlite",
        "jobwire",
        "jobwire (SQLite store, default)",
        _JW_CLIENT,
        "Worker(concurrency=16), async def task, 1 process (Worker.run: uvloop)",
        _JW_WAIT,
        store="sqlite",
    ),
    System(
        "jobwire-memory-blocking",
        "jobwire",
        "jobwire --store memory",
        _JW_CLIENT,
        "Worker(concurrency=16), async def task, 1 process (Worker.run: uvloop)",
        "Client.submit (blocking; foreground: WORK_COMPLETE)",
        store="memory",
        blocking=True,
    ),
    System(
        "jobwire-memory-def",
        "jobwire",
        "jobwire --store memory",
        _JW_CLIENT,
        "Worker(concurrency=16), plain def task (a thread per job), 1 process",
        _JW_WAIT,
        store="memory",
        task="sync",
        default=False,
    ),
    System(
        "jobwire-memory-4links",
        "jobwire",
        "jobwire --store memory",
        _JW_CLIENT,
        "Worker([server] * 4, concurrency=16): 4 connections, so 4 GRAB_JOBs in flight",
        _JW_WAIT,
        store="memory",
        links=4,
        default=False,
    ),
    System(
        "jobwire-sqlite-4links",
        "jobwire",
        "jobwire (SQLite store, default)",
        _JW_CLIENT,
        "Worker([server] * 4, concurrency=16): 4 connections, so 4 GRAB_JOBs in flight",
        _JW_WAIT,
        store="sqlite",
        links=4,
        default=False,
    ),
    System(
        "jobwire-memory-2proc",
        "jobwire",
        "jobwire --store memory",
        _JW_CLIENT,
        "2 processes x Worker(concurrency=8), async def task",
        _JW_WAIT,
        store="memory",
        processes=2,
        default=False,
    ),
    System(
        "jobwire-sqlite-2proc",
        "jobwire",
        "jobwire (SQLite store, default)",
        _JW_CLIENT,
        "2 processes x Worker(concurrency=8), async def task",
        _JW_WAIT,
        store="sqlite",
        processes=2,
        default=False,
    ),
    System(
        "jobwire-memory-uvloop",
        "jobwire",
        "jobwire --store memory",
        _JW_CLIENT + ", on uvloop",
        "Worker(concurrency=16), async def task, 1 process (Worker.run: uvloop)",
        _JW_WAIT + ", on uvloop",
        store="memory",
        loop="uvloop",
        default=False,
    ),
    System(
        "dramatiq-rabbitmq",
        "dramatiq",
        "RabbitMQ",
        "actor.send() in a loop",
        "dramatiq --processes 2 --threads 8 (its default on 2 CPUs)",
        "Results middleware, RedisBackend: get_result(block=True) (BRPOPLPUSH)",
        processes=2,
    ),
    System(
        "dramatiq-rabbitmq-1proc",
        "dramatiq",
        "RabbitMQ",
        "actor.send() in a loop",
        "dramatiq --processes 1 --threads 16",
        "Results middleware, RedisBackend: get_result(block=True) (BRPOPLPUSH)",
        default=False,
    ),
    System(
        "dramatiq-redis",
        "dramatiq",
        "Redis",
        "actor.send() in a loop",
        "dramatiq --processes 2 --threads 8 (its default on 2 CPUs)",
        "Results middleware, RedisBackend: get_result(block=True) (BRPOPLPUSH)",
        processes=2,
    ),
    System(
        "celery-redis",
        "celery",
        "Redis",
        "task.delay() in a loop (ignore_result=True)",
        "celery worker -P prefork -c 16",
        "Redis result backend: AsyncResult.get() (pub/sub)",
    ),
    System(
        "celery-redis-threads",
        "celery",
        "Redis",
        "task.delay() in a loop (ignore_result=True)",
        "celery worker -P threads -c 16",
        "Redis result backend: AsyncResult.get() (pub/sub)",
        default=False,
    ),
    System(
        "rq",
        "rq",
        "Redis",
        "Queue.enqueue_many, 1,000 per pipeline",
        "16 x rq worker (forks a work horse per job)",
        "job.latest_result(timeout) (XREAD BLOCK on the result stream)",
        env=(("E2E_KEY_BY_PARENT", "1"),),
    ),
    System(
        "rq-plain",
        "rq",
        "Redis",
        "Queue.enqueue() in a loop",
        "16 x rq worker -w rq.worker.SimpleWorker",
        "job.latest_result(timeout) (XREAD BLOCK on the result stream)",
        env=(("E2E_RQ_PLAIN", "1"),),
    ),
    System(
        "rq-simple",
        "rq",
        "Redis",
        "Queue.enqueue_many, 1,000 per pipeline",
        "16 x rq worker -w rq.worker.SimpleWorker",
        "job.latest_result(timeout) (XREAD BLOCK on the result stream)",
    ),
    System(
        "arq",
        "arq",
        "Redis",
        "await enqueue_job() in a loop",
        "arq worker, max_jobs=16, defaults (poll_delay 0.5 s)",
        "await job.result() (polls, default poll_delay 0.5 s)",
    ),
    System(
        "arq-poll10ms",
        "arq",
        "Redis",
        "await enqueue_job() in a loop",
        "arq worker, max_jobs=16, poll_delay=0.01",
        "await job.result(poll_delay=0.01)",
        env=(("E2E_ARQ_POLL", "0.01"),),
        default=False,
    ),
]
BY_NAME = {s.name: s for s in SYSTEMS}


# ---------------------------------------------------------------------------- processes


class Group(Processes):
    """Subprocesses started here, each in its own session: stopping one kills its whole
    process group (Celery's and Dramatiq's children too), and so does leaving the script."""

    @staticmethod
    def _killpg(proc: subprocess.Popen[bytes], sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)  # its own session: the group id is its pid

    def stop(self, proc: subprocess.Popen[bytes], grace: float = 10.0) -> int:
        """SIGTERM the leader, then SIGKILL its whole group after `grace` seconds."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(grace)
        self._killpg(proc, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        with contextlib.suppress(ValueError):
            self._procs.remove(proc)
        return proc.returncode

    def stop_all(self, procs: Sequence[subprocess.Popen[bytes]], grace: float = 10.0) -> None:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        end = time.monotonic() + grace
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.0, end - time.monotonic()))
        for proc in procs:
            self.stop(proc, grace=0)

    def kill_all(self) -> None:
        for proc in reversed(self._procs):
            self._killpg(proc, signal.SIGKILL)
        super().kill_all()


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def managed_group() -> Iterator[Group]:
    previous = {
        sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)
    }
    group = Group()
    try:
        yield group
    finally:
        group.kill_all()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds of the process and of its reaped children)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return int(fields[1]), sum(int(x) for x in fields[11:15]) / ticks


def _all_procs() -> dict[int, tuple[int, float]]:
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None:
                table[int(entry)] = stat
    return table


def tree_cpu(roots: Sequence[int]) -> float:
    """CPU seconds of `roots` and every live descendant (exited ones count in their parent)."""
    table = _all_procs()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    total, todo, seen = 0.0, list(roots), set()
    while todo:
        pid = todo.pop()
        if pid in seen or pid not in table:
            continue
        seen.add(pid)
        total += table[pid][1]
        todo.extend(children.get(pid, ()))
    return total


def machine_busy() -> float:
    """CPU seconds all CPUs spent busy since boot (/proc/stat: all but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def pids_named(*names: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if Path(f"/proc/{entry}/comm").read_text().strip() in names:
                    found.append(int(entry))
    return found


# ---------------------------------------------------------------------------- services


def reachable(address: tuple[str, int]) -> bool:
    try:
        with socket.create_connection(address, timeout=2):
            return True
    except OSError:
        return False


def redis_command(db: int, *command: str) -> str:
    """SELECT `db`, then one command with a one-line reply (+OK, :N): no client needed."""
    parts = [("SELECT", str(db)), command]
    payload = b"".join(
        f"*{len(p)}\r\n".encode() + b"".join(f"${len(a)}\r\n{a}\r\n".encode() for a in p)
        for p in parts
    )
    with socket.create_connection(REDIS, timeout=30) as sock:
        sock.sendall(payload)
        buf = b""
        while buf.count(b"\r\n") < 2:
            chunk = sock.recv(4096)
            if not chunk:
                break
            buf += chunk
    lines = buf.split(b"\r\n")
    if not lines[0].startswith(b"+OK"):
        raise RuntimeError(f"redis SELECT {db}: {lines[0]!r}")
    reply = lines[1].decode()
    if reply.startswith("-"):
        raise RuntimeError(f"redis {' '.join(command)}: {reply}")
    return reply[1:]


# ---------------------------------------------------------------------------- one run


@dataclass
class Row:
    system: System
    run: int
    jobs: int = 0
    done: int = 0
    jobs_per_s: float | None = None
    enqueue_per_s: float | None = None
    cpu_us_per_job: float | None = None
    broker_cpu_us_per_job: float | None = None
    worker_cpu_us_per_job: float | None = None
    client_cpu_us_per_job: float | None = None
    others_cores: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    rt_n: int = 0
    rt_cpu_us: float | None = None
    load1: float = 0.0
    error: str = ""
    notes: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "system"}
        return {"system": self.system.name, **out}


@dataclass
class Context:
    args: argparse.Namespace
    group: Group
    workdir: Path
    counters: Path
    server: str = ""  # jobwire: host:port

    @property
    def redis_url(self) -> str:
        return f"redis://{REDIS[0]}:{REDIS[1]}/{self.args.redis_db}"

    def env(self, system: System) -> dict[str, str]:
        # Keep a PYTHONPATH given to this script (another checkout's src/, say) after BENCH.
        given = os.environ.get("PYTHONPATH")
        env = os.environ | {
            "PYTHONPATH": os.pathsep.join([str(BENCH), *([given] if given else [])]),
            "E2E_SYSTEM": system.name,
            "E2E_COUNTERS": str(self.counters),
            "E2E_REDIS_URL": self.redis_url,
            "E2E_AMQP_URL": AMQP_URL,
            "E2E_QUEUE": QUEUE,
            "E2E_SLOTS": str(SLOTS),
        }
        env.update(system.env)
        env.pop("VIRTUAL_ENV", None)
        return env

    def worker_commands(self, system: System) -> list[list[str]]:
        peer = PEERS_VENV / "bin"
        if system.family == "jobwire":
            cmd = [sys.executable, __file__, "_jobwire", "worker", self.server]
            cmd += ["--task", system.task, "--links", str(system.links), "--loop", system.loop]
            return [[*cmd, "--slots", str(max(1, SLOTS // system.processes))]] * system.processes
        if system.family == "dramatiq":
            cmd = [str(peer / "dramatiq"), "e2e_peers", "--processes", str(system.processes)]
            return [[*cmd, "--threads", str(max(1, SLOTS // system.processes)), "--queues", QUEUE]]
        if system.family == "celery":
            pool = "threads" if system.name.endswith("threads") else "prefork"
            cmd = [str(peer / "celery"), "-A", "e2e_peers", "worker", "-P", pool]
            return [[*cmd, "-c", str(SLOTS), "-Q", QUEUE, "-l", "WARNING", "-n", "e2e@%h"]]
        if system.family == "rq":
            simple = system.name in ("rq-simple", "rq-plain")
            cls = "rq.worker.SimpleWorker" if simple else "rq.Worker"
            cmd = [str(peer / "rq"), "worker", "--url", self.redis_url, "-w", cls, QUEUE]
            return [[*cmd, "--name", f"e2e-{i}"] for i in range(SLOTS)]
        if system.family == "arq":
            return [[str(peer / "arq"), "e2e_peers.WorkerSettings"]]
        raise ValueError(system.family)

    def client_command(self, system: System, *args: str) -> list[str]:
        if system.family == "jobwire":
            cmd = [sys.executable, __file__, "_jobwire", args[0], self.server, *args[1:]]
            cmd += ["--loop", system.loop, *(["--blocking"] if system.blocking else [])]
            return [*cmd, *(["--plain", system.plain] if system.plain else [])]
        code = "import sys, e2e_peers; sys.exit(e2e_peers.main())"
        return [str(PEERS_PYTHON), "-c", code, *args]


def run_client(
    ctx: Context, system: System, *args: str, timeout: float, wrap: Sequence[str] = ()
) -> dict[str, Any]:
    proc = ctx.group.spawn(
        [*wrap, *ctx.client_command(system, *args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ctx.env(system),
        cwd=BENCH,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        ctx.group.stop(proc, grace=1)
        raise RuntimeError(f"client {args[0]} did not finish within {timeout:.0f}s") from None
    ctx.group.stop(proc)
    if proc.returncode != 0:
        tail = stderr.decode(errors="replace").strip().splitlines()[-5:]
        raise RuntimeError(f"client {args[0]} exited {proc.returncode}: " + " | ".join(tail))
    return last_json(stdout)


def last_json(stdout: bytes) -> dict[str, Any]:
    lines = [ln for ln in stdout.decode(errors="replace").splitlines() if ln.startswith("{")]
    return dict(json.loads(lines[-1])) if lines else {}


def wait_for_count(
    ctx: Context, target: int, deadline: float, workers: Sequence[subprocess.Popen[bytes]]
) -> tuple[int, float]:
    while True:
        count, last = read_counters(ctx.counters)
        if count >= target:
            time.sleep(POLL)  # a torn read of the last slot: read once more
            return read_counters(ctx.counters)
        if time.monotonic() > deadline:
            return count, last
        dead = [w for w in workers if w.poll() is not None]
        if dead:
            raise RuntimeError(f"a worker exited with status {dead[0].returncode}")
        time.sleep(POLL)


def py_spy(output: Path) -> list[str]:
    """py-spy in raw (collapsed stacks) format, not pausing the target, children too."""
    exe = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy"
    cmd = [exe, "record", "--rate", "250", "--format", "raw", "--nonblocking"]
    return [*cmd, "--subprocesses", "--output", str(output)]


_LINE = re.compile(r":\d+\)$")


def profile_summary(path: Path, top: int = 12) -> str:
    """Top functions by own samples and by samples with them on the stack."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    with contextlib.suppress(OSError):
        for line in path.read_text(errors="replace").splitlines():
            stack, _, count_text = line.rpartition(" ")
            if not stack or not count_text.isdigit():
                continue
            count = int(count_text)
            frames = [f for f in stack.split(";") if not f.startswith("process ")]
            frames = [_LINE.sub(")", f) for f in frames if not f.startswith("thread ")]
            if not frames:
                continue
            total += count
            own[frames[-1]] = own.get(frames[-1], 0) + count
            for frame in set(frames):
                inclusive[frame] = inclusive.get(frame, 0) + count
    if not total:
        return f"{path.name}: no samples"
    lines = [f"{path.name}: {total} samples"]
    for title, table_ in (("own", own), ("on stack", inclusive)):
        lines.append(f"  top {title}:")
        ranked = sorted(table_.items(), key=lambda kv: -kv[1])[:top]
        lines += [f"    {n / total:6.1%}  {frame}" for frame, n in ranked]
    return "\n".join(lines)


def start_profilers(
    enabled: bool,
    group: Group,
    workdir: Path,
    phase: str,
    labels: Sequence[str],
    pids: Sequence[int],
) -> tuple[list[subprocess.Popen[bytes]], list[str]]:
    """py-spy attached to each of `pids`, and a prefix that runs the phase's client under it."""
    if not enabled:
        return [], []
    profilers = [
        group.spawn([*py_spy(workdir / f"profile-{phase}-{label}.txt"), "--pid", str(pid)])
        for label, pid in zip(labels, pids, strict=True)
    ]
    time.sleep(1.0)  # let py-spy attach
    return profilers, [*py_spy(workdir / f"profile-{phase}-client.txt"), "--"]


def stop_profilers(group: Group, profilers: Sequence[subprocess.Popen[bytes]]) -> None:
    for profiler in profilers:
        profiler.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
    for profiler in profilers:
        with contextlib.suppress(subprocess.TimeoutExpired):
            profiler.wait(30)
        group.stop(profiler, grace=1)


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def run_system(system: System, run: int, group: Group, args: argparse.Namespace) -> Row:
    from harness import JOBWIRE_MEMORY, JOBWIRE_SQLITE, start_server, stop_server

    row = Row(system, run, jobs=args.jobs)
    workdir = OUT / "e2e" / f"{system.name}-{run}"
    shutil.rmtree(workdir, ignore_errors=True)
    counters = workdir / "counters"
    counters.mkdir(parents=True)
    ctx = Context(args, group, workdir, counters)
    server = None
    workers: list[subprocess.Popen[bytes]] = []
    logs = []
    uses_redis = system.family != "jobwire"
    try:
        if uses_redis:
            redis_command(args.redis_db, "FLUSHDB")
        if system.family == "jobwire":
            spec = JOBWIRE_MEMORY if system.store == "memory" else JOBWIRE_SQLITE
            server = start_server(group, spec, label=f"e2e{run}")
            ctx.server = f"127.0.0.1:{server.port}"
        env = ctx.env(system)
        for i, cmd in enumerate(ctx.worker_commands(system)):
            log = open(workdir / f"worker-{i}.log", "wb")  # noqa: SIM115 - closed below
            logs.append(log)
            workers.append(
                group.spawn(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=BENCH)
            )
        if system.family != "jobwire":
            run_client(ctx, system, "prepare", "--slots", str(SLOTS), timeout=120)
        warm = min(WARMUP, args.jobs)
        run_client(ctx, system, "submit", "--jobs", str(warm), timeout=120)
        count, _ = wait_for_count(ctx, warm, time.monotonic() + 120, workers)
        if count < warm:
            raise RuntimeError(f"warm-up: only {count} of {warm} jobs ran within 120s")
        time.sleep(0.5)  # let the warm-up's tail (acks, result writes) settle

        # -------- throughput
        base, _ = read_counters(counters)
        roots = [w.pid for w in workers] + ([server.pid] if server else [])
        brokers = (
            []
            if system.family == "jobwire"
            else pids_named("beam.smp")
            if system.name == "dramatiq-rabbitmq"
            else pids_named("redis-server")
        )
        if server is not None:
            brokers = [server.pid]
        labels = [f"worker{i}" for i in range(len(workers))] + ["server"] * bool(server)
        profilers, wrap = start_profilers(args.profile, group, workdir, "bulk", labels, roots)
        row.load1 = os.getloadavg()[0]
        cpu0, broker0 = tree_cpu(roots), tree_cpu(brokers)
        work0, busy0, wall0 = tree_cpu(roots[: len(workers)]), machine_busy(), time.monotonic()
        own0 = _cpu() + _children_cpu()  # this script and the client, reaped below
        client = group.spawn(
            [*wrap, *ctx.client_command(system, "submit", "--jobs", str(args.jobs))],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=BENCH,
        )
        deadline = time.monotonic() + args.deadline
        count, last = wait_for_count(ctx, base + args.jobs, deadline, workers)
        cpu1, broker1 = tree_cpu(roots), tree_cpu(brokers)
        work1 = tree_cpu(roots[: len(workers)])
        stop_profilers(group, profilers)
        try:
            stdout, stderr = client.communicate(timeout=max(5.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            group.stop(client, grace=1)
            raise RuntimeError("the submitting client did not finish") from None
        if client.returncode != 0:
            tail = stderr.decode(errors="replace").strip().splitlines()[-5:]
            raise RuntimeError(f"submit client exited {client.returncode}: " + " | ".join(tail))
        busy1, wall1, own1 = machine_busy(), time.monotonic(), _cpu() + _children_cpu()
        busy1 -= tree_cpu(roots) - cpu1 + tree_cpu(brokers) - broker1  # after the last job
        out = last_json(stdout)
        if not out:
            raise RuntimeError("the submitting client printed no result")
        row.done = count - base
        elapsed = last - out["t0"]
        row.jobs_per_s = row.done / elapsed if elapsed > 0 else None
        row.enqueue_per_s = args.jobs / (out["t_enqueued"] - out["t0"])
        if row.done and row.done >= args.jobs:
            broker_cpu = broker1 - broker0 if server is None else 0.0  # server: in roots
            ours = cpu1 - cpu0 + out["cpu_s"] + broker_cpu
            row.cpu_us_per_job = ours / row.done * 1e6
            mine = cpu1 - cpu0 + broker_cpu + own1 - own0  # the client as the kernel saw it
            row.others_cores = max(0.0, busy1 - busy0 - mine) / (wall1 - wall0)
            row.broker_cpu_us_per_job = (broker1 - broker0) / row.done * 1e6
            row.worker_cpu_us_per_job = (work1 - work0) / row.done * 1e6
            row.client_cpu_us_per_job = out["cpu_s"] / row.done * 1e6
        else:
            row.error = f"timeout: {row.done} of {args.jobs} done in {args.deadline:.0f}s"
            row.notes.append(row.error)
            return row

        # -------- round trip
        profilers, wrap = start_profilers(args.profile, group, workdir, "rt", labels, roots)
        lat = run_client(
            ctx,
            system,
            "latency",
            "--jobs",
            str(args.latency_jobs),
            "--budget",
            str(args.latency_budget),
            timeout=args.latency_budget + 120,
            wrap=wrap,
        )
        stop_profilers(group, profilers)
        samples = lat["lat_us"]
        row.rt_n = len(samples)
        if samples:
            row.p50_ms = percentile(samples, 0.50) / 1000
            row.p99_ms = percentile(samples, 0.99) / 1000
            row.rt_cpu_us = lat["cpu_s"] / len(samples) * 1e6
        return row
    except (RuntimeError, OSError) as exc:
        row.error = str(exc)
        return row
    finally:
        if args.profile:
            for path in sorted(workdir.glob("profile-*.txt")):
                row.notes.append(profile_summary(path))
        group.stop_all(workers)
        for log in logs:
            log.close()
        if server is not None:
            stop_server(group, server)
        if system.name == "dramatiq-rabbitmq":
            with contextlib.suppress(RuntimeError):
                run_client(ctx, system, "cleanup", timeout=60)
        if uses_redis:
            with contextlib.suppress(OSError, RuntimeError):
                redis_command(args.redis_db, "FLUSHDB")


# ---------------------------------------------------------------------------- jobwire roles


def _jobwire_role(argv: list[str]) -> int:
    """`e2e.py _jobwire worker|submit|latency SERVER ...`: jobwire's side, run in .venv."""
    parser = argparse.ArgumentParser(prog="e2e.py _jobwire")
    parser.add_argument("role", choices=["worker", "submit", "latency"])
    parser.add_argument("server")
    parser.add_argument("--task", choices=["async", "sync"], default="async")
    parser.add_argument("--jobs", type=int, default=0)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--budget", type=float, default=30.0)
    parser.add_argument("--warm", type=int, default=20)
    parser.add_argument("--links", type=int, default=1)
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    parser.add_argument("--slots", type=int, default=SLOTS)
    parser.add_argument("--blocking", action="store_true", help="latency: the blocking Client")
    parser.add_argument("--plain", choices=["receipt", "wait"], help="submit: a plain loop")
    args = parser.parse_args(argv)
    if args.loop == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    if args.role == "worker":
        _jobwire_worker([args.server] * args.links, args.task, args.slots)
        return 0
    if args.role == "submit" and args.plain:
        print(json.dumps(_jobwire_submit_plain(args)), flush=True)
        return 0
    if args.role == "latency" and args.blocking:
        print(json.dumps(_jobwire_latency_blocking(args)), flush=True)
        return 0
    coro = _jobwire_submit(args) if args.role == "submit" else _jobwire_latency(args)
    print(json.dumps(asyncio.run(coro)), flush=True)
    return 0


def _jobwire_worker(servers: list[str], task: str, slots: int) -> None:
    from jobwire import Job, Worker

    worker = Worker(servers, concurrency=slots)
    if task == "async":

        async def noop(job: Job) -> bytes:
            record()
            return b""

        worker.add_task("noop", noop)
    else:

        def noop_sync(job: Job) -> bytes:
            record()
            return b""

        worker.add_task("noop", noop_sync)
    worker.run()


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def _jobwire_submit(args: argparse.Namespace) -> dict[str, Any]:
    from jobwire import AsyncClient

    async with AsyncClient([args.server]) as client:
        await client.status("H:e2e:none")  # opens the connection before the clock starts
        cpu0, t0 = _cpu(), time.monotonic()
        left = args.jobs
        while left:
            chunk = min(left, args.batch)
            await client.submit_many("noop", [b""] * chunk, background=True)
            left -= chunk
        return {"t0": t0, "t_enqueued": time.monotonic(), "cpu_s": _cpu() - cpu0}


def _jobwire_submit_plain(args: argparse.Namespace) -> dict[str, Any]:
    """The loop a user writes: one `submit_background` per job, with the blocking Client."""
    from jobwire import Client

    wait = args.plain == "wait"
    with Client([args.server]) as client:
        client.status("H:e2e:none")  # opens the connection before the clock starts
        cpu0, t0 = _cpu(), time.monotonic()
        submit = client.submit_background
        for _ in range(args.jobs):
            submit("noop", b"", wait=wait)
        client.flush()  # what leaving the `with` block does; timed here
        return {"t0": t0, "t_enqueued": time.monotonic(), "cpu_s": _cpu() - cpu0}


async def _jobwire_latency(args: argparse.Namespace) -> dict[str, Any]:
    from jobwire import AsyncClient

    async with AsyncClient([args.server]) as client:
        for _ in range(args.warm):
            await client.submit("noop")
        trips = RoundTrips(args)
        clock = time.perf_counter
        while trips.more():
            start = clock()
            await client.submit("noop")
            trips.took(start)
        return trips.result()


def _jobwire_latency_blocking(args: argparse.Namespace) -> dict[str, Any]:
    from jobwire import Client

    with Client([args.server]) as client:
        return time_round_trips(lambda: client.submit("noop"), args)


class RoundTrips:
    """The latency role's bookkeeping: `args.jobs` round trips, or `args.budget` seconds."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.lat: list[float] = []
        self.jobs: int = args.jobs
        self.end: float = time.monotonic() + args.budget
        self.cpu0 = _cpu()

    def more(self) -> bool:
        return len(self.lat) < self.jobs and time.monotonic() < self.end

    def took(self, start: float) -> None:
        """One round trip, started at `start` (time.perf_counter), has ended."""
        self.lat.append((time.perf_counter() - start) * 1e6)

    def result(self) -> dict[str, Any]:
        return {"lat_us": self.lat, "cpu_s": _cpu() - self.cpu0}


def time_round_trips(once: Callable[[], object], args: argparse.Namespace) -> dict[str, Any]:
    """Call `once` (one blocking round trip) `args.warm` times, then time it `args.jobs`
    times or for `args.budget` seconds; the latency role's output."""
    for _ in range(args.warm):
        once()
    trips = RoundTrips(args)
    clock = time.perf_counter
    while trips.more():
        start = clock()
        once()
        trips.took(start)
    return trips.result()


# ---------------------------------------------------------------------------- report


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(rows: Sequence[Row]) -> str:
    head = [
        "system",
        "broker / store",
        "jobs",
        "jobs/s",
        "enqueue/s",
        "cpu us/job",
        "worker",
        "broker",
        "rt p50 ms",
        "rt p99 ms",
        "rt n",
        "load1",
        "others",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [
            r.system.name + (f" #{r.run}" if r.run else ""),
            r.system.broker,
            f"{r.done:,}" if r.done else f"{r.jobs:,}",
            _fmt(r.jobs_per_s, ",.0f"),
            _fmt(r.enqueue_per_s, ",.0f"),
            _fmt(r.cpu_us_per_job, ",.0f"),
            _fmt(r.worker_cpu_us_per_job, ",.0f"),
            _fmt(r.broker_cpu_us_per_job, ",.0f"),
            _fmt(r.p50_ms, ".3f"),
            _fmt(r.p99_ms, ".3f"),
            f"{r.rt_n:,}",
            f"{r.load1:.2f}",
            _fmt(r.others_cores, ".2f"),
        ]
        if r.error:
            cells[3] = f"error: {r.error}"[:120]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(rows: Sequence[Row]) -> str:
    """Median over repeated runs of each system (when any system ran more than once)."""
    out = []
    names = dict.fromkeys(r.system.name for r in rows)
    for name in names:
        good = [r for r in rows if r.system.name == name and not r.error and r.jobs_per_s]
        if len(good) < 2:
            continue
        rates = [r.jobs_per_s for r in good if r.jobs_per_s]
        p50s = [r.p50_ms for r in good if r.p50_ms is not None]
        out.append(
            f"{name}: {len(good)} runs, jobs/s median {statistics.median(rates):,.0f} "
            f"(min {min(rates):,.0f}, max {max(rates):,.0f}); rt p50 median "
            f"{statistics.median(p50s):.3f} ms"
        )
    return "\n".join(out)


def describe() -> str:
    lines = []
    for s in SYSTEMS:
        mark = "" if s.default else "  (not in the default set)"
        lines.append(f"{s.name}{mark}\n  broker: {s.broker}\n  enqueue: {s.client}")
        lines.append(f"  worker: {s.worker}\n  round trip waits with: {s.wait}")
    return "\n".join(lines)


def main() -> int:
    global SLOTS
    if len(sys.argv) > 1 and sys.argv[1] == "_jobwire":
        return _jobwire_role(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--systems", help="comma-separated (default: all default systems)")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--latency-jobs", type=int, default=2_000)
    parser.add_argument("--latency-budget", type=float, default=30.0)
    parser.add_argument("--quick", action="store_true", help="2,000 jobs, 500 round trips")
    parser.add_argument("--repeat", type=int, default=1, help="run each system N times")
    parser.add_argument("--deadline", type=float, default=900.0, help="per throughput phase")
    parser.add_argument("--redis-db", type=int, default=13)
    parser.add_argument("--force-flush", action="store_true", help="flush a non-empty --redis-db")
    parser.add_argument(
        "--profile", action="store_true", help="py-spy both phases (bench/out/e2e/)"
    )
    parser.add_argument(
        "--slots", type=int, default=SLOTS, help="worker slots (concurrency) of every system"
    )
    parser.add_argument("--list", action="store_true", help="describe the systems and exit")
    parser.add_argument("--setup-only", action="store_true", help="create the peers' venv only")
    args = parser.parse_args()
    if args.list:
        print(describe())
        return 0
    SLOTS = args.slots
    if args.quick:
        args.jobs, args.latency_jobs = 2_000, min(args.latency_jobs, 500)
        args.latency_budget = min(args.latency_budget, 15.0)
    names = args.systems.split(",") if args.systems else [s.name for s in SYSTEMS if s.default]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        parser.error(f"unknown systems {unknown}; choose from {list(BY_NAME)}")
    systems = [BY_NAME[n] for n in names]

    skipped: list[str] = []
    usable = []
    for system in systems:
        missing = [what for what, addr in system.needs if not reachable(addr)]
        if missing:
            skipped.append(f"{system.name}: {', '.join(missing)} not reachable")
        else:
            usable.append(system)
    if any(s.family != "jobwire" for s in usable):
        ensure_venv(PEERS_VENV, PEER_REQUIREMENTS)
        size = int(redis_command(args.redis_db, "DBSIZE"))
        if size and not args.force_flush:
            raise SystemExit(
                f"Redis database {args.redis_db} holds {size} keys: not ours to flush. "
                "Pick another with --redis-db, or pass --force-flush."
            )
    if args.setup_only:
        return 0

    from harness import machine_info

    info = machine_info()
    print(
        f"# {info['cpus']} CPUs ({info['cpu']}), Python {info['python']}, "
        f"jobwire {info['jobwire_rev']}, load {info['loadavg']}, "
        f"loopback ping-pong p50 {info['wakeup_us']} us",
        flush=True,
    )
    print(f"# {args.jobs:,} no-op jobs, {SLOTS} worker slots, round trip x {args.latency_jobs:,}")
    for note in skipped:
        print(f"# skipped {note}")
    OUT.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    with managed_group() as group, open(OUT / "e2e.jsonl", "a") as jsonl:
        for run in range(args.repeat):
            for system in usable:
                row = run_system(system, run if args.repeat > 1 else 0, group, args)
                rows.append(row)
                rate = _fmt(row.jobs_per_s, ",.0f")
                p50 = _fmt(row.p50_ms, ".3f")
                status = f"error: {row.error}" if row.error else f"{rate} jobs/s, p50 {p50} ms"
                print(f"  {system.name}: {status}", flush=True)
                for note in row.notes if args.profile else ():
                    print(note, flush=True)
                record_line = {"machine": info, "args": vars(args)} | row.as_json()
                jsonl.write(json.dumps(record_line) + "\n")
                jsonl.flush()
    print()
    print(table(rows))
    extra = summary(rows)
    if extra:
        print()
        print(extra)
    print(f"\n# load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
