"""What the cluster's shared rate budget costs an OJS fetch (docs/scaling.md).

    .venv/bin/python bench/cluster_rate_latency.py --jobs 200

Starts two nodes on a fresh schema of `--pg`; on node B, one job at a time: push, fetch
(timed), ack, alternately on a queue with no limit and on one limited to 1,000,000 jobs/s
(a limit that never binds: the fetch only pays for taking from the bucket). Prints p50/p90
of the fetch per queue. Wall-clock figures: on a loaded machine they move with the load.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path

from cluster_ops_latency import Http, start_node, summary
from durable import PG, PgRun

UNBINDING = 1_000_000


def round_trip(node: Http, queue: str) -> float:
    status, body, _ = node.call(
        "POST", "/ojs/v1/jobs", {"type": "t", "args": [], "options": {"queue": queue}}
    )
    assert status == 201, body
    status, body, ms = node.call(
        "POST", "/ojs/v1/workers/fetch", {"queues": [queue], "worker_id": "w"}
    )
    assert status == 200 and len(body["jobs"]) == 1, body
    status, body, _ = node.call("POST", "/ojs/v1/workers/ack", {"job_id": body["jobs"][0]["id"]})
    assert status == 200, body
    return ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--pg", default=PG)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="jobwire-cluster-rate-"))
    pg = PgRun(args.pg)
    nodes: list[subprocess.Popen[bytes]] = []
    try:
        first, _ = start_node(pg.dsn, work / "a.log")
        second, second_port = start_node(pg.dsn, work / "b.log")
        nodes += [first, second]
        deadline = time.monotonic() + 60
        while "cluster: 2 nodes" not in (work / "a.log").read_text():
            if time.monotonic() > deadline:
                raise RuntimeError("the nodes did not meet")
            time.sleep(0.05)
        b = Http(second_port)
        limit = {"type": "t", "args": [], "options": {"queue": "limited"}}
        limit["options"]["rate_limit"] = {"max_per_second": UNBINDING}  # type: ignore[index]
        status, body, _ = b.call("POST", "/ojs/v1/jobs", limit)
        assert status == 201, body
        for queue in ("plain", "limited", "plain", "limited"):  # warm up, and drain
            b.call(
                "POST", "/ojs/v1/workers/fetch", {"queues": [queue], "worker_id": "w", "count": 10}
            )
            round_trip(b, queue)
        plain: list[float] = []
        limited: list[float] = []
        for _ in range(args.jobs):
            plain.append(round_trip(b, "plain"))
            limited.append(round_trip(b, "limited"))
        print(summary("fetch plain", plain))
        print(summary("fetch limited", limited))
    finally:
        for node in nodes:
            node.kill()
            node.wait()
        pg.close()


if __name__ == "__main__":
    main()
