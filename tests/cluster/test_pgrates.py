"""Queue rate limits two nodes share (store/pgrates.py): the limit and its budget.

Real server processes on the local PostgreSQL, each test in a schema of its own, driven
through OJS HTTP. Waits poll for a condition up to a generous deadline. The bound checked
over a window only gets looser as the machine slows down (a slower run takes longer, and a
longer window allows more), so load cannot make it fail.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tests.cluster.conftest import start_nodes
from tests.interop.gearman_raw import wait_until
from tests.ojs.dsl import Runner
from tests.pg import Schema
from tests.servers import ServerProcess

pytestmark = pytest.mark.interop

LONG = 120.0
LIMIT = 4  # jobs a second


def api(node: ServerProcess) -> Runner:
    return Runner(f"http://127.0.0.1:{node.http_port}")


def push(node: ServerProcess, queue: str, limit: int | None = None) -> str:
    options: dict[str, Any] = {"queue": queue}
    if limit is not None:
        options["rate_limit"] = {"max_per_second": limit}
    job = {"type": "metered", "args": [1], "options": options}
    pushed = api(node).request("POST", "/ojs/v1/jobs", job)
    assert pushed.status == 201, pushed.raw
    return str(pushed.body["job"]["id"])


def limit_shown(node: ServerProcess, queue: str) -> int | None:
    got = api(node).request("GET", f"/ojs/v1/queues/{queue}/stats")
    assert got.status == 200, got.raw
    limit = got.body["queue"]["rate_limit"]
    return None if limit is None else int(limit)


def fetch(node: ServerProcess, queue: str, count: int) -> list[str]:
    """Fetch and ack: the ids handed out."""
    runner = api(node)
    got = runner.request("POST", "/ojs/v1/workers/fetch", {"queues": [queue], "count": count})
    assert got.status == 200, got.raw
    ids = [str(job["id"]) for job in got.body["jobs"]]
    for job_id in ids:
        acked = runner.request("POST", "/ojs/v1/workers/ack", {"job_id": job_id})
        assert acked.status == 200, acked.raw
    return ids


def test_a_rate_limit_set_on_one_node_holds_on_the_other(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    first, second = start_nodes(nodes, schema, 2, "--allow-reset", http=True)
    push(first, "metered", LIMIT)
    rows = schema.rows("SELECT queue, per_second FROM {schema}.queue_rates")
    assert rows == [("metered", LIMIT)]  # written before the push was answered
    wait_until(lambda: limit_shown(second, "metered") == LIMIT or None, "limit shared", LONG)
    for _ in range(3 * LIMIT):
        push(second, "metered")  # no limit of their own: the queue's holds
    handed = fetch(second, "metered", 3 * LIMIT)
    assert 1 <= len(handed) <= LIMIT, handed
    # A new limit set on the second node reaches the first; an admin reset lifts it on both.
    push(second, "metered", LIMIT + 1)
    wait_until(lambda: limit_shown(first, "metered") == LIMIT + 1 or None, "new limit", LONG)
    reset = api(first).request("POST", "/ojs/v1/admin/reset")
    assert reset.status == 200, reset.raw
    assert schema.rows("SELECT count(*) FROM {schema}.queue_rates") == [(0,)]
    wait_until(lambda: limit_shown(second, "metered") is None or None, "limit lifted", LONG)


def test_two_nodes_together_hand_out_no_more_than_the_limit(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    first, second = start_nodes(nodes, schema, 2, http=True)
    push(first, "metered", LIMIT)
    wait_until(lambda: limit_shown(second, "metered") == LIMIT or None, "limit shared", LONG)
    jobs = 40
    for n in range(jobs - 1):
        push(first if n % 2 else second, "metered")
    handed: dict[str, list[str]] = {"first": [], "second": []}
    lock = threading.Lock()
    errors: list[BaseException] = []

    def total() -> int:
        with lock:
            return sum(len(ids) for ids in handed.values())

    def fetcher(name: str, node: ServerProcess) -> None:
        deadline = time.monotonic() + LONG
        try:
            while total() < jobs and time.monotonic() < deadline:
                ids = fetch(node, "metered", 10)
                with lock:
                    handed[name] += ids
                if not ids:
                    time.sleep(0.02)  # polling: the next fetch may find budget again
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=fetcher, args=("first", first)),
        threading.Thread(target=fetcher, args=("second", second)),
    ]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    assert not errors, errors
    every = handed["first"] + handed["second"]
    assert len(every) == jobs and len(set(every)) == jobs, handed
    # The cluster's bucket: at most LIMIT * (T + 1) in any T seconds; one more second of
    # slack. Each node alone (per-node limits) would have handed them out twice as fast.
    counts = {name: len(ids) for name, ids in handed.items()}
    assert jobs <= LIMIT * (elapsed + 2), (elapsed, counts)


def _push_keyed(node: ServerProcess, queue: str, keyed: dict[str, Any]) -> str:
    job = {"type": "metered", "args": [1], "options": {"queue": queue, "rate_limit": keyed}}
    pushed = api(node).request("POST", "/ojs/v1/jobs", job)
    assert pushed.status == 201, pushed.raw
    return str(pushed.body["job"]["id"])


def _fetch_only(node: ServerProcess, queue: str, count: int) -> list[str]:
    """Fetch without acking: the ids handed out, running until acked."""
    asked = {"queues": [queue], "count": count, "worker_id": "w1"}
    got = api(node).request("POST", "/ojs/v1/workers/fetch", asked)
    assert got.status == 200, got.raw
    return [str(job["id"]) for job in got.body["jobs"]]


def test_a_keys_concurrency_holds_across_the_nodes(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    first, second = start_nodes(nodes, schema, 2, http=True)
    keyed = {"key": "tenant-7", "concurrency": 1}
    pushed = [_push_keyed(first, "keyed", keyed) for _ in range(2)]
    running = _fetch_only(first, "keyed", 1)  # claims one of the two from the shared queue
    assert len(running) == 1, running
    # The other job waits in the shared queue: the second node claims it, and the key's
    # slot, held on the first node, keeps it waiting.
    for _ in range(3):
        assert _fetch_only(second, "keyed", 1) == []
    body = {"job_id": running[0], "worker_id": "w1"}
    acked = api(first).request("POST", "/ojs/v1/workers/ack", body)
    assert acked.status == 200, acked.raw
    # Once the first job stopped running, its slot is free: the second node hands the
    # other job out.
    other = wait_until(lambda: fetch(second, "keyed", 1) or None, "the key's slot", LONG)
    assert other == [job for job in pushed if job != running[0]]


def test_a_keys_rate_holds_across_the_nodes(schema: Schema, nodes: list[ServerProcess]) -> None:
    first, second = start_nodes(nodes, schema, 2, http=True)
    keyed = {"key": "tenant-9", "rate": 2, "period": "hour"}
    for _ in range(4):
        _push_keyed(first, "hourly", keyed)
    handed = fetch(first, "hourly", 1) + fetch(first, "hourly", 1)  # one claim each
    assert len(handed) == 2, handed  # the key's whole hour, on the first node
    # The second node claims the other two from the shared queue, and the key's shared
    # budget keeps them waiting: an hour's refill is far away.
    for _ in range(3):
        assert fetch(second, "hourly", 4) == []


def test_a_fetch_of_several_keys_gets_each_keys_own_answer(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    first, second = start_nodes(nodes, schema, 2, http=True)
    busy = {"key": "z-busy", "concurrency": 1}
    running = _push_keyed(first, "mixed", busy)
    waiting = _push_keyed(first, "mixed", busy)
    free = _push_keyed(first, "mixed", {"key": "a-free", "concurrency": 1})
    assert _fetch_only(first, "mixed", 1) == [running]
    # The second node claims both others; only the free key's job may run.
    assert _fetch_only(second, "mixed", 2) == [free]
    assert waiting not in _fetch_only(second, "mixed", 2)
