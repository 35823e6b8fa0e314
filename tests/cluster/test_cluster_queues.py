"""A queue's statistics on a cluster (server/ojs/queues.py): each node counts what it holds,
the store counts what no node holds, and every node gives the same figures. Real nodes on the
local PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.cluster.test_cluster_ops import fetch, push, runners
from tests.pg import Schema
from tests.servers import ServerProcess

pytestmark = pytest.mark.interop

FIGURES = ("available", "active", "completed", "discarded", "scheduled", "total")


def _stats(node: Any, queue: str) -> dict[str, Any]:
    got = node.request("GET", f"/ojs/v1/queues/{queue}/stats")
    assert got.status == 200, got.raw
    return {figure: got.body["queue"][figure] for figure in FIGURES}


def test_every_node_counts_the_whole_clusters_jobs_of_a_queue(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    _, first, second = runners(nodes, schema)
    failed = push(first, "counted", retry={"max_attempts": 1})
    assert fetch(second, "counted")["id"] == failed  # it fails for good on the second node
    body = {"job_id": failed, "worker_id": "w1", "error": {"message": "no"}}
    nacked = second.request("POST", "/ojs/v1/workers/nack", body)
    assert nacked.status == 200, nacked.raw
    for _ in range(4):
        push(first, "counted")  # to the shared queue: no worker waits on either node
    done = fetch(second, "counted")  # completed on the second node
    acked = second.request("POST", "/ojs/v1/workers/ack", {"job_id": done["id"], "worker_id": "w1"})
    assert acked.status == 200, acked.raw
    fetch(first, "counted")  # running on the first node
    push(second, "counted", scheduled_at="2099-01-01T00:00:00Z")  # kept by the second node
    seen = [_stats(node, "counted") for node in (first, second)]
    assert seen[0] == seen[1], seen
    expected = {"available": 2, "active": 1, "completed": 1, "discarded": 1, "scheduled": 1}
    assert seen[0] == {**expected, "total": 6}, seen[0]
