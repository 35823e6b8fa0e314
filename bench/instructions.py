"""Instructions per job: each server under valgrind's callgrind, driven by gearbench.

    .venv/bin/python bench/instructions.py                 # gearmand -t1 and jobwire (memory)
    .venv/bin/python bench/instructions.py --scenario fg-serial --servers jobwire-memory
    .venv/bin/python bench/instructions.py --servers jobwire-memory,jobwire-memory-http  # off, on
    PYTHONPATH=/tmp/old/src .venv/bin/python bench/instructions.py   # another checkout's src/

callgrind counts the instructions a process executes in user space, the same for the same
binary and inputs whatever else the machine is doing, so two versions of a hot path can be
compared on a noisy machine where jobs/s moves by tens of percent. It does not see the kernel
(syscalls, TCP on loopback, wake-ups): on a serial round trip that is most of the time, and
it is about the same for both servers (`bench/PERFORMANCE.md`, sixth round). Instructions are
not time either (cache misses, branch mispredictions), so use this to compare versions of
jobwire, and jobwire's user-space work with gearmand's; jobs/s comes from `bench/run.py`.

Each server runs under callgrind (about 50 times slower), takes an unmeasured warm-up run of
the scenario, has its counters zeroed (`callgrind_control -z`), runs the measured scenario,
and has its counters dumped (`callgrind_control -d`). gearmand counts all its threads. The
SQLite store's syncer and checkpoint processes are not traced: only the server's own loop.
"""

from __future__ import annotations

import argparse
import re
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness import (
    GEARMAND_T1,
    JOBWIRE_MEMORY,
    JOBWIRE_MEMORY_HTTP,
    JOBWIRE_MEMORY_METRICS,
    JOBWIRE_SQLITE,
    JOBWIRE_SQLITE_HTTP,
    JOBWIRE_SQLITE_METRICS,
    OUT,
    Processes,
    ServerSpec,
    build_gearbench,
    free_port,
    managed_processes,
    run_gearbench,
)

SERVERS = {
    spec.name: spec
    for spec in (
        GEARMAND_T1,
        JOBWIRE_MEMORY,
        JOBWIRE_SQLITE,
        JOBWIRE_MEMORY_HTTP,
        JOBWIRE_SQLITE_HTTP,
        JOBWIRE_MEMORY_METRICS,
        JOBWIRE_SQLITE_METRICS,
    )
}
START_DEADLINE = 600.0  # Python under valgrind takes a while to import and listen (more when busy)


@dataclass(frozen=True)
class Scenario:
    name: str
    args: tuple[str, ...]
    jobs: int


SCENARIOS = [
    Scenario(
        "fg-serial", ("--mode", "fg", "--clients", "1", "--workers", "1", "--pipeline", "1"), 2_000
    ),
    Scenario("enqueue", ("--mode", "enqueue", "--clients", "4"), 20_000),
    Scenario(
        "fg",
        ("--mode", "fg", "--clients", "16", "--workers", "32", "--pipeline", "16"),
        10_000,
    ),
]


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _callgrind_control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, capture_output=True)


def _total(dump: Path) -> int:
    """The instruction count of one callgrind dump (its `totals:` or `summary:` line)."""
    for line in dump.read_text(errors="replace").splitlines():
        match = re.match(r"(?:totals|summary):\s+(\d+)", line)
        if match:
            return int(match.group(1))
    raise RuntimeError(f"no totals in {dump}")


def measure(procs: Processes, gearbench: Path, spec: ServerSpec, scenario: Scenario) -> float:
    """Instructions per job of `spec` running `scenario`."""
    (OUT / "servers").mkdir(parents=True, exist_ok=True)
    workdir = Path(
        tempfile.mkdtemp(prefix=f"cg-{spec.name.replace(' ', '')}-", dir=OUT / "servers")
    )
    port = free_port()
    out = workdir / "callgrind.out"
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-instr=no"]
    server = spec.command(port, workdir)
    if spec.kind == "jobwire":
        # Count the work per job: a loop polling between requests would add its idle turns.
        server += ["--busy-poll", "0"]
    with open(workdir / "server.log", "wb") as log:
        proc = procs.spawn(
            [*cmd, *server],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=workdir,
        )
    try:
        end = time.monotonic() + START_DEADLINE
        while not _listening(port):
            if proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"{spec.name} did not start under valgrind (see {workdir})")
            time.sleep(0.2)
        timeout = 600.0
        warm = run_gearbench(
            procs,
            gearbench,
            port,
            [*scenario.args, "--jobs", str(scenario.jobs // 4)],
            timeout=timeout,
        )
        if not warm.ok:
            raise RuntimeError(f"warm-up failed: {warm.stderr or warm.data}")
        _callgrind_control("-z", str(proc.pid))
        run = run_gearbench(
            procs, gearbench, port, [*scenario.args, "--jobs", str(scenario.jobs)], timeout=timeout
        )
        if not run.ok:
            raise RuntimeError(f"run failed: {run.stderr or run.data}")
        _callgrind_control("-d", str(proc.pid))
        dumps = sorted(workdir.glob("callgrind.out.*"), key=lambda p: p.stat().st_mtime)
        if not dumps:
            raise RuntimeError(f"callgrind wrote no dump in {workdir}")
        return _total(dumps[-1]) / scenario.jobs
    finally:
        procs.stop(proc)
        for path in workdir.glob("jobwire.db*"):
            path.unlink(missing_ok=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", default="gearmand -t1,jobwire-memory")
    parser.add_argument(
        "--scenario", action="append", choices=[s.name for s in SCENARIOS], default=None
    )
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    specs = [SERVERS[name.strip()] for name in args.servers.split(",")]
    scenarios = [s for s in SCENARIOS if args.scenario is None or s.name in args.scenario]
    gearbench = build_gearbench()
    rows: list[tuple[str, int, str, float]] = []
    with managed_processes() as procs:
        for scenario in scenarios:
            for spec in specs:
                per_job = measure(procs, gearbench, spec, scenario)
                rows.append((scenario.name, scenario.jobs, spec.name, per_job))
                print(
                    f"  {scenario.name:<10} {spec.name:<16} {per_job:>10,.0f} instr/job", flush=True
                )
    print()
    print(f"{'scenario':<10} {'jobs':>7}  {'server':<16} {'instr/job':>10}  x gearmand")
    for scenario_name, jobs, server, per_job in rows:
        base = next(
            (p for s, _, name, p in rows if s == scenario_name and name.startswith("gearmand")),
            None,
        )
        ratio = f"{per_job / base:.2f}" if base else "-"
        print(f"{scenario_name:<10} {jobs:>7,}  {server:<16} {per_job:>10,.0f}  {ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
