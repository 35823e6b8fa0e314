"""Run the gearbench scenarios against gearmand and jobwire in one run; print one table.

    make bench                                  # everything, full job counts
    .venv/bin/python bench/run.py --quick       # smaller counts, under two minutes
    .venv/bin/python bench/run.py --scenario drain --servers gearmand,jobwire-memory
    .venv/bin/python bench/run.py --scenario fg --servers jobwire-memory --profile

Every scenario gets a fresh server process (so queues start empty) on a free port. gearmand
runs with its default thread count and with `-t 1`; the ratio column divides jobwire's
jobs/s by gearmand's best of the two. Raw gearbench JSON lines (annotated with server and
scenario) go to bench/out/results.jsonl. Measurement, not a test: nothing asserts on time.

Columns: jobs/s and latency as gearbench reports them; `x gearmand` is jobwire's jobs/s over
gearmand's best; `cpu us/job` is the server's CPU time (all threads, user + system, from
/proc/PID/stat) per job over the measured phase: the steadier figure when the machine is
busy. The JSON lines also carry read()/write() syscalls per job from /proc/PID/io (only
read/write/readv/writev count there: gearmand's send()/recv() on sockets do not, so compare
those across jobwire runs only).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from harness import (
    GEARMAND_DEFAULT,
    GEARMAND_T1,
    JOBWIRE_MEMORY,
    JOBWIRE_MEMORY_HTTP,
    JOBWIRE_MEMORY_METRICS,
    JOBWIRE_MEMORY_PURE,
    JOBWIRE_SQLITE,
    JOBWIRE_SQLITE_HTTP,
    JOBWIRE_SQLITE_METRICS,
    OUT,
    BenchResult,
    Processes,
    Server,
    ServerSpec,
    ServerUnavailable,
    build_gearbench,
    machine_info,
    managed_processes,
    proc_counters,
    run_gearbench,
    start_server,
    stop_server,
    use_jobwire_rev,
)


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str
    args: tuple[str, ...]
    jobs: int
    quick_jobs: int
    #: An unmeasured gearbench run before the measured one (drain needs a full queue).
    prepare: tuple[str, ...] = ()


SCENARIOS: list[Scenario] = [
    Scenario(
        "enqueue",
        "SUBMIT_JOB_BG, 4 clients x 64 pipelined, no workers",
        ("--mode", "enqueue", "--clients", "4"),
        300_000,
        100_000,
    ),
    Scenario(
        "enqueue-unique",
        "as enqueue, every job with its own unique id",
        ("--mode", "enqueue", "--clients", "4", "--unique"),
        300_000,
        100_000,
    ),
    Scenario(
        "drain",
        "16 workers run an already-queued backlog",
        ("--mode", "drain", "--workers", "16"),
        300_000,
        100_000,
        prepare=("--mode", "enqueue", "--clients", "4"),
    ),
    Scenario(
        "bg",
        "4 clients submit background jobs while 16 workers run them",
        ("--mode", "bg", "--clients", "4", "--workers", "16"),
        300_000,
        60_000,
    ),
    Scenario(
        "fg",
        "SUBMIT_JOB, 16 clients x 16 pipelined, 32 workers",
        ("--mode", "fg", "--clients", "16", "--workers", "32", "--pipeline", "16"),
        200_000,
        50_000,
    ),
    Scenario(
        "fg-serial",
        "one client, one worker, one job at a time: round-trip latency",
        ("--mode", "fg", "--clients", "1", "--workers", "1", "--pipeline", "1"),
        20_000,
        5_000,
    ),
]
SCENARIO_NAMES = [s.name for s in SCENARIOS]
SERVER_GROUPS = ["gearmand", "jobwire-memory", "jobwire-sqlite"]
#: Also accepted by --servers: jobwire-memory with the hot modules' pure-Python sources, and
#: both stores with the HTTP listener on (metrics and the event log: "-http"; metrics without
#: the event log: "-metrics"), for the on/off comparison.
JOBWIRE_SPECS = {
    spec.name: spec
    for spec in (
        JOBWIRE_MEMORY,
        JOBWIRE_SQLITE,
        JOBWIRE_MEMORY_PURE,
        JOBWIRE_MEMORY_HTTP,
        JOBWIRE_SQLITE_HTTP,
        JOBWIRE_MEMORY_METRICS,
        JOBWIRE_SQLITE_METRICS,
    )
}
EXTRA_GROUPS = [name for name in JOBWIRE_SPECS if name not in SERVER_GROUPS]


@dataclass
class Row:
    scenario: str
    server: str
    result: BenchResult | None = None
    note: str = ""
    runs: list[float] = field(default_factory=list)

    @property
    def jobs_per_s(self) -> float | None:
        return self.result.jobs_per_s if self.result and self.result.ok else None


# ---------------------------------------------------------------------------- profiling


def py_spy_path() -> str:
    local = Path(sys.executable).parent / "py-spy"
    if local.exists():
        return str(local)
    found = shutil.which("py-spy")
    if not found:
        raise SystemExit("--profile needs py-spy: .venv/bin/pip install py-spy")
    return found


def start_profiler(
    procs: Processes, server: Server, dest: Path, native: bool
) -> subprocess.Popen[bytes]:
    # No --idle: samples of the thread waiting in epoll are dropped, so percentages are of
    # the time the server was busy (or runnable but preempted: the machine has 2 cores).
    cmd = [py_spy_path(), "record", "--pid", str(server.pid), "--rate", "200"]
    if native:
        cmd.append("--native")  # C frames too: uvloop, socket syscalls
    cmd += ["--format", "raw", "--output", str(dest)]
    log = open(dest.with_suffix(".log"), "wb")  # noqa: SIM115 - owned by the process
    proc = procs.spawn(cmd, stdout=log, stderr=subprocess.STDOUT)
    time.sleep(1.0)  # let it attach before the load starts
    return proc


def stop_profiler(procs: Processes, proc: subprocess.Popen[bytes]) -> None:
    """py-spy writes its output on SIGINT."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(60)
    procs.stop(proc, grace=5)


