"""The OJS HTTP path (`/ojs/v1`) against the ceiling of its own HTTP stack.

    .venv/bin/python bench/ojs_http.py                    # SQLite store (the default), 5 s each
    .venv/bin/python bench/ojs_http.py --store memory --duration 3 --repeat 3
    .venv/bin/python bench/ojs_http.py --workloads push --before /tmp/before/src

The ceiling is a hello-world handler on the same stack as jobwire's HTTP listener (aiohttp,
`AppRunner(access_log=None)`, on uvloop, in a process of its own): it reads the request body
and answers a small JSON object. Every jobwire workload is measured with the same load
generator as its ceiling, the two interleaved, `--repeat` times:

- push (one job per `POST /ojs/v1/jobs`) and push batch (`POST /ojs/v1/jobs/batch`, 100 jobs
  each): `wrk` (Debian's `wrk`, C, one thread, 16 connections) with a fixed body, against
  `wrk` on the hello-world handler. wrk is light enough that the server, not the generator, is
  what saturates.
- fetch+ack: 16 concurrent workers (asyncio tasks of an aiohttp client, one connection each,
  in a process of their own) each looping `POST /workers/fetch` (count 1), then
  `POST /workers/ack`, on a queue filled beforehand; against the same 16 tasks posting to the
  hello-world handler twice per iteration.
- round trip: one client, push -> fetch -> ack -> `GET /jobs/{id}`, one after another: p50
  and p99 of the four, against four hello-world requests in a row.

Reported: requests/s and jobs/s, the server's CPU per request (user + system from /proc, of
the server process only) and the ratio to the ceiling. The machine is shared: read the ratios
(same run, interleaved), not the absolute figures. `--profile` runs py-spy on the jobwire
server during push and prints its top functions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import free_port, machine_info, managed_processes

BENCH = Path(__file__).resolve().parent
OUT = BENCH / "out" / "ojs_http"
CONNECTIONS = 16
BATCH = 100
CONTENT_TYPE = "application/openjobspec+json"
PUSH_BODY = json.dumps({"type": "noop", "args": [1], "queue": "bench"})
WORKLOADS = ("push", "batch", "fetch-ack", "round-trip")
BATCH_BODY = json.dumps(
    {"jobs": [{"type": "noop", "args": [i], "queue": "bench"} for i in range(BATCH)]}
)

HELLO = """
import sys, orjson, uvloop
from aiohttp import web

async def hello(request):
    await request.read()
    return web.Response(body=orjson.dumps({"ok": True}), content_type="application/json")

async def main(port):
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", hello)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
    print("ready", flush=True)
    await asyncio.Event().wait()

