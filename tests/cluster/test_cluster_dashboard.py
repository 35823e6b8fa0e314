"""The dashboard of a node of a cluster (server/dashboard): every node's workers with their
node, the jobs of a queue that other nodes and the shared queue hold, a job another node
holds (read-only), every node's scheduled and dead jobs in one list, a search by unique key
and another node's dead letter (read-only), the overview's counts of every node's jobs and
dead letters, and the PostgreSQL store. Real nodes on the local PostgreSQL, every wait a
condition polled up to a generous deadline.
"""

from __future__ import annotations

import os
import re
import signal
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import pytest

from tests.cluster.test_cluster_ops import fetch, push, runners
from tests.interop.gearman_raw import Cmd, GearmanSocket, register_worker, wait_until
from tests.pg import Schema
from tests.server.dashboard_support import Browser
from tests.servers import ServerProcess

pytestmark = pytest.mark.interop

DEADLINE = 60.0
#: A time far ahead (2096): jobs scheduled then stay on the node they came to.
LATER = 4_000_000_000


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


def listed(browser: Browser, path: str) -> list[tuple[str, str]]:
    """A job list page's rows, in order: (job id, the row's markup)."""
    page = browser.get(path)
    assert page.status == 200, (path, page.status, page.text[:500])
    return re.findall(r'<tr data-job="([^"]+)">(.*?)</tr>', page.text, re.S)


def node_id(browser: Browser) -> str:
    """The node id a node's overview shows."""
    found = re.search(r"<dt>this node</dt><dd>(\d+)</dd>", browser.get("/").text)
    assert found, "no node id on the overview"
    return found.group(1)


def cards(text: str) -> dict[str, str]:
    """The overview's cards: label -> value."""
    found = re.findall(r'<span class="label">([^<]*)</span><span class="value"[^>]*>([^<]*)<', text)
    return dict(found)


def overview_shows(browser: Browser, wanted: dict[str, str]) -> str | None:
    """The overview, once its cards include `wanted` (None: not yet)."""
    page = browser.get("/")
    assert page.status == 200, page.text[:500]
    return page.text if wanted.items() <= cards(page.text).items() else None


def dead_letter(node: Any, queue: str) -> str:
    """An OJS job that ran once on `node` and failed into its dead letter queue; its id."""
    job_id = push(node, queue, retry={"max_attempts": 1, "on_exhaustion": "dead_letter"})
    assert fetch(node, queue)["id"] == job_id
    error = {"code": "boom", "message": "it broke"}
    nacked = node.request("POST", "/ojs/v1/workers/nack", {"job_id": job_id, "error": error})
    assert (nacked.status, nacked.body["state"]) == (200, "discarded"), nacked.raw
    return job_id


def iso(epoch: int) -> str:
    """An OJS `scheduled_at`."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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


def test_the_overview_counts_every_nodes_jobs_and_dead_letters(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    """Each node's overview counts the jobs every node knows and the shared queue holds, and
    every node's dead letters: a job scheduled on the first node and two on the second (they
    stay where they came), one waiting in the shared queue, and a dead letter of the second
    (its discarded job still known there: finished jobs are kept an hour). Throughput stays
    each node's own."""
    (one, two), first, second = runners(nodes, schema)
    assert one.http_port is not None and two.http_port is not None
    push(first, "waits")  # no worker anywhere yet: the shared queue's
    push(first, "later", scheduled_at=iso(LATER))
    for _ in range(2):
        push(second, "later", scheduled_at=iso(LATER))
    dead_letter(second, "dies")
    wanted = {"jobs known, every node": "5", "dead letters, every node": "1"}
    for port in (one.http_port, two.http_port):
        browser = Browser(port)
        text = wait_until(
            lambda b=browser: overview_shows(b, wanted), f"the figures on port {port}", DEADLINE
        )
        assert "could not be read" not in text, text
        assert "submitted/s, this node" in cards(text) and "Throughput of this node" in text


