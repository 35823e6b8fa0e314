"""The dead letter queue on a cluster (server/ojs/deadletter.py): each node keeps the entries
of the jobs that failed there; any node lists them all and retries or deletes any of them.
Real nodes on the local PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.cluster.conftest import start_node
from tests.cluster.test_cluster_ops import fetch, push, runners
from tests.interop.gearman_raw import wait_until
from tests.ojs.dsl import Runner
from tests.pg import Schema
from tests.servers import ServerProcess

pytestmark = pytest.mark.interop

TO_DEAD_LETTER = {"max_attempts": 1, "on_exhaustion": "dead_letter"}


def _fail_on(node: Runner, queue: str, pushed_on: Runner) -> str:
    """A job pushed on `pushed_on`, fetched and failed for good on `node`."""
    job_id = push(pushed_on, queue, retry=TO_DEAD_LETTER)
    assert fetch(node, queue)["id"] == job_id
    body = {"job_id": job_id, "worker_id": "w1", "error": {"message": "no"}}
    nacked = node.request("POST", "/ojs/v1/workers/nack", body)
    assert (nacked.status, nacked.body["state"]) == (200, "discarded"), nacked.raw
    return job_id


def _listed(node: Runner, **query: Any) -> list[str]:
    path = "/ojs/v1/dead-letter" + (
        "?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else ""
    )
    got = node.request("GET", path)
    assert got.status == 200, got.raw
    assert got.body["total"] >= got.body["count"] == len(got.body["jobs"]), got.body
    return [job["id"] for job in got.body["jobs"]]


def test_any_node_lists_retries_and_deletes_every_nodes_dead_letters(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    _, first, second = runners(nodes, schema)
    older = _fail_on(second, "dead-a", first)
    newer = _fail_on(first, "dead-b", second)  # a queue the second node has not fetched from
    for node in (first, second):
        assert _listed(node) == [older, newer]  # oldest first, wherever each failed
        assert _listed(node, limit=1, offset=1) == [newer]
        assert _listed(node, queue="dead-b") == [newer]
        assert _listed(node, queue="elsewhere") == []
    retried = first.request("POST", f"/ojs/v1/dead-letter/{older}/retry")
    assert (retried.status, retried.body["job"]["state"]) == (200, "available"), retried.raw
    deleted = second.request("DELETE", f"/ojs/v1/dead-letter/{newer}")
    assert deleted.status == 200 and deleted.body == {"deleted": True, "job_id": newer}, deleted.raw
    for node in (first, second):
        assert _listed(node) == []
        for method, path in (("POST", f"{newer}/retry"), ("DELETE", older)):
            gone = node.request(method, f"/ojs/v1/dead-letter/{path}")
            assert (gone.status, gone.body["error"]["code"]) == (404, "not_found"), gone.raw


def test_a_node_started_later_keeps_its_own_entries_and_a_gone_nodes(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    (_, leaving), first, second = runners(nodes, schema)
    kept = _fail_on(first, "dead-c", first)
    orphaned = _fail_on(second, "dead-d", first)
    leaving.kill()  # the second node is gone; its entry waits for a node that starts
    third = start_node(nodes, schema, http=True)
    wait_until(lambda: "cluster: 2 nodes" in third.log() or None, "nodes meet", 60)
    late = Runner(f"http://127.0.0.1:{third.http_port}")
    # Each entry once: the first node's stays its own (the third does not load it too), the
    # gone node's became the third's.
    for node in (first, late):
        assert _listed(node) == [kept, orphaned]
        assert node.request("GET", "/ojs/v1/dead-letter").body["total"] == 2
    # Retried on the node that kept it, the entry leaves every list: no copy stays behind.
    retried = late.request("POST", f"/ojs/v1/dead-letter/{kept}/retry")
    assert retried.status == 200, retried.raw
    for node in (first, late):
        assert _listed(node) == [orphaned]


def test_the_entries_of_a_node_that_died_are_taken_over_by_a_running_one(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    (dying, _), first, second = runners(nodes, schema, "--node-lease", "2")
    orphaned = _fail_on(first, "dead-e", first)
    assert _listed(second) == [orphaned]  # asked of the first node
    dying.kill()
    # Until the second node finds the first dead, a list asks it in vain (503); then the
    # entry is the second node's own: listed, and retried.

    def listed_alone() -> bool | None:
        got = second.request("GET", "/ojs/v1/dead-letter")
        assert got.status in (200, 503), got.raw
        return (got.status == 200 and [job["id"] for job in got.body["jobs"]] == [orphaned]) or None

    wait_until(listed_alone, "the entry taken over", 90)
    retried = second.request("POST", f"/ojs/v1/dead-letter/{orphaned}/retry")
    assert retried.status == 200, retried.raw
    assert _listed(second) == []