import asyncio
uvloop.run(main(int(sys.argv[1])))
"""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_http(port: int, proc: subprocess.Popen[bytes], deadline: float = 30.0) -> None:
    import socket

    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def wrk(url: str, body: str, duration: float, workdir: Path) -> float:
    """Requests/s of `wrk` POSTing `body` to `url` with 16 connections; non-2xx count as
    errors (the run is refused)."""
    script = workdir / "post.lua"
    script.write_text(
        'wrk.method = "POST"\n'
        f"wrk.body = {json.dumps(body)}\n"
        f'wrk.headers["Content-Type"] = "{CONTENT_TYPE}"\n'
    )
    out = subprocess.run(
        ["wrk", "-t1", f"-c{CONNECTIONS}", f"-d{int(duration)}s", "-s", str(script), url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    if "Non-2xx" in out:
        raise RuntimeError(f"wrk saw error replies from {url}:\n{out}")
    match = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if not match:
        raise RuntimeError(f"no rate in wrk's output:\n{out}")
    return float(match.group(1))


# ---------------------------------------------------------------------------- aiohttp generator


async def _fetch_ack(base: str, duration: float, hello: bool) -> dict[str, Any]:
    import aiohttp

    headers = {"Content-Type": CONTENT_TYPE}
    done = 0
    end = time.monotonic() + duration

    async def worker(session: aiohttp.ClientSession, n: int) -> None:
        nonlocal done
        fetch = json.dumps({"queues": ["bench"], "count": 1, "worker_id": f"w{n}"})
        while time.monotonic() < end:
            async with session.post(base + "/ojs/v1/workers/fetch", data=fetch) as r:
                body = await r.json(content_type=None)
            if hello:
                job_id = "x"
            else:
                jobs = body.get("jobs") or []
                if not jobs:
                    raise RuntimeError("the queue ran dry: fill it with more jobs")
                job_id = jobs[0]["id"]
            ack = json.dumps({"job_id": job_id, "result": None})
            async with session.post(base + "/ojs/v1/workers/ack", data=ack) as r:
                if r.status >= 300:
                    raise RuntimeError(f"ack: {r.status} {await r.text()}")
                await r.read()
            done += 1

    connector = aiohttp.TCPConnector(limit=CONNECTIONS)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
        start = time.monotonic()
        await asyncio.gather(*(worker(session, n) for n in range(CONNECTIONS)))
        elapsed = time.monotonic() - start
    return {"jobs": done, "requests": 2 * done, "seconds": elapsed}


async def _round_trip(base: str, count: int, hello: bool) -> dict[str, Any]:
    import aiohttp

    headers = {"Content-Type": CONTENT_TYPE}
    times: list[float] = []
    async with aiohttp.ClientSession(headers=headers) as session:
        fetch = json.dumps({"queues": ["trip"], "count": 1, "worker_id": "trip"})
        push = json.dumps({"type": "noop", "args": [1], "queue": "trip"})
        for i in range(count + 20):
            start = time.perf_counter()
            async with session.post(base + "/ojs/v1/jobs", data=push) as r:
                job_id = "x" if hello else (await r.json(content_type=None))["job"]["id"]
            async with session.post(base + "/ojs/v1/workers/fetch", data=fetch) as r:
                got = await r.json(content_type=None)
                if not hello and got["jobs"][0]["id"] != job_id:
                    raise RuntimeError("fetched another job than the one pushed")
            ack = json.dumps({"job_id": job_id, "result": "done"})
            async with session.post(base + "/ojs/v1/workers/ack", data=ack) as r:
                await r.read()
            async with session.get(base + f"/ojs/v1/jobs/{job_id}") as r:
                state = (await r.json(content_type=None)) if not hello else {}
                if not hello and state["job"]["state"] != "completed":
                    raise RuntimeError(f"job {job_id} is {state['job']['state']}")
            if i >= 20:  # warm-up
                times.append((time.perf_counter() - start) * 1e6)
    return {"lat_us": times}


def generator_main(argv: list[str]) -> int:
    """`ojs_http.py _gen fetch-ack|round-trip BASE SECONDS|COUNT hello|ojs`: the aiohttp load
    generator, in its own process (on uvloop) so that its CPU is not the server's."""
    import uvloop

    kind, base, amount, target = argv
    hello = target == "hello"
    if kind == "fetch-ack":
        out = uvloop.run(_fetch_ack(base, float(amount), hello))
    else:
        out = uvloop.run(_round_trip(base, int(amount), hello))
    print(json.dumps(out))
    return 0