def _frame_key(frame: str) -> str:
    """`func (path/to/file.py:123)` -> `func (file.py)`; shorter paths, no line numbers."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("site-packages/", "/src/", "lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{name} ({path})" if path else name


def _line_key(frame: str) -> str:
    """`func (path/to/file.py:123)` -> `file.py:123 func`."""
    name, _, where = frame.partition(" (")
    path = _frame_key(frame).partition(" (")[2].rstrip(")")
    line = where.rstrip(")").rsplit(":", 1)[-1]
    return f"{path}:{line} {name}"


def summarise_profile(raw: Path, top: int = 15) -> str:
    """Self and inclusive time per function from py-spy's collapsed-stack (raw) output."""
    own: Counter[str] = Counter()
    own_lines: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_frame_key(f) for f in stack.split(";") if f]
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        own_lines[_line_key(stack.rsplit(";", 1)[-1])] += count
        for key in set(frames):
            inclusive[key] += count
    if not total:
        return f"{raw}: no samples"
    lines = [f"{raw.name}: {total} samples"]
    lines.append("  self %   function")
    for key, count in own.most_common(top):
        lines.append(f"  {100 * count / total:6.1f}   {key}")
    lines.append("  self %   line")
    for key, count in own_lines.most_common(top):
        lines.append(f"  {100 * count / total:6.1f}   {key}")
    lines.append("  total %  function (inclusive)")
    for key, count in inclusive.most_common(top + 10):
        lines.append(f"  {100 * count / total:6.1f}   {key}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- running


def server_specs(groups: list[str], gearmand_threads: list[str]) -> list[ServerSpec]:
    specs: list[ServerSpec] = []
    for group in groups:
        if group == "gearmand":
            for threads in gearmand_threads:
                if threads == "default":
                    specs.append(GEARMAND_DEFAULT)
                elif threads == "1":
                    specs.append(GEARMAND_T1)
                else:
                    specs.append(ServerSpec(f"gearmand -t{threads}", "gearmand", int(threads)))
        elif group in JOBWIRE_SPECS:
            specs.append(JOBWIRE_SPECS[group])
        else:
            choices = ", ".join(SERVER_GROUPS + EXTRA_GROUPS)
            raise SystemExit(f"unknown server {group!r}: choose from {choices}")
    return specs


def record(sink: IO[str], scenario: str, server: str, phase: str, result: BenchResult) -> None:
    line: dict[str, Any] = {"type": "result", "scenario": scenario, "server": server}
    line |= {"phase": phase, "returncode": result.returncode, **result.data}
    if result.stderr:
        line["stderr"] = result.stderr[-2000:]
    line["command"] = result.args
    sink.write(json.dumps(line) + "\n")
    sink.flush()


def run_one(
    procs: Processes,
    gearbench: Path,
    scenario: Scenario,
    spec: ServerSpec,
    jobs: int,
    timeout: float,
    sink: IO[str],
    profile: str | None,
) -> Row:
    row = Row(scenario.name, spec.name)
    try:
        server = start_server(procs, spec, scenario.name)
    except ServerUnavailable as exc:
        row.note = f"unavailable: {exc}"
        sink.write(
            json.dumps(
                {
                    "type": "unavailable",
                    "scenario": scenario.name,
                    "server": spec.name,
                    "reason": str(exc),
                }
            )
            + "\n"
        )
        return row
    profiler = None
    try:
        n = ["--jobs", str(jobs)]
        if scenario.prepare:
            prep = run_gearbench(
                procs, gearbench, server.port, [*scenario.prepare, *n], timeout=timeout
            )
            record(sink, scenario.name, spec.name, "prepare", prep)
            if not prep.ok:
                row.result = prep
                row.note = "prepare (enqueue) did not complete"
                return row
        if profile and spec.kind == "jobwire":
            kind = "native" if profile == "native" else "python"
            dest = OUT / f"profile-{scenario.name}-{spec.name}-{kind}.txt"
            profiler = start_profiler(procs, server, dest, native=profile == "native")
        before = proc_counters(server.pid)
        result = run_gearbench(procs, gearbench, server.port, [*scenario.args, *n], timeout=timeout)
        after = proc_counters(server.pid)
        done = int(result.data.get("jobs") or 0)
        if before and after and done:
            used = after - before
            result.data["server_cpu_us_per_job"] = round(used.cpu_s * 1e6 / done, 2)
            result.data["server_reads_per_job"] = round(used.syscr / done, 4)
            result.data["server_writes_per_job"] = round(used.syscw / done, 4)
        if profiler is not None:
            stop_profiler(procs, profiler)
            profiler = None
            summary = summarise_profile(dest)
            dest.with_suffix(".summary.txt").write_text(summary + "\n")
            print(summary, flush=True)
        record(sink, scenario.name, spec.name, "measure", result)
        row.result = result
        if not result.ok:
            done = result.data.get("jobs", 0)
            row.note = f"incomplete: {done}/{jobs} jobs (exit {result.returncode})"
            if result.stderr:
                row.note += f": {result.stderr.splitlines()[-1][:80]}"
        if server.proc.poll() is not None:
            row.note = (row.note + "; " if row.note else "") + "server died: " + server.log_tail(1)
        return row
    finally:
        if profiler is not None:
            stop_profiler(procs, profiler)
        code = stop_server(procs, server)
        if code not in (0, -signal.SIGTERM) and not row.note:
            row.note = f"server exit status {code}"


def fmt_rate(value: float | None) -> str:
    return f"{value:,.0f}" if value is not None else "-"


def fmt_ms(row: Row, key: str) -> str:
    if row.result is None or key not in row.result.data:
        return "-"
    return f"{float(row.result.data[key]):.3f}"


def fmt_num(row: Row, key: str, digits: int) -> str:
    if row.result is None or key not in row.result.data:
        return "-"
    return f"{float(row.result.data[key]):.{digits}f}"


def render_table(rows: list[Row], scenarios: list[Scenario], jobs: dict[str, int]) -> str:
    header = ["scenario", "jobs", "server", "jobs/s", "p50 ms", "p99 ms", "x gearmand"]
    header += ["cpu us/job", "note"]
    body: list[list[str]] = []
    for scenario in scenarios:
        mine = [r for r in rows if r.scenario == scenario.name]
        gear = [r for r in mine if r.server.startswith("gearmand") and r.jobs_per_s]
        best = max(gear, key=lambda r: r.jobs_per_s or 0.0) if gear else None
        base = best.jobs_per_s if best else None
        for i, r in enumerate(mine):
            if r.server.startswith("gearmand"):
                ratio = "best" if r is best else ""
            elif r.jobs_per_s and base:
                ratio = f"{r.jobs_per_s / base:.2f}"
            else:
                ratio = "-"
            rate = fmt_rate(r.jobs_per_s)
            if r.jobs_per_s is None and r.result is not None and r.result.jobs_per_s:
                rate = f"({fmt_rate(r.result.jobs_per_s)})"
            if len(r.runs) > 1:
                spread = ", ".join(f"{x:,.0f}" for x in r.runs)
                r.note = (r.note + "; " if r.note else "") + f"runs: {spread}"
            first = i == 0
            body.append(
                [
                    scenario.name if first else "",
                    f"{jobs[scenario.name]:,}" if first else "",
                    r.server,
                    rate,
                    fmt_ms(r, "p50_ms"),
                    fmt_ms(r, "p99_ms"),
                    ratio,
                    fmt_num(r, "server_cpu_us_per_job", 1),
                    r.note,
                ]
            )
    widths = [max(len(x) for x in col) for col in zip(header, *body, strict=True)]
    right = {1, 3, 4, 5, 6, 7}

    def line(cells: list[str]) -> str:
        out = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(out).rstrip()

    sep = "  ".join("-" * w for w in widths[:-1]) + "  " + "-" * max(4, widths[-1])
    lines = [line(header), sep]
    previous = ""
    for cells in body:
        if cells[0] and previous:
            lines.append("")
        previous = cells[0] or previous
        lines.append(line(cells))
    return "\n".join(lines)


def render_summary(rows: list[Row], scenarios: list[Scenario]) -> str:
    lines: list[str] = []
    by = {(r.scenario, r.server): r for r in rows}
    for jw in ("jobwire-memory", "jobwire-sqlite"):
        ratios: list[tuple[str, float]] = []
        for s in scenarios:
            mine = by.get((s.name, jw))
            gear = [
                r.jobs_per_s
                for r in rows
                if r.scenario == s.name and r.server.startswith("gearmand") and r.jobs_per_s
            ]
            if mine and mine.jobs_per_s and gear:
                ratios.append((s.name, mine.jobs_per_s / max(gear)))
        if ratios:
            ahead = sum(1 for _, x in ratios if x >= 1.0)
            worst = sorted(ratios, key=lambda t: t[1])[:2]
            lines.append(
                f"{jw}: >= 1.0x gearmand on {ahead}/{len(ratios)} scenarios; worst: "
                + ", ".join(f"{n} {x:.2f}x" for n, x in worst)
            )
    mem = by.get(("enqueue", "jobwire-memory"))
    sql = by.get(("enqueue", "jobwire-sqlite"))
    if mem and sql and mem.jobs_per_s and sql.jobs_per_s:
        lines.append(
            f"durable/memory on enqueue: {sql.jobs_per_s / mem.jobs_per_s:.2f}x "
            "(target: within 2x, i.e. >= 0.50)"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smaller job counts (< 2 minutes)")
    parser.add_argument(
        "--scenario",
        action="append",
        choices=SCENARIO_NAMES,
        metavar="NAME",
        help=f"run only this scenario (repeatable): {', '.join(SCENARIO_NAMES)}",
    )
    parser.add_argument(
        "--servers",
        default=",".join(SERVER_GROUPS),
        help="comma-separated, of: " + ", ".join(SERVER_GROUPS + EXTRA_GROUPS),
    )
    parser.add_argument(
        "--gearmand-threads",
        default="default,1",
        help="gearmand -t values to try, best is the baseline (default: default,1)",
    )
    parser.add_argument("--jobs", type=int, help="override every scenario's job count")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs per scenario and server (fresh server each); best is reported",
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="gearbench --timeout, s")
    parser.add_argument(
        "--profile",
        nargs="?",
        const="python",
        choices=["python", "native"],
        help="py-spy record jobwire during the measured run into bench/out/profile-*; "
        "`--profile native` adds C frames (uvloop, syscalls); py-spy sees no Python frames "
        "inside the compiled hot modules (jobwire-memory-pure shows them)",
    )
    parser.add_argument(
        "--results",
        type=Path,
        help="raw JSON lines (default: bench/out/results.jsonl, or profile-results.jsonl "
        "with --profile)",
    )
    parser.add_argument(
        "--jobwire-rev",
        metavar="REV",
        help="serve jobwire from this commit's src/ (git archive) instead of the working tree",
    )
    args = parser.parse_args(argv)

    scenarios = [s for s in SCENARIOS if not args.scenario or s.name in args.scenario]
    groups = [g.strip() for g in args.servers.split(",") if g.strip()]
    specs = server_specs(groups, [t.strip() for t in args.gearmand_threads.split(",")])
    jobs = {s.name: args.jobs or (s.quick_jobs if args.quick else s.jobs) for s in scenarios}

    gearbench = build_gearbench()
    info = machine_info()
    if args.jobwire_rev:
        info["jobwire_rev"] = use_jobwire_rev(args.jobwire_rev) + " (exported commit)"
    print(
        "machine: {cpus} CPUs, {cpu}, Linux {kernel}, Python {python}, jobwire {jobwire_rev}, "
        "{gearmand}; load average {loadavg}; loopback ping-pong p50 {wakeup_us} us\n"
        "{jobwire_build}".format(**info),
        flush=True,
    )
    rows: list[Row] = []
    if args.results is None:
        args.results = OUT / ("profile-results.jsonl" if args.profile else "results.jsonl")
    args.results.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with args.results.open("w") as sink, managed_processes() as procs:
        sink.write(json.dumps({"type": "meta", **info, "argv": sys.argv[1:]}) + "\n")
        for scenario in scenarios:
            for spec in specs:
                best: Row | None = None
                runs: list[float] = []
                for _ in range(max(1, args.repeat)):
                    row = run_one(
                        procs,
                        gearbench,
                        scenario,
                        spec,
                        jobs[scenario.name],
                        args.timeout,
                        sink,
                        args.profile,
                    )
                    if row.jobs_per_s:
                        runs.append(row.jobs_per_s)
                    if best is None or (row.jobs_per_s or 0.0) > (best.jobs_per_s or 0.0):
                        best = row
                    if row.note.startswith("unavailable"):
                        break
                assert best is not None
                best.runs = runs
                rows.append(best)
                lat = ""
                if best.result and "p50_ms" in best.result.data:
                    lat = f"  p50 {fmt_ms(best, 'p50_ms')} ms  p99 {fmt_ms(best, 'p99_ms')} ms"
                print(
                    f"  {scenario.name:<15} {spec.name:<15} {fmt_rate(best.jobs_per_s):>12}"
                    f" jobs/s{lat}  {best.note}",
                    flush=True,
                )
    print()
    print(render_table(rows, scenarios, jobs))
    summary = render_summary(rows, scenarios)
    if summary:
        print()
        print(summary)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\n{time.monotonic() - started:.0f}s, load average now {load}; raw: {args.results}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\ninterrupted; all servers stopped", file=sys.stderr)
        sys.exit(130)