def test_a_node_that_does_not_answer_leaves_the_pages_working(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    """A stopped node (its lease long enough to count as alive meanwhile) does not answer the
    questions for its workers and its jobs: the pages show this node's part and say so."""
    (one, two), first, second = runners(nodes, schema, "--node-lease", "120")
    assert one.http_port is not None
    here = Browser(one.http_port)
    registered = first.request("POST", "/ojs/v1/workers/register", {"worker_id": "w-one"})
    assert registered.status in (200, 201), registered.raw
    push(first, "stalled")
    mine = push(first, "stalled", scheduled_at=iso(LATER))
    dead_letter(first, "dies-here")
    dead_letter(second, "dies-there")
    push(second, "stalled", scheduled_at=iso(LATER))
    # Five jobs: on each node a scheduled job and a discarded one (finished jobs are kept an
    # hour), and the first job pushed, which no worker waited for, in the shared queue.
    wait_until(
        lambda: overview_shows(
            here, {"jobs known, every node": "5", "dead letters, every node": "2"}
        ),
        "both nodes' jobs and dead letters on the overview",
        DEADLINE,
    )
    os.kill(two.proc.pid, signal.SIGSTOP)
    try:
        for path in ("/ui/workers", "/"):
            page = here.get(path)  # after the question's timeout (5 s)
            assert page.status == 200, (path, page.status, page.text[:500])
            assert "the other nodes&#39; workers could not be read" in page.text, page.text
            assert path == "/" or 'data-worker="w-one"' in page.text, page.text
        # The overview (the last page read): this node's figures, and why.
        assert "the cluster&#39;s job counts could not be read" in page.text, page.text
        shown = cards(page.text)
        assert shown["jobs known, this node"] == "2", shown
        assert shown["dead letters, this node"] == "1", shown
        page = here.get("/ui/jobs?list=scheduled")
        assert page.status == 200, page.text[:500]
        assert "the other nodes&#39; scheduled jobs could not be read" in page.text, page.text
        assert f'<tr data-job="{mine}">' in page.text and "(1 in all)" in page.text, page.text
    finally:
        os.kill(two.proc.pid, signal.SIGCONT)


def test_the_job_lists_and_the_search_cover_every_node(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    """The first node lists both nodes' scheduled jobs in one order, 50 a page, each with its
    node (the other node's without a checkbox); its search finds the second node's job by
    unique key; the second node's dead letter is in its dead list and opens read-only."""
    (one, two), first, second = runners(nodes, schema)
    assert one.http_port is not None and two.http_port is not None
    here, there = Browser(one.http_port), Browser(two.http_port)
    node_one, node_two = node_id(here), node_id(there)
    assert node_one != node_two

    # 30 scheduled jobs on each node, their times interleaved: even seconds on the first
    # (OJS), odd ones on the second (Gearman, each with a unique key).
    at: dict[str, int] = {}
    for i in range(30):
        at[push(first, "later", scheduled_at=iso(LATER + 2 * i))] = LATER + 2 * i
    with GearmanSocket(two) as gearman:
        for i in range(30):
            gearman.send(Cmd.SUBMIT_JOB_EPOCH, "later", f"later-{i}", str(LATER + 2 * i + 1), "x")
            at[gearman.expect(Cmd.JOB_CREATED).args[0].decode()] = LATER + 2 * i + 1
    in_order = sorted(at, key=lambda job_id: at[job_id])

    def both_pages() -> list[tuple[str, str]] | None:
        rows = listed(here, "/ui/jobs?list=scheduled") + listed(
            here, "/ui/jobs?list=scheduled&page=2"
        )
        return rows if [job_id for job_id, _ in rows] == in_order else None

    rows = wait_until(both_pages, "both nodes' scheduled jobs, in order", DEADLINE)
    assert "(60 in all)" in here.get("/ui/jobs?list=scheduled").text
    assert listed(here, "/ui/jobs?list=scheduled&page=3") == []
    for job_id, row in rows:
        node = node_one if at[job_id] % 2 == 0 else node_two
        assert f'<td class="node">{node}</td>' in row, row
        assert ('type="checkbox"' in row) == (node == node_one), row

    # By unique key: a job the second node holds, shown read-only.
    handle = in_order[2 * 7 + 1]
    found = here.get("/ui/jobs?q=later-7")
    location = f"/ui/jobs/{quote(handle, safe='')}"
    assert (found.status, found.headers.get("location")) == (303, location), found.text[:500]
    job = here.get(location).text
    assert "Another node of the cluster holds this job" in job and "later-7" in job, job
    assert '<dd class="state">scheduled' in job and "/cancel" not in job, job

    # A dead letter of the second node: listed on the first with its node, opened read-only.
    dead = dead_letter(second, "dies")
    dead_rows = dict(
        wait_until(lambda: listed(here, "/ui/jobs?list=dead") or None, "the dead letter", DEADLINE)
    )
    assert list(dead_rows) == [dead], dead_rows
    row = dead_rows[dead]
    assert f'<td class="node">{node_two}</td>' in row and "boom: it broke" in row, row
    assert 'type="checkbox"' not in row, row
    page = here.get(f"/ui/jobs/{dead}")
    assert page.status == 200, page.text[:500]
    assert f"Node {node_two} of the cluster keeps this job" in page.text, page.text
    assert "(in the dead letter queue)" in page.text and "boom: it broke" in page.text
    for action in ("/retry", "/delete", "/cancel"):
        assert action not in page.text, (action, page.text)
    assert f"/ui/jobs/{dead}/delete" in there.get(f"/ui/jobs/{dead}").text  # on its node
    missing = here.get("/ui/jobs?q=no-such-job")  # every node answered: no note
    assert missing.status == 200 and "No job matches" in missing.text, missing.text[:500]
    assert "could not be read" not in missing.text, missing.text
