"""Freelance (RFC 10): the request time of the shotgun and the agent, one and three servers.

    .venv/bin/python bench/freelance.py                   # both backends, 1 and 3 servers
    .venv/bin/python bench/freelance.py --requests 2000 --backends jobwire

As the ZeroMQ Guide measures `flclient2` and `flclient3`: one client sends `--requests`
requests one after the other (each waits for its reply) and the figure is the elapsed time
divided by the requests, in microseconds. The Guide reports about 60 us per request for the
shotgun with one server and about 80 us with three.

Two backends:
- `ok`: the Guide's servers, a ROUTER (identity = endpoint) in a process of its own that
  answers every request `[control, "OK"]` at once (`flserver2`/`flserver3`): the clients'
  and the sockets' cost alone, comparable with the Guide's figures.
- `jobwire`: `jobwire serve --freelance-port` servers with one SDK Gearman worker (another
  process, connected to all of them) serving `echo`: each request is a job, so this adds
  the engine and the worker's round trip. The shotgun runs every request once per server.

Measurement, not a test: nothing here asserts on time. Every process started here is killed
when the script exits.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from harness import REPO, Processes, free_port, machine_info, managed_processes, wakeup_us

GUIDE_SHOTGUN = {1: 60, 3: 80}  # us per request, the Guide's figures


def serve_ok(endpoint: str) -> None:
    """The Guide's Freelance server: PONG to PING, [control, OK] to a request."""
    import zmq

    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.IDENTITY, endpoint.encode())
    sock.bind(endpoint)
    while True:
        frames = sock.recv_multipart()
        identity, rest = frames[0], frames[1:]
        envelope = [b""] if rest and rest[0] == b"" else []
        rest = rest[len(envelope) :]
        if rest == [b"PING"]:
            sock.send_multipart([identity, *envelope, b"PONG"])
        elif rest:
            sock.send_multipart([identity, *envelope, rest[0], b"OK"])


def serve_worker(servers: list[str]) -> None:
    """An SDK Gearman worker serving `echo` on every server."""
    from jobwire import Job, Worker

    worker = Worker(servers, concurrency=8, heartbeat=5.0)

    @worker.task("echo")
    async def echo(job: Job) -> bytes:
        return job.payload

    worker.run()


def spawn_self(procs: Processes, *args: str) -> None:
    log = open(REPO / "bench" / "out" / "freelance-child.log", "ab")  # noqa: SIM115
    procs.spawn([sys.executable, str(Path(__file__).resolve()), *args], stdout=log, stderr=log)


def start_servers(procs: Processes, backend: str, count: int) -> list[str]:
    """`count` servers of `backend` (and their worker); their endpoints, once they answer."""
    from jobwire.sdk.freelance import FailoverClient

    (REPO / "bench" / "out").mkdir(parents=True, exist_ok=True)
    endpoints = []
    gearman = []
    for _ in range(count):
        port = free_port()
        endpoint = f"tcp://127.0.0.1:{port}"
        endpoints.append(endpoint)
        if backend == "ok":
            spawn_self(procs, "--serve-ok", endpoint)
            continue
        gearman_port = free_port()
        gearman.append(f"127.0.0.1:{gearman_port}")
        command = [sys.executable, "-m", "jobwire", "serve", "-L", "127.0.0.1"]
        command += ["--port", str(gearman_port), "--store", "memory", "--http-port", "0"]
        command += ["--zmq-port", "0", "--freelance-port", str(port), "--log-file", "none"]
        procs.spawn(command)
    if gearman:
        spawn_self(procs, "--serve-worker", *gearman)
    service = "ok" if backend == "ok" else "echo"
    for endpoint in endpoints:  # each answers a request (jobwire: its worker is there)
        end = time.monotonic() + 60
        while True:
            try:
                with FailoverClient(endpoint, timeout=2.0, retries=1) as client:
                    client.request(service, b"warm")
                break
            except Exception:
                if time.monotonic() > end:
                    raise
    return endpoints


def measure(request: Callable[[], object], count: int) -> float:
    """Microseconds per request, after a warm-up of a tenth of `count`."""
    for _ in range(max(1, count // 10)):
        request()
    start = time.perf_counter()
    for _ in range(count):
        request()
    return (time.perf_counter() - start) / count * 1e6


def run_cell(backend: str, servers: int, count: int) -> tuple[float, float]:
    from jobwire.sdk.freelance import FreelanceClient, ShotgunClient

    service = "ok" if backend == "ok" else "echo"
    with managed_processes() as procs:
        endpoints = start_servers(procs, backend, servers)
        with ShotgunClient(endpoints) as shotgun:
            shot = measure(lambda: shotgun.request(service, b"x"), count)
        with FreelanceClient(endpoints) as agent:
            agent.request(service, b"x")  # it has found a live server
            agented = measure(lambda: agent.request(service, b"x"), count)
    return shot, agented


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=10_000, help="per cell (ok backend)")
    parser.add_argument(
        "--jobwire-requests", type=int, default=3_000, help="per cell (jobwire backend)"
    )
    parser.add_argument("--backends", default="ok,jobwire")
    parser.add_argument("--servers", default="1,3")
    parser.add_argument("--serve-ok", metavar="ENDPOINT", help=argparse.SUPPRESS)
    parser.add_argument("--serve-worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_ok:
        serve_ok(args.serve_ok)
        return
    if args.serve_worker:
        serve_worker(args.serve_worker)
        return
    info = machine_info()
    print(f"# {info.get('cpu', '?')}, {info.get('python', sys.version.split()[0])}")
    print(f"# loopback ping-pong p50: {wakeup_us():.0f} us")
    print("| backend | servers | shotgun us/request | agent us/request | Guide, shotgun |")
    print("|---|---|---|---|---|")
    for backend in args.backends.split(","):
        count = args.requests if backend == "ok" else args.jobwire_requests
        for servers in (int(n) for n in args.servers.split(",")):
            shot, agent = run_cell(backend, servers, count)
            guide = GUIDE_SHOTGUN.get(servers)
            print(
                f"| {backend} | {servers} | {shot:.0f} | {agent:.0f} | "
                f"{f'~{guide}' if guide else '-'} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
