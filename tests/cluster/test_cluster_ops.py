"""OJS operations on a job another node holds (store/pgremote.py, server/ojs/operations.py):
a worker fetches from one node and acks, nacks, reports progress or beats on the other; a
client cancels on a node that does not hold the job. Real nodes on the local PostgreSQL,
every wait a condition polled up to a generous deadline.
"""

from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.cluster.conftest import start_nodes
from tests.interop.gearman_raw import wait_until
from tests.ojs.dsl import Response, Runner
from tests.pg import Schema
from tests.servers import ServerProcess

pytestmark = pytest.mark.interop


def runners(
    nodes: list[ServerProcess], schema: Schema, *args: str
) -> tuple[list[ServerProcess], Runner, Runner]:
    """Two nodes, and a runner on each: (nodes, first, second)."""
    started = start_nodes(nodes, schema, 2, *args, http=True)
    return started, *(Runner(f"http://127.0.0.1:{node.http_port}") for node in started)  # type: ignore[return-value]


def push(node: Runner, queue: str, **options: Any) -> str:
    pushed = node.request(
        "POST", "/ojs/v1/jobs", {"type": "t", "args": [1], "options": {"queue": queue, **options}}
    )
    assert pushed.status == 201, pushed.raw
    job_id: str = pushed.body["job"]["id"]
    return job_id


def fetch(node: Runner, queue: str, worker: str = "w1") -> dict[str, Any]:
    asked = {"queues": [queue], "worker_id": worker}
    fetched = node.request("POST", "/ojs/v1/workers/fetch", asked)
    assert fetched.status == 200 and len(fetched.body["jobs"]) == 1, fetched.raw
    job: dict[str, Any] = fetched.body["jobs"][0]
    return job


def state(node: Runner, job_id: str) -> str:
    got = node.request("GET", f"/ojs/v1/jobs/{job_id}")
    assert got.status == 200, got.raw
    value: str = got.body["job"]["state"]
    return value


def error_of(response: Response) -> tuple[int, str, str]:
    """What an error reply says, but for its request id."""
    return response.status, response.body["error"]["code"], response.body["error"]["message"]


