"""The OJS event log on a cluster (server/ojs/events.py): each node records what happened on
it, and any node answers with every node's events in time order, paged by a cursor that
holds across nodes. Real nodes on the local PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.cluster.test_cluster_ops import fetch, push, runners
from tests.interop.gearman_raw import wait_until
from tests.ojs.dsl import Runner
from tests.pg import Schema
from tests.servers import ServerProcess

pytestmark = pytest.mark.interop


def _events(node: Runner, query: str) -> dict[str, Any]:
    got = node.request("GET", f"/ojs/v1/events?queues=logged&{query}")
    assert got.status == 200, got.raw
    body: dict[str, Any] = got.body
    return body


def test_every_node_shows_every_nodes_events_in_time_order(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    _, first, second = runners(nodes, schema)
    job_id = push(first, "logged")  # enqueued on the first node
    assert fetch(second, "logged")["id"] == job_id  # started on the second
    acked = second.request("POST", "/ojs/v1/workers/ack", {"job_id": job_id, "worker_id": "w1"})
    assert acked.status == 200, acked.raw
    seen = [_events(node, "limit=100")["events"] for node in (first, second)]
    assert seen[0] == seen[1], seen
    kinds = [(event["type"], event["subject"]) for event in seen[0]]
    assert kinds == [
        ("job.enqueued", job_id),
        ("job.started", job_id),
        ("job.completed", job_id),
    ], kinds
    assert len({event["id"] for event in seen[0]}) == 3
    # Paging forward from either node, one event at a time, gives the same events.
    paged: list[dict[str, Any]] = []
    cursor = 0
    for node in (second, first, second, first):
        page = _events(node, f"limit=1&after={cursor}" if cursor else "limit=1")
        if not cursor:  # without a cursor: the newest; start again from before the oldest
            assert page["events"] == seen[0][-1:], page
            cursor = seen[0][0]["sequence"] - 1
            continue
        paged.extend(page["events"])
        cursor = page["next_after"]
    assert paged == seen[0], paged
    assert _events(first, f"after={cursor}")["events"] == []


def test_a_dead_nodes_events_are_read_from_its_snapshots_in_the_store(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    (doomed, _), first, second = runners(nodes, schema, "--node-lease", "2")
    job_id = push(first, "logged")  # enqueued on the first node, which then dies
    (event,) = _events(second, "limit=10")["events"]
    assert (event["type"], event["subject"]) == ("job.enqueued", job_id), event
    node = int(event["id"].split("_")[1])
    saved = f"SELECT count(*) FROM {{schema}}.kv WHERE namespace = 'events' AND owner = {node}"
    wait_until(lambda: schema.rows(saved)[0][0] or None, "the first node's snapshot", 60)
    doomed.kill()

    def answered() -> dict[str, Any] | None:  # 503 while its lease runs: it may be alive
        got = second.request("GET", "/ojs/v1/events?queues=logged&limit=10")
        return got.body if got.status == 200 else None

    assert wait_until(answered, "an answer without the dead node", 60)["events"] == [event]
