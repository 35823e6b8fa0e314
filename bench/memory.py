"""Resident memory per queued job: jobwire vs gearmand.

    .venv/bin/python bench/memory.py                 # 1,000,000 jobs, 100-byte payloads
    .venv/bin/python bench/memory.py --jobs 200000 --servers jobwire-memory

For each server: start it fresh, read VmRSS from /proc/PID/status, queue `--jobs` background
jobs with unique ids and no workers (`gearbench --mode enqueue --unique --payload 100`), read
VmRSS again, and divide the growth by the number of jobs the admin `status` reports queued.
gearmand runs with its default thread count. Results also go to bench/out/memory.jsonl.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from harness import (
    GEARMAND_DEFAULT,
    JOBWIRE_MEMORY,
    JOBWIRE_SQLITE,
    OUT,
    ServerSpec,
    ServerUnavailable,
    admin_status,
    build_gearbench,
    machine_info,
    managed_processes,
    rss_kib,
    run_gearbench,
    start_server,
    stop_server,
    use_jobwire_rev,
)

SPECS = {s.name: s for s in (GEARMAND_DEFAULT, JOBWIRE_MEMORY, JOBWIRE_SQLITE)}
SETTLE = 1.0  # seconds to let a server finish start-up / its last writes before reading RSS


def measure(
    procs: Any,
    gearbench: Any,
    spec: ServerSpec,
    jobs: int,
    payload: int,
    clients: int,
    timeout: float,
) -> dict[str, Any]:
    row: dict[str, Any] = {"server": spec.name, "jobs": jobs, "payload": payload}
    try:
        server = start_server(procs, spec, "memory")
    except ServerUnavailable as exc:
        return row | {"error": f"unavailable: {exc}"}
    try:
        time.sleep(SETTLE)
        before = rss_kib(server.pid)
        args = ["--mode", "enqueue", "--unique", "--payload", str(payload)]
        args += ["--clients", str(clients), "--jobs", str(jobs)]
        result = run_gearbench(procs, gearbench, server.port, args, timeout=timeout)
        time.sleep(SETTLE)
        after = rss_kib(server.pid)
        queued = admin_status(server.port).get("bench", (0, 0, 0))[0]
        row |= {
            "rss_before_kib": before,
            "rss_after_kib": after,
            "queued": queued,
            "enqueue_s": result.data.get("seconds"),
            "enqueue_jobs_per_s": result.data.get("jobs_per_s"),
            "complete": result.ok,
        }
        if queued:
            row["bytes_per_job"] = (after - before) * 1024 / queued
        if not result.ok:
            row["error"] = f"enqueue incomplete: {result.data.get('jobs', 0)}/{jobs}"
        return row
    finally:
        stop_server(procs, server)


def render(rows: list[dict[str, Any]]) -> str:
    header = ["server", "queued", "enqueue s", "jobs/s", "RSS before", "RSS after", "bytes/job"]
    header.append("x gearmand")
    base = next((r.get("bytes_per_job") for r in rows if r["server"] == "gearmand"), None)
    body: list[list[str]] = []
    for r in rows:
        if "rss_after_kib" not in r:
            body.append([r["server"], "-", "-", "-", "-", "-", "-", r.get("error", "")])
            continue
        per = r.get("bytes_per_job")
        ratio = (
            "base" if r["server"] == "gearmand" else (f"{per / base:.2f}" if per and base else "-")
        )
        body.append(
            [
                r["server"],
                f"{r['queued']:,}",
                f"{r['enqueue_s']:.1f}" if r.get("enqueue_s") is not None else "-",
                f"{r['enqueue_jobs_per_s']:,.0f}" if r.get("enqueue_jobs_per_s") else "-",
                f"{r['rss_before_kib'] / 1024:,.1f} MiB",
                f"{r['rss_after_kib'] / 1024:,.1f} MiB",
                f"{per:,.0f}" if per else "-",
                ratio + (f"  ({r['error']})" if r.get("error") else ""),
            ]
        )
    widths = [max(len(x) for x in col) for col in zip(header, *body, strict=True)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i in (0, 7) else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([line(header), "  ".join("-" * w for w in widths), *map(line, body)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--payload", type=int, default=100, help="payload bytes per job")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument(
        "--servers",
        default="gearmand,jobwire-memory",
        help=f"comma-separated: {', '.join(SPECS)}",
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="gearbench --timeout, s")
    parser.add_argument(
        "--jobwire-rev",
        metavar="REV",
        help="serve jobwire from this commit's src/ (git archive) instead of the working tree",
    )
    args = parser.parse_args(argv)
    specs: list[ServerSpec] = []
    for name in (n.strip() for n in args.servers.split(",") if n.strip()):
        if name not in SPECS:
            raise SystemExit(f"unknown server {name!r}: choose from {', '.join(SPECS)}")
        specs.append(SPECS[name])

    gearbench = build_gearbench()
    info = machine_info()
    if args.jobwire_rev:
        info["jobwire_rev"] = use_jobwire_rev(args.jobwire_rev) + " (exported commit)"
    print(
        "machine: {cpus} CPUs, {cpu}, Linux {kernel}, Python {python}, jobwire {jobwire_rev}, "
        "{gearmand}; load average {loadavg}".format(**info),
        flush=True,
    )
    rows: list[dict[str, Any]] = []
    dest = OUT / "memory.jsonl"
    with dest.open("w") as sink, managed_processes() as procs:
        sink.write(json.dumps({"type": "meta", **info, "argv": sys.argv[1:]}) + "\n")
        for spec in specs:
            print(f"  {spec.name}: queueing {args.jobs:,} unique jobs ...", flush=True)
            row = measure(
                procs, gearbench, spec, args.jobs, args.payload, args.clients, args.timeout
            )
            sink.write(json.dumps({"type": "memory", **row}) + "\n")
            sink.flush()
            rows.append(row)
    print()
    print(f"RSS per queued job ({args.jobs:,} jobs, {args.payload}-byte payloads, unique ids):")
    print(render(rows))
    print(f"\nraw results: {dest}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\ninterrupted; all servers stopped", file=sys.stderr)
        sys.exit(130)