def test_a_job_fetched_on_one_node_is_acked_on_the_other(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    _, first, second = runners(nodes, schema)
    job_id = push(first, "acks")
    job = fetch(second, "acks")
    assert job["id"] == job_id
    acked = first.request(
        "POST", "/ojs/v1/workers/ack", {"job_id": job_id, "worker_id": "w1", "result": {"n": 2}}
    )
    assert acked.status == 200, acked.raw
    assert (acked.body["state"], acked.body["job"]["result"]) == ("completed", {"n": 2})
    assert state(first, job_id) == state(second, job_id) == "completed"
    # The holder's answer, from either node: the same refusal of a second ack.
    again = [
        node.request("POST", f"/ojs/v1/jobs/{job_id}/ack", {"worker_id": "w1"})
        for node in (first, second)
    ]
    assert error_of(again[0]) == error_of(again[1]), [r.raw for r in again]
    assert again[0].status == 409
    ident = {"X-Request-Id": "req-from-client"}
    named = first.request("POST", f"/ojs/v1/jobs/{job_id}/ack", {}, ident)
    assert named.body["error"]["request_id"] == named.headers["x-request-id"] == "req-from-client"


def test_a_nack_on_the_other_node_retries_the_job_as_its_policy_says(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    _, first, second = runners(nodes, schema)
    retry = {"max_attempts": 2, "initial_interval": "PT0.1S", "backoff_coefficient": 1.0}
    job_id = push(first, "nacks", retry=retry)
    fetch(second, "nacks")
    error = {"code": "boom", "message": "it broke", "retryable": True}
    nacked = first.request(
        "POST", "/ojs/v1/workers/nack", {"job_id": job_id, "worker_id": "w1", "error": error}
    )
    assert nacked.status == 200, nacked.raw
    assert (nacked.body["attempt"], nacked.body["max_attempts"]) == (1, 2)
    assert nacked.body["state"] in ("retryable", "available"), nacked.raw
    assert 0 < nacked.body["retry_delay_ms"] < 1000, nacked.raw  # 100 ms, with its jitter
    # The second attempt: fetched from the node holding the job (it keeps its retry).
    again = wait_until(lambda: _fetch_any(second, "nacks"), "the retry", 60)
    assert (again["id"], again["attempt"]) == (job_id, 2)
    last = first.request(
        "POST", "/ojs/v1/workers/nack", {"job_id": job_id, "worker_id": "w1", "error": error}
    )
    assert (last.status, last.body["state"]) == (200, "discarded"), last.raw
    assert state(second, job_id) == state(first, job_id) == "discarded"


def _fetch_any(node: Runner, queue: str) -> dict[str, Any] | None:
    fetched = node.request("POST", "/ojs/v1/workers/fetch", {"queues": [queue], "worker_id": "w1"})
    jobs: list[dict[str, Any]] = fetched.body["jobs"]
    return jobs[0] if jobs else None


def test_a_job_waiting_in_the_shared_queue_is_cancelled_on_any_node(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    _, first, second = runners(nodes, schema)
    job_id = push(first, "cancels")
    assert schema.rows("SELECT owner IS NULL FROM {schema}.jobs") == [(True,)]
    cancelled = second.request("DELETE", f"/ojs/v1/jobs/{job_id}")
    assert (cancelled.status, cancelled.body["job"]["state"]) == (200, "cancelled"), cancelled.raw
    assert state(first, job_id) == state(second, job_id) == "cancelled"
    assert _fetch_any(first, "cancels") is None and _fetch_any(second, "cancels") is None
    twice = [node.request("DELETE", f"/ojs/v1/jobs/{job_id}") for node in (first, second)]
    assert error_of(twice[0]) == error_of(twice[1]) and twice[0].status == 409, twice[0].raw


def test_a_job_another_node_holds_is_cancelled_there(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    _, first, second = runners(nodes, schema)
    # A scheduled job stays on the node it was pushed to until it is due.
    job_id = push(first, "later", scheduled_at="2099-01-01T00:00:00Z")
    owner = "SELECT owner IS NOT NULL FROM {schema}.jobs"
    wait_until(lambda: schema.rows(owner) == [(True,)] or None, "the row written")
    assert state(second, job_id) == "scheduled"
    cancelled = second.request("DELETE", f"/ojs/v1/jobs/{job_id}")
    assert (cancelled.status, cancelled.body["job"]["state"]) == (200, "cancelled"), cancelled.raw
    assert state(first, job_id) == state(second, job_id) == "cancelled"


def test_progress_and_heartbeats_reach_the_node_holding_the_job(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    _, first, second = runners(nodes, schema)
    job_id = push(first, "long")
    fetch(second, "long", worker="w9")
    reported = first.request(
        "PUT", f"/ojs/v1/jobs/{job_id}/progress", {"progress": 0.5, "message": "half"}
    )
    assert (reported.status, reported.body["progress"]) == (200, 0.5), reported.raw
    read = second.request("GET", f"/ojs/v1/jobs/{job_id}/progress")
    assert (read.body["progress"], read.body["message"]) == (0.5, "half"), read.raw
    assert first.request("GET", f"/ojs/v1/jobs/{job_id}/progress").body == read.body
    beat = first.request(
        "POST",
        "/ojs/v1/workers/heartbeat",
        {"worker_id": "w9", "active_jobs": [job_id], "visibility_timeout_ms": 60000},
    )
    assert (beat.status, beat.body["jobs_extended"]) == (200, [job_id]), beat.raw
    stranger = first.request(
        "PUT", f"/ojs/v1/jobs/{job_id}/progress", {"progress": 0.7, "worker_id": "w2"}
    )
    assert stranger.status == 409, stranger.raw
    assert "not held by worker w2" in stranger.body["error"]["message"]


def test_unknown_jobs_are_not_found_on_any_node(schema: Schema, nodes: list[ServerProcess]) -> None:
    _, first, _second = runners(nodes, schema)
    missing = "no-such-job"
    calls = [
        ("GET", f"/ojs/v1/jobs/{missing}", None),
        ("DELETE", f"/ojs/v1/jobs/{missing}", None),
        ("POST", "/ojs/v1/workers/ack", {"job_id": missing}),
        ("POST", "/ojs/v1/workers/nack", {"job_id": missing, "error": {"message": "x"}}),
        ("PUT", f"/ojs/v1/jobs/{missing}/progress", {"progress": 0.1}),
        ("GET", f"/ojs/v1/jobs/{missing}/progress", None),
    ]
    for method, path, body in calls:
        answer = first.request(method, path, *([body] if body is not None else []))
        assert (answer.status, answer.body["error"]["code"]) == (404, "not_found"), answer.raw


def test_an_ack_after_the_holder_was_killed_gets_a_clear_answer_and_the_job_runs_again(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    (survivor_node, doomed), survivor, holder = runners(nodes, schema, "--node-lease", "2")
    job_id = push(survivor, "fragile")
    assert fetch(holder, "fragile")["attempt"] == 1
    os.kill(doomed.proc.pid, signal.SIGKILL)
    doomed.proc.wait()
    acked = survivor.request("POST", "/ojs/v1/workers/ack", {"job_id": job_id, "worker_id": "w1"})
    # Refused, not hung: the lease died with its node (its lock went with its connection,
    # long before its lease runs out); the job waits to run again.
    assert error_of(acked) == (409, "conflict", f"job {job_id} is available, not held by worker w1")
    again = wait_until(lambda: _fetch_any(survivor, "fragile"), "the job back", 60)
    assert (again["id"], again["attempt"]) == (job_id, 2)
    done = survivor.request("POST", "/ojs/v1/workers/ack", {"job_id": job_id, "worker_id": "w1"})
    assert done.status == 200, done.raw
    assert "running ack" not in survivor_node.log()


def test_a_pending_job_is_activated_on_any_node_even_once_its_node_died(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    """A job pushed pending waits for its activation, which no claim gives it. Activated on
    the other node, it is activated where it is kept; once that node died (its row then
    nobody's, still pending), the node that is asked to activate it takes it first."""
    (_, doomed), survivor, keeper = runners(nodes, schema, "--node-lease", "2")
    staged = push(keeper, "staged", pending=True)
    assert state(survivor, staged) == "pending"
    activated = survivor.request("POST", f"/ojs/v1/jobs/{staged}/activate")
    assert (activated.status, activated.body["job"]["state"]) == (200, "available")
    ran = wait_until(lambda: _fetch_any(survivor, "staged"), "the activated job", 60)
    assert ran["id"] == staged
    orphan = push(keeper, "staged", pending=True)
    os.kill(doomed.proc.pid, signal.SIGKILL)
    doomed.proc.wait()

    def activate() -> Response | None:
        answer = survivor.request("POST", f"/ojs/v1/jobs/{orphan}/activate")
        return answer if answer.status != 503 else None  # its node's lease still runs

    activated = wait_until(activate, "the dead node's lease to run out", 60)
    assert (activated.status, activated.body["job"]["state"]) == (200, "available")
    again = wait_until(lambda: _fetch_any(survivor, "staged"), "the orphan activated", 60)
    assert (again["id"], again["attempt"]) == (orphan, 1)


def test_a_job_claimed_from_the_shared_queue_keeps_its_visibility_timeout(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    _, first, second = runners(nodes, schema)
    job_id = push(first, "abandoned", visibility_timeout_ms=1000)
    assert schema.rows("SELECT owner IS NULL FROM {schema}.jobs") == [(True,)]
    fetched = fetch(second, "abandoned")
    assert fetched["id"] == job_id
    # Not acked: back in its queue once its second runs out (the default lease is 30 min),
    # on the node that held it.
    wait_until(lambda: state(first, job_id) == "available" or None, "the lease to run out", 60)
    again = wait_until(lambda: _fetch_any(second, "abandoned"), "the job again", 60)
    assert (again["id"], again["attempt"]) == (job_id, 2)


def test_an_ack_for_a_stalled_holder_is_answered_503_then_goes_through_once_it_resumes(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    # A lease far longer than the test: the stopped node stays a live node throughout.
    (_, stalled), first, holder = runners(nodes, schema, "--node-lease", "120")
    job_id = push(first, "stalls")
    fetch(holder, "stalls")
    os.kill(stalled.proc.pid, signal.SIGSTOP)
    try:
        acked = first.request("POST", "/ojs/v1/workers/ack", {"job_id": job_id})
        assert acked.status == 503, acked.raw
        assert (acked.body["error"]["code"], acked.body["error"]["retryable"]) == (
            "backend_error",
            True,
        )
        assert acked.headers["retry-after"] == "1"
    finally:
        os.kill(stalled.proc.pid, signal.SIGCONT)
    # What the stalled node was asked meanwhile waits in its channel: it ran the ack once it
    # resumed, or it runs the one sent again now; either way, the job completes once.
    again = wait_until(
        lambda: first.request("POST", "/ojs/v1/workers/ack", {"job_id": job_id}), "an answer"
    )
    assert again.status in (200, 409), again.raw
    assert state(first, job_id) == state(holder, job_id) == "completed"


def test_an_ack_too_large_for_a_notification_goes_through_the_relay_both_ways(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    _, first, second = runners(nodes, schema)
    job_id = push(first, "large")
    fetch(second, "large")
    result = {"text": "x" * 20_000}  # the ask and the reply: over 7,900 bytes each
    acked = first.request("POST", "/ojs/v1/workers/ack", {"job_id": job_id, "result": result})
    assert (acked.status, acked.body["job"]["result"]) == (200, result), acked.raw[:300]
    assert schema.rows("SELECT count(*) FROM {schema}.relay") == [(0,)]  # each row taken


def test_an_operation_on_a_job_held_elsewhere_is_refused_503_while_the_database_is_away(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    (first_node, _), first, second = runners(nodes, schema)
    job_id = push(first, "away")
    fetch(second, "away")
    schema.go_away()
    try:
        acked = first.request("POST", "/ojs/v1/workers/ack", {"job_id": job_id})
        assert acked.status == 503, acked.raw
        assert "the database is unreachable" in acked.body["error"]["message"]
    finally:
        schema.come_back()
    done = wait_until(
        lambda: (
            first.request("POST", "/ojs/v1/workers/ack", {"job_id": job_id}).status == 200 or None
        ),
        "the ack once the database is back",
        60,
    )
    assert done
    assert "Traceback" not in first_node.log()


def test_a_job_id_the_client_chose_is_refused_on_every_node_while_a_job_has_it(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    _, first, second = runners(nodes, schema)
    chosen = "019539a4-aaaa-7000-8000-111111111111"
    body = {"type": "t", "args": [1], "id": chosen, "options": {"queue": "chosen"}}
    made = first.request("POST", "/ojs/v1/jobs", body)
    assert (made.status, made.body["job"]["id"]) == (201, chosen), made.raw
    queued = second.request("POST", "/ojs/v1/jobs", body)  # its row in the shared queue
    assert error_of(queued)[:2] == (409, "duplicate"), queued.raw
    job = fetch(second, "chosen")
    acked = second.request("POST", "/ojs/v1/workers/ack", {"job_id": job["id"], "worker_id": "w1"})
    assert acked.status == 200, acked.raw
    finished = first.request("POST", "/ojs/v1/jobs", body)  # only the second node knows it now
    assert error_of(finished)[:2] == (409, "duplicate"), finished.raw
    fresh = {**body, "id": "019539a4-aaaa-7000-8000-222222222222"}
    assert second.request("POST", "/ojs/v1/jobs", fresh).status == 201


def test_a_job_id_pushed_on_two_nodes_at_once_makes_one_job(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    """A client that timed out pushes again through the other node: whichever push comes
    second, even in the same moment, is refused (the ids' locks, store/pgids.py)."""
    _, first, second = runners(nodes, schema)
    ids = [f"019539a4-bbbb-7000-8000-{n:012d}" for n in range(24)]

    def push_on(node: Runner, job_id: str) -> int:
        body = {"type": "t", "args": [job_id], "id": job_id, "options": {"queue": "twice"}}
        return node.request("POST", "/ojs/v1/jobs", body).status

    with ThreadPoolExecutor(max_workers=len(ids) * 2) as pool:
        answers = {
            job_id: [pool.submit(push_on, node, job_id) for node in (first, second)]
            for job_id in ids
        }
        statuses = {
            job_id: sorted(f.result() for f in futures) for job_id, futures in answers.items()
        }
    assert all(got == [201, 409] for got in statuses.values()), statuses
    seen: list[str] = []
    while len(seen) < len(ids):
        fetched = first.request(
            "POST", "/ojs/v1/workers/fetch", {"queues": ["twice"], "worker_id": "w", "count": 10}
        )
        assert fetched.status == 200 and fetched.body["jobs"], (seen, fetched.raw)
        seen += [job["id"] for job in fetched.body["jobs"]]
    assert sorted(seen) == ids
    assert (
        second.request(
            "POST", "/ojs/v1/workers/fetch", {"queues": ["twice"], "worker_id": "w"}
        ).body["jobs"]
        == []
    )


def test_two_batches_with_the_same_ids_on_two_nodes_at_once_make_one_set_of_jobs(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    _, first, second = runners(nodes, schema)
    rounds = 6
    for n in range(rounds):
        ids = [f"019539a4-cccc-7000-8000-{n:06d}{k:06d}" for k in range(8)]
        jobs = [{"type": "t", "args": [i], "id": i, "options": {"queue": "batches"}} for i in ids]
        batches = ({"jobs": jobs}, {"jobs": jobs[::-1]})  # the locks are taken in one order
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = [
                pool.submit(node.request, "POST", "/ojs/v1/jobs/batch", batch)
                for node, batch in zip((first, second), batches, strict=True)
            ]
            replies = [f.result() for f in futures]
        assert sorted(r.status for r in replies) == [201, 409], [r.raw for r in replies]
        refused = next(r for r in replies if r.status == 409)
        assert refused.body["error"]["code"] == "duplicate", refused.raw
        assert "no job of the batch was created" in refused.body["error"]["message"]
    counts = first.request("GET", "/ojs/v1/queues/batches/stats")
    assert counts.status == 200, counts.raw
    assert counts.body["queue"]["total"] == rounds * 8, counts.raw
