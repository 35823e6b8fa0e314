"""`GET /ojs/v1/workers` on a cluster (server/ojs/workers.py): every node lists the workers of
every node, an OJS worker that works on several nodes once. Real nodes on the local
PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.cluster.test_cluster_ops import fetch, push, runners
from tests.interop.gearman_raw import register_worker
from tests.pg import Schema
from tests.servers import ServerProcess

pytestmark = pytest.mark.interop


def _workers(node: Any, query: str = "") -> dict[str, dict[str, Any]]:
    got = node.request("GET", "/ojs/v1/workers" + query)
    assert got.status == 200, got.raw
    assert got.body["count"] == len(got.body["workers"]), got.raw
    listed = {row["worker_id"]: row for row in got.body["workers"]}
    assert len(listed) == len(got.body["workers"]), got.raw  # each worker once
    return listed


def test_every_node_lists_every_nodes_workers(schema: Schema, nodes: list[ServerProcess]) -> None:
    (_, two), first, second = runners(nodes, schema)
    registered = first.request(
        "POST",
        "/ojs/v1/workers/register",
        {"worker_id": "w-both", "queues": ["listed"], "concurrency": 4, "hostname": "h1"},
    )
    assert registered.status in (200, 201), registered.raw
    job_id = push(first, "listed")
    assert fetch(second, "listed", worker="w-both")["id"] == job_id  # a session there too
    with register_worker(two, ["resize"]):
        seen = [_workers(node) for node in (first, second)]
        assert seen[0] == seen[1], seen
        listed = seen[0]
        both = listed["w-both"]
        assert len(both["nodes"]) == 2, both
        assert both["active_jobs"] == [job_id], both
        assert (both["registered"], both["hostname"], both["concurrency"]) == (True, "h1", 4)
        gearman = [row for row in listed.values() if row["protocol"] == "gearman"]
        assert len(gearman) == 1 and gearman[0]["abilities"] == ["resize"], listed
        assert gearman[0]["nodes"] != both["nodes"] and gearman[0]["nodes"][0] in both["nodes"]
        # ?protocol= filters every node's part.
        assert set(_workers(first, "?protocol=gearman")) == {gearman[0]["worker_id"]}
        assert set(_workers(second, "?protocol=ojs")) == {"w-both"}


def test_the_admin_api_counts_and_lists_the_whole_cluster(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    """`/ojs/v1/admin/stats`, `/queues` and `/workers` (what `jobwire top` shows) on either
    node: every node's jobs and workers, and the rows in the shared queue."""
    (_, two), first, second = runners(nodes, schema)
    for _ in range(3):
        push(first, "admin")  # no worker waits on either node: the shared queue
    done = fetch(second, "admin")  # then held, and completed, on the second node
    acked = second.request("POST", "/ojs/v1/workers/ack", {"job_id": done["id"], "worker_id": "w1"})
    assert acked.status == 200, acked.raw
    held = fetch(second, "admin", worker="w2")  # active on the second node
    with register_worker(two, ["resize"]):
        for node in (first, second):
            stats = node.request("GET", "/ojs/v1/admin/stats")
            assert stats.status == 200, stats.raw
            jobs = stats.body["jobs"]
            assert (jobs["available"], jobs["active"], jobs["completed"]) == (1, 1, 1), stats.raw
            assert stats.body["throughput"]["processed_per_minute"] == 1, stats.raw
            queues = node.request("GET", "/ojs/v1/admin/queues")
            assert queues.status == 200, queues.raw
            admin = next(q for q in queues.body["items"] if q["name"] == "admin")
            assert (admin["counts"]["available"], admin["counts"]["active"]) == (1, 1), admin
            listed = node.request("GET", "/ojs/v1/admin/workers")
            assert listed.status == 200, listed.raw
            by_protocol = listed.body["summary"]["by_protocol"]
            assert by_protocol["gearman"] == 1, listed.raw  # the second node's connection
            assert {"w1", "w2"} <= {w["worker_id"] for w in listed.body["items"]}, listed.raw
            assert stats.body["workers"] >= 3, stats.raw
    assert held["id"] != done["id"]


def test_a_directive_given_on_one_node_reaches_an_ojs_worker_s_session_on_another(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    """An operator quiets an OJS worker through any node: its next heartbeat on the node it
    works with says so, and its fetches there get nothing until it is resumed."""
    _, first, second = runners(nodes, schema)
    body = {"worker_id": "w-far", "queues": ["directed"], "concurrency": 2}
    registered = second.request("POST", "/ojs/v1/workers/register", body)
    assert registered.status in (200, 201), registered.raw

    def beat() -> str:
        beaten = second.request("POST", "/ojs/v1/workers/heartbeat", {"worker_id": "w-far"})
        assert beaten.status == 200, beaten.raw
        state: str = beaten.body["state"]
        return state

    assert beat() == "running"
    quieted = first.request("POST", "/ojs/v1/admin/workers/w-far/state", {"state": "quiet"})
    assert quieted.status == 200, quieted.raw
    assert quieted.body["worker"]["state"] == "quiet", quieted.raw
    assert beat() == "quiet"
    push(first, "directed")
    asked = {"queues": ["directed"], "worker_id": "w-far"}
    assert second.request("POST", "/ojs/v1/workers/fetch", asked).body["jobs"] == []
    resumed = first.request("POST", "/ojs/v1/admin/workers/w-far/state", {"state": "running"})
    assert resumed.status == 200, resumed.raw
    assert beat() == "running"
    assert fetch(second, "directed", worker="w-far")["args"] == [1]
    unknown = first.request("POST", "/ojs/v1/admin/workers/w-nobody/state", {"state": "quiet"})
    assert unknown.status == 404, unknown.raw
