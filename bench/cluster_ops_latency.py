"""Latency of OJS operations on a job another cluster node holds (docs/scaling.md).

    .venv/bin/python bench/cluster_ops_latency.py --jobs 200

Starts two nodes on a fresh schema of `--pg`, each with its HTTP listener, and measures one
operation at a time (each job pushed on node A and fetched on node B first, not timed):

- ack-remote: POST /workers/ack on A of the job B holds (A asks B, B acks and commits, B
  answers A);
- ack-local: the same ack sent to B itself, for comparison;
- get-remote: GET /jobs/{id} on A of a job B holds;
- cancel-shared: DELETE /jobs/{id} on A of a job waiting in the shared queue (A takes it and
  cancels it).

Prints p50/p90/max per operation and the database's commits per round (push, fetch, ack) of
the two ack runs. Wall-clock figures: on a loaded machine they move with the load.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from durable import PG, PgRun
from harness import free_port


class Http:
    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any, float]:
        """(status, JSON body, milliseconds)."""
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/openjobspec+json"}
        started = time.perf_counter()
        self.conn.request(method, path, body=payload, headers=headers)
        response = self.conn.getresponse()
        raw = response.read()
        elapsed = (time.perf_counter() - started) * 1000
        return response.status, json.loads(raw) if raw else None, elapsed


def start_node(dsn: str, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    cmd = [sys.executable, "-m", "jobwire", "serve", "--port", str(free_port())]
    cmd += ["--http-port", str(port), "--zmq-port", "0", "--store", dsn]
    cmd += ["--cluster-poll", "60", "--verbose", "INFO"]
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            Http(port).call("GET", "/ojs/v1/health")
            return proc, port
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"node did not start: {log.read_text()}")


def held_on(a: Http, b: Http, queue: str) -> str:
    """A job pushed on A and fetched on B: B holds it."""
    status, body, _ = a.call(
        "POST", "/ojs/v1/jobs", {"type": "t", "args": [], "options": {"queue": queue}}
    )
    assert status == 201, body
    job_id: str = body["job"]["id"]
    status, body, _ = b.call("POST", "/ojs/v1/workers/fetch", {"queues": [queue], "worker_id": "w"})
    assert status == 200 and body["jobs"][0]["id"] == job_id, body
    return job_id


def timed(jobs: int, step: Any) -> list[float]:
    samples = []
    for _ in range(jobs):
        samples.append(step())
    return samples


def summary(name: str, samples: list[float]) -> str:
    ordered = sorted(samples)
    p90 = ordered[int(len(ordered) * 0.9) - 1]
    return (
        f"{name:13} p50 {statistics.median(ordered):7.2f} ms  p90 {p90:7.2f} ms"
        f"  max {ordered[-1]:7.2f} ms  ({len(ordered)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--pg", default=PG)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="jobwire-cluster-ops-"))
    pg = PgRun(args.pg)
    nodes: list[subprocess.Popen[bytes]] = []
    try:
        first, first_port = start_node(pg.dsn, work / "a.log")
        second, second_port = start_node(pg.dsn, work / "b.log")
        nodes += [first, second]
        deadline = time.monotonic() + 60
        while "cluster: 2 nodes" not in (work / "a.log").read_text():
            if time.monotonic() > deadline:
                raise RuntimeError("the nodes did not meet")
            time.sleep(0.05)
        a, b = Http(first_port), Http(second_port)

        def ack(on: Http) -> float:
            job_id = held_on(a, b, "bench")
            status, body, ms = on.call("POST", "/ojs/v1/workers/ack", {"job_id": job_id})
            assert status == 200, body
            return ms

        def get_remote() -> float:
            job_id = held_on(a, b, "bench")
            status, body, ms = a.call("GET", f"/ojs/v1/jobs/{job_id}")
            assert status == 200 and body["job"]["state"] == "active", body
            b.call("POST", "/ojs/v1/workers/ack", {"job_id": job_id})
            return ms

        def cancel_shared() -> float:
            status, body, _ = b.call(
                "POST", "/ojs/v1/jobs", {"type": "t", "args": [], "options": {"queue": "idle"}}
            )
            assert status == 201, body
            status, body, ms = a.call("DELETE", f"/ojs/v1/jobs/{body['job']['id']}")
            assert status == 200 and body["job"]["state"] == "cancelled", body
            return ms

        b.call("POST", "/ojs/v1/workers/ack", {"job_id": held_on(a, b, "bench")})  # warm up
        before = pg.sample()
        remote = [ack(a) for _ in range(args.jobs)]
        after = pg.sample()
        local = timed(args.jobs, lambda: ack(b))
        after_local = pg.sample()
        reads = timed(args.jobs, get_remote)
        cancels = timed(args.jobs, cancel_shared)
        print(summary("ack-remote", remote))
        print(summary("ack-local", local))
        print(summary("get-remote", reads))
        print(summary("cancel-shared", cancels))
        remote_commits = (after[1] - before[1]) / args.jobs
        local_commits = (after_local[1] - after[1]) / args.jobs
        print(
            "database commits per round of push, fetch and ack:"
            f" {remote_commits:.2f} (ack-remote), {local_commits:.2f} (ack-local)"
        )
    finally:
        for node in nodes:
            node.kill()
            node.wait()
        pg.close()


if __name__ == "__main__":
    main()