def generate(kind: str, base: str, amount: float, target: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "_gen", kind, base, str(amount), target],
        capture_output=True,
        text=True,
    )
    if out.returncode:
        raise RuntimeError(f"generator failed: {out.stderr.strip()[-2000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


# ---------------------------------------------------------------------------- the run


def fill(base: str, jobs: int) -> None:
    """Queue `jobs` jobs on `bench` in batches (for fetch+ack)."""
    import urllib.request

    body = BATCH_BODY.encode()
    for _ in range(jobs // BATCH):
        request = urllib.request.Request(
            base + "/ojs/v1/jobs/batch", data=body, headers={"Content-Type": CONTENT_TYPE}
        )
        with urllib.request.urlopen(request) as reply:
            reply.read()


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with managed_processes() as procs:
        workdir = Path(tempfile.mkdtemp(prefix="ojs-http-"))
        gport, hport, ceiling_port = free_port(), free_port(), free_port()
        store = "memory" if args.store == "memory" else f"sqlite:{workdir / 'jobs.db'}"
        cmd = [sys.executable, "-m", "jobwire", "serve", "-L", "127.0.0.1"]
        cmd += ["--port", str(gport), "--http-port", str(hport), "--zmq-port", "0"]
        cmd += ["--store", store]
        log = open(workdir / "server.log", "wb")  # noqa: SIM115 - closed with the process
        server = procs.spawn(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
        hello = procs.spawn(
            [sys.executable, "-c", HELLO, str(ceiling_port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        wait_http(hport, server)
        wait_http(ceiling_port, hello)
        ojs = f"http://127.0.0.1:{hport}"
        ceiling = f"http://127.0.0.1:{ceiling_port}"
        targets = {"jobwire": (server, ojs), "hello": (hello, ceiling)}
        if args.before:  # the same server from other sources (PYTHONPATH), interleaved
            bport, bhttp = free_port(), free_port()
            bstore = "memory" if args.store == "memory" else f"sqlite:{workdir / 'before.db'}"
            bcmd = [sys.executable, "-m", "jobwire", "serve", "-L", "127.0.0.1"]
            bcmd += ["--port", str(bport), "--http-port", str(bhttp), "--zmq-port", "0"]
            bcmd += ["--store", bstore]
            env = os.environ | {"PYTHONPATH": str(args.before)}
            before = procs.spawn(bcmd, stdout=log, stderr=subprocess.STDOUT, cwd=workdir, env=env)
            wait_http(bhttp, before)
            targets["before"] = (before, f"http://127.0.0.1:{bhttp}")
        order = [
            (name, targets[name][1]) for name in ("hello", "jobwire", "before") if name in targets
        ]

        def run(name: str, what: str, target: str, work: Any, per_request: int = 1) -> None:
            proc, _ = targets[target]
            cpu0 = cpu_seconds(proc.pid)
            load = os.getloadavg()[0]
            result = work()
            cpu = cpu_seconds(proc.pid) - cpu0
            result.update(workload=name, what=what, target=target, load1=load)
            requests = result.get("requests")
            if requests:
                result["cpu_us_per_request"] = cpu / requests * 1e6
                result["cpu_us_per_job"] = cpu / result["jobs"] * 1e6
            rows.append(result)
            print(f"  {name:12} {target:8} {_brief(result)}", flush=True)

        def by_wrk(base: str, path: str, body: str, jobs_per_request: int) -> Any:
            def work() -> dict[str, Any]:
                rate = wrk(base + path, body, args.duration, workdir)
                requests = rate * args.duration
                return {
                    "requests_per_s": rate,
                    "jobs_per_s": rate * jobs_per_request,
                    "requests": requests,
                    "jobs": requests * jobs_per_request,
                }

            return work

        def by_gen(kind: str, base: str, amount: float, target: str) -> Any:
            def work() -> dict[str, Any]:
                out = generate(kind, base, amount, target)
                if kind == "fetch-ack":
                    out["jobs_per_s"] = out["jobs"] / out["seconds"]
                    out["requests_per_s"] = out["requests"] / out["seconds"]
                    return out
                lat = out.pop("lat_us")
                return {
                    "p50_us": statistics.median(lat),
                    "p99_us": sorted(lat)[int(len(lat) * 0.99) - 1],
                    "n": len(lat),
                }

            return work

        workloads = set(args.workloads.split(","))
        for _ in range(args.repeat):
            if "push" in workloads:
                for target, base in order:
                    path = "/ojs/v1/jobs"
                    run("push", "wrk, 16 conns", target, by_wrk(base, path, PUSH_BODY, 1))
            if "batch" in workloads:
                for target, base in order:
                    path = "/ojs/v1/jobs/batch"
                    work = by_wrk(base, path, BATCH_BODY, BATCH)
                    run("push batch", f"wrk, {BATCH} jobs/request", target, work)
            if "fetch-ack" in workloads:
                for target, base in order:
                    if target != "hello":
                        fill(base, args.fill)
                for target, base in order:
                    work = by_gen("fetch-ack", base, args.duration, target)
                    run("fetch+ack", "aiohttp client, 16 workers", target, work)
            if "round-trip" in workloads:
                for target, base in order:
                    work = by_gen("round-trip", base, args.trips, target)
                    run("round trip", "push, fetch, ack, GET", target, work)
        if args.profile:
            profile_push(procs, server.pid, ojs, args, workdir)
        procs.stop(server)
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return rows


def profile_push(procs: Any, pid: int, base: str, args: argparse.Namespace, workdir: Path) -> None:
    """py-spy on the server while wrk pushes; the top functions by own time and on stack."""
    from e2e import profile_summary, py_spy

    raw = workdir / "push.txt"
    cmd = [*py_spy(raw), "--duration", str(args.duration), "--pid", str(pid)]
    cmd.remove("--subprocesses")
    prof = procs.spawn(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    time.sleep(0.5)
    wrk(base + "/ojs/v1/jobs", PUSH_BODY, args.duration, workdir)
    prof.wait(timeout=60)
    print(profile_summary(raw, top=30))


def _brief(row: dict[str, Any]) -> str:
    if "p50_us" in row:
        return f"p50 {row['p50_us']:,.0f} us, p99 {row['p99_us']:,.0f} us (n {row['n']})"
    return (
        f"{row['requests_per_s']:,.0f} req/s, {row['jobs_per_s']:,.0f} jobs/s, "
        f"{row['cpu_us_per_request']:,.0f} us CPU/request, load {row['load1']:.2f}"
    )


def table(rows: list[dict[str, Any]]) -> str:
    """Median per workload and target; the ratio jobwire / hello world."""
    lines = [
        "| workload | generator | jobwire req/s | jobs/s | hello-world req/s | ratio "
        "| jobwire CPU us/req | hello CPU us/req | runs (min-max ratio) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    names = dict.fromkeys(r["workload"] for r in rows)
    for name in names:
        ceil = [r for r in rows if r["workload"] == name and r["target"] == "hello"]
        for target in ("jobwire", "before"):
            mine = [r for r in rows if r["workload"] == name and r["target"] == target]
            if mine:
                lines.append(
                    _table_row(name if target == "jobwire" else f"{name} (before)", mine, ceil)
                )
    return "\n".join(lines)


def _table_row(name: str, mine: list[dict[str, Any]], ceil: list[dict[str, Any]]) -> str:
    what = mine[0]["what"]
    if "p50_us" in mine[0]:
        m = statistics.median(r["p50_us"] for r in mine)
        c = statistics.median(r["p50_us"] for r in ceil)
        ratios = [a["p50_us"] / b["p50_us"] for a, b in zip(mine, ceil, strict=False)]
        return (
            f"| {name} | {what} | p50 {m:,.0f} us | - | p50 {c:,.0f} us | {m / c:.2f}x "
            f"| - | - | {len(mine)} ({min(ratios):.2f}-{max(ratios):.2f}) |"
        )
    m = statistics.median(r["requests_per_s"] for r in mine)
    jobs = statistics.median(r["jobs_per_s"] for r in mine)
    c = statistics.median(r["requests_per_s"] for r in ceil)
    cm = statistics.median(r["cpu_us_per_request"] for r in mine)
    cc = statistics.median(r["cpu_us_per_request"] for r in ceil)
    ratios = [a["requests_per_s"] / b["requests_per_s"] for a, b in zip(mine, ceil, strict=False)]
    return (
        f"| {name} | {what} | {m:,.0f} | {jobs:,.0f} | {c:,.0f} | {m / c:.0%} | {cm:,.0f} "
        f"| {cc:,.0f} | {len(mine)} ({min(ratios):.0%}-{max(ratios):.0%}) |"
    )


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_gen":
        return generator_main(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", choices=["sqlite", "memory"], default="sqlite")
    parser.add_argument("--duration", type=int, default=5, help="seconds per measurement")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--trips", type=int, default=500, help="round trips per measurement")
    parser.add_argument("--fill", type=int, default=60_000, help="jobs queued for fetch+ack")
    parser.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help=f"comma-separated, of {', '.join(WORKLOADS)}",
    )
    parser.add_argument("--profile", action="store_true", help="py-spy the server's push")
    parser.add_argument(
        "--before",
        type=Path,
        help="a src/ directory of another revision: its server runs too, interleaved",
    )
    args = parser.parse_args()
    unknown = set(args.workloads.split(",")) - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown workloads: {', '.join(sorted(unknown))}")
    if not shutil.which("wrk"):
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    info = machine_info()
    print(
        f"# {info['cpus']} CPUs ({info['cpu']}), Python {info['python']}, jobwire "
        f"{info['jobwire_rev']}, store {args.store}, load {info['loadavg']}",
        flush=True,
    )
    rows = measure(args)
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT.parent / "ojs_http.jsonl", "a") as jsonl:
        for row in rows:
            jsonl.write(json.dumps({"machine": info, "args": vars(args)} | row, default=str) + "\n")
    if rows:
        print()
        print(table(rows))
    print(f"\n# load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
