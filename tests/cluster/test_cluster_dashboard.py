"""The dashboard of a node of a cluster (server/dashboard): every node's workers with their
node, the jobs of a queue that other nodes and the shared queue hold, a job another node
holds (read-only), and the PostgreSQL store. Real nodes on the local PostgreSQL, every wait a
condition polled up to a generous deadline.
"""

from __future__ import annotations

import os
import re
import signal
from typing import Any
from urllib.parse import quote

import pytest

from tests.cluster.test_cluster_ops import fetch, push, runners
from tests.interop.gearman_raw import register_worker, wait_until
from tests.pg import Schema
from tests.server.dashboard_support import Browser
from tests.servers import ServerProcess

pytestmark = pytest.mark.interop

DEADLINE = 60.0


def worker_row(browser: Browser, worker_id: str) -> str | None:
    """A worker's row on the workers page (None: not listed)."""
    page = browser.get("/ui/workers")
    assert page.status == 200, page.text[:500]
    found = re.search(rf'<tr data-worker="{re.escape(worker_id)}">(.*?)</tr>', page.text, re.S)
    return found.group(1) if found else None


def queue_row(text: str, queue: str) -> str | None:
    """A queue's row in a page's queue table (None: not listed)."""
    found = re.search(rf'<a href="/ui/queues/{re.escape(queue)}">(.*?)</tr>', text, re.S)
    return found.group(1) if found else None


def shows(browser: Browser, path: str, *wanted: str) -> str | None:
    """The page, once it holds every one of `wanted` (None: not yet)."""
    page = browser.get(path)
    assert page.status == 200, (path, page.status, page.text[:500])
    return page.text if all(text in page.text for text in wanted) else None


def nodes_of(node: Any, worker_id: str) -> list[int]:
    listed = node.request("GET", "/ojs/v1/workers")
    assert listed.status == 200, listed.raw
    row = next(w for w in listed.body["workers"] if w["worker_id"] == worker_id)
    found: list[int] = row["nodes"]
    return found


def test_a_nodes_dashboard_shows_the_whole_cluster(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    (one, two), first, second = runners(nodes, schema)
    assert one.http_port is not None and two.http_port is not None
    here, there = Browser(one.http_port), Browser(two.http_port)
    pushed = [push(first, "dash") for _ in range(3)]  # no worker on the first node: shared
    held = fetch(second, "dash", worker="w-two")["id"]  # now held, active, on the second
    assert held in pushed
    push(second, "only-two")  # a queue the first node never had
    with register_worker(two, ["resize"]):
        gearman = next(
            w["worker_id"]
            for w in first.request("GET", "/ojs/v1/workers?protocol=gearman").body["workers"]
        )
        node_two = nodes_of(first, "w-two")
        assert nodes_of(first, gearman) == node_two and len(node_two) == 1

        # Workers: the second node's, with their node. Its Gearman connection is directed
        # from its own node's dashboard only; the OJS worker from either.
        rows = {}
        for worker_id in ("w-two", gearman):
            rows[worker_id] = wait_until(
                lambda w=worker_id: worker_row(here, w), worker_id, DEADLINE
            )
            assert f'<td class="node">{node_two[0]}</td>' in rows[worker_id], rows
        assert "<form" not in rows[gearman], rows
        assert "Quiet" in rows["w-two"], rows
        mine = wait_until(lambda: worker_row(there, "w-two"), "w-two on its node", DEADLINE)
        assert "Quiet" in mine, mine
        token = here.get("/ui/workers").csrf()  # quieted from the first node's page
        quiet = here.post_form("/ui/workers/w-two/state", {"csrf": token, "state": "quiet"})
        assert quiet.status == 303, quiet.text[:500]
        beat = second.request("POST", "/ojs/v1/workers/heartbeat", {"worker_id": "w-two"})
        assert (beat.status, beat.body["state"]) == (200, "quiet"), beat.raw

        # Queues: other nodes' jobs counted apart (waiting / running), on both pages.
        for path in ("/", "/ui/queues"):
            text = wait_until(
                lambda p=path: shows(here, p, '<td class="n">2 / 1</td>'), "the counts", DEADLINE
            )
            assert '<td class="n">2 / 1</td>' in (queue_row(text, "dash") or ""), text
            assert '<td class="n">1 / 0</td>' in (queue_row(text, "only-two") or ""), text
        only = here.get("/ui/queues/only-two")
        assert only.status == 200 and "1 waiting" in only.text, only.text[:500]
        token = only.csrf()  # a pause of a queue only other nodes have reaches them
        assert here.post_form("/ui/queues/only-two/pause", {"csrf": token}).status == 303

        def paused_there() -> bool:
            stats = second.request("GET", "/ojs/v1/queues/only-two/stats")
            return bool(stats.body["queue"]["paused"])

        wait_until(paused_there, "the pause on the second node", DEADLINE)

    # A job the second node holds: found and shown on the first, without actions.
    found = here.get(f"/ui/jobs?q={quote(held)}")
    assert (found.status, found.headers["location"]) == (303, f"/ui/jobs/{quote(held, safe='')}")
    job = wait_until(
        lambda: shows(here, f"/ui/jobs/{quote(held, safe='')}", '<dd class="state">active'),
        "the held job's page",
        DEADLINE,
    )
    assert "Another node of the cluster holds this job" in job
    assert "/cancel" not in job and "/retry" not in job
    assert here.get("/ui/jobs/no-such-job").status == 404

    # The store: PostgreSQL, this node's id and the database, no password.
    overview = here.get("/").text
    assert "<dd>postgresql</dd>" in overview and f"<code>{schema.name}</code>" in overview
    assert "password" not in overview


def test_a_node_that_does_not_answer_leaves_the_pages_working(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    """A stopped node (its lease long enough to count as alive meanwhile) does not answer the
    question for its workers: the pages show this node's part and say so."""
    (one, two), first, _ = runners(nodes, schema, "--node-lease", "120")
    assert one.http_port is not None
    here = Browser(one.http_port)
    registered = first.request("POST", "/ojs/v1/workers/register", {"worker_id": "w-one"})
    assert registered.status in (200, 201), registered.raw
    push(first, "stalled")
    os.kill(two.proc.pid, signal.SIGSTOP)
    try:
        for path in ("/ui/workers", "/"):
            page = here.get(path)  # after the question's timeout (5 s)
            assert page.status == 200, (path, page.status, page.text[:500])
            assert "the other nodes&#39; workers could not be read" in page.text, page.text
            assert path == "/" or 'data-worker="w-one"' in page.text, page.text
    finally:
        os.kill(two.proc.pid, signal.SIGCONT)
