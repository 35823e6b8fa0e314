"""Workflows on a cluster (server/ojs/workflows.py): a workflow made on one node, its jobs
fetched and acked on the other; the node that made it moves it on, and either node answers
for it. Real nodes on the local PostgreSQL, every wait a condition polled up to a generous
deadline.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.cluster.conftest import start_node
from tests.cluster.test_cluster_ops import runners
from tests.interop.gearman_raw import wait_until
from tests.ojs.dsl import Runner
from tests.pg import Schema
from tests.servers import ServerProcess

pytestmark = pytest.mark.interop


def _step(kind: str, queue: str, order: int) -> dict[str, Any]:
    return {"type": kind, "args": [order], "options": {"queue": queue}}


def _create(node: Runner, body: dict[str, Any]) -> dict[str, Any]:
    made = node.request("POST", "/ojs/v1/workflows", body)
    assert made.status == 201, made.raw
    flow: dict[str, Any] = made.body["workflow"]
    return flow


def _fetch(node: Runner, queue: str) -> dict[str, Any]:
    """The next job of `queue` fetched on `node` (a new step comes a moment after the ack)."""

    def one() -> dict[str, Any] | None:
        asked = {"queues": [queue], "worker_id": "w-b"}
        fetched = node.request("POST", "/ojs/v1/workers/fetch", asked)
        assert fetched.status == 200, fetched.raw
        jobs: list[dict[str, Any]] = fetched.body["jobs"]
        return jobs[0] if jobs else None

    return wait_until(one, f"a job of {queue}")


def _ack(node: Runner, job_id: str, result: Any) -> None:
    body = {"job_id": job_id, "worker_id": "w-b", "result": result}
    acked = node.request("POST", "/ojs/v1/workers/ack", body)
    assert acked.status == 200, acked.raw


def _nack(node: Runner, job_id: str) -> None:
    body = {"job_id": job_id, "worker_id": "w-b", "error": {"message": "no"}}
    nacked = node.request("POST", "/ojs/v1/workers/nack", body)
    assert nacked.status == 200, nacked.raw


def _workflow(node: Runner, flow_id: str) -> dict[str, Any]:
    got = node.request("GET", f"/ojs/v1/workflows/{flow_id}")
    assert got.status == 200, got.raw
    flow: dict[str, Any] = got.body["workflow"]
    return flow


def test_a_chain_made_on_one_node_runs_every_step_on_the_other(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    _, first, second = runners(nodes, schema)
    steps = [_step("wf.chain", "wf-chain", order) for order in range(3)]
    flow = _create(first, {"type": "chain", "name": "across", "steps": steps})
    parents = []
    for order in range(3):
        job = _fetch(second, "wf-chain")  # only ever on the second node
        assert job["args"] == [order], job
        assert job.get("parent_results", []) == parents[-1:], job
        _ack(second, job["id"], {"done": order})
        parents.append({"done": order})
        # The ack was answered once the first node had moved the workflow on.
        assert _workflow(first, flow["id"])["steps_completed"] == order + 1
    seen = [_workflow(node, flow["id"]) for node in (first, second)]
    assert seen[0] == seen[1], seen
    assert (seen[0]["state"], seen[0]["jobs_completed"]) == ("completed", 3), seen[0]
    assert None not in seen[0]["job_ids"]


def test_a_batch_whose_job_failed_elsewhere_fails_and_runs_its_callbacks(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    _, first, second = runners(nodes, schema)
    once = {"retry": {"max_attempts": 1}}
    body = {
        "type": "batch",
        "jobs": [
            {**_step("wf.batch", "wf-batch", order), "options": {"queue": "wf-batch", **once}}
            for order in range(2)
        ],
        "callbacks": {
            "on_complete": _step("wf.done", "wf-callbacks", 0),
            "on_success": _step("wf.good", "wf-callbacks", 0),
            "on_failure": _step("wf.bad", "wf-callbacks", 0),
        },
    }
    flow = _create(first, body)
    jobs = sorted((_fetch(second, "wf-batch") for _ in range(2)), key=lambda job: job["args"])
    _ack(second, jobs[0]["id"], {"ok": True})
    _nack(second, jobs[1]["id"])  # its only attempt: discarded
    seen = wait_until(
        lambda: (flow_now := _workflow(second, flow["id"]))["state"] == "failed" and flow_now,
        "the batch failed",
    )
    assert (seen["jobs_completed"], seen["jobs_failed"]) == (1, 1), seen
    callbacks = {_fetch(second, "wf-callbacks")["type"] for _ in range(2)}
    assert callbacks == {"wf.done", "wf.bad"}
    assert set(seen["callback_job_ids"]) == {"on_complete", "on_failure"}


def test_a_chain_cancelled_on_the_other_node_cancels_its_waiting_step(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    _, first, second = runners(nodes, schema)
    steps = [_step("wf.cancel", "wf-cancel", order) for order in range(2)]
    flow = _create(first, {"type": "chain", "steps": steps})
    job_id = flow["job_ids"][0]
    # The first step waits in the shared queue: no worker is on either node.
    rows = "SELECT owner IS NULL FROM {schema}.jobs WHERE id = '" + job_id + "'"
    wait_until(lambda: schema.rows(rows) == [(True,)] or None, "the step in the shared queue")
    cancelled = second.request("DELETE", f"/ojs/v1/workflows/{flow['id']}")
    assert (cancelled.status, cancelled.body["workflow"]["state"]) == (200, "cancelled"), (
        cancelled.raw
    )
    for node in (first, second):
        assert node.request("GET", f"/ojs/v1/jobs/{job_id}").body["job"]["state"] == "cancelled"
        fetched = node.request(
            "POST", "/ojs/v1/workers/fetch", {"queues": ["wf-cancel"], "worker_id": "w"}
        )
        assert fetched.body["jobs"] == [], fetched.raw
        assert _workflow(node, flow["id"])["state"] == "cancelled"


def test_an_unknown_workflow_is_not_found_on_any_node(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    _, first, second = runners(nodes, schema)
    missing = "0190b5f0-0000-7000-8000-000000000000"
    for node in (first, second):
        for method in ("GET", "DELETE"):
            got = node.request(method, f"/ojs/v1/workflows/{missing}")
            assert (got.status, got.body["error"]["code"]) == (404, "not_found"), got.raw


def test_a_workflow_whose_node_died_is_taken_over_and_moves_on(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    (keeper, _), first, second = runners(nodes, schema, "--node-lease", "2")
    steps = [_step("wf.orphan", "wf-orphan", order) for order in range(2)]
    flow = _create(first, {"type": "chain", "name": "orphaned", "steps": steps})
    keeper.kill()  # the node keeping the workflow dies; the second finds it dead
    taken = wait_until(
        lambda: (
            (got := second.request("GET", f"/ojs/v1/workflows/{flow['id']}")).status == 200
            and got.body["workflow"]
        ),
        "the workflow taken over",
        90,
    )
    assert (taken["state"], taken["steps_completed"]) == ("running", 0), taken
    for order in range(2):
        job = _fetch(second, "wf-orphan")
        assert job["args"] == [order], job
        _ack(second, job["id"], {"done": order})
    done = _workflow(second, flow["id"])
    assert (done["state"], done["jobs_completed"]) == ("completed", 2), done


def test_a_step_that_ends_while_its_workflows_node_is_dead_reaches_the_node_taking_over(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    # The default lease: the end keeps trying for as long as finding the node dead takes.
    (keeper, _), first, second = runners(nodes, schema, "--node-lease", "15")
    steps = [_step("wf.late", "wf-late", order) for order in range(2)]
    flow = _create(first, {"type": "chain", "name": "late", "steps": steps})
    job = _fetch(second, "wf-late")
    keeper.kill()
    _ack(second, job["id"], {"done": 0})  # its end cannot reach the workflow's node now

    def next_step() -> dict[str, Any] | None:
        asked = {"queues": ["wf-late"], "worker_id": "w-b"}
        fetched = second.request("POST", "/ojs/v1/workers/fetch", asked)
        assert fetched.status == 200, fetched.raw
        jobs: list[dict[str, Any]] = fetched.body["jobs"]
        return jobs[0] if jobs else None

    later = wait_until(next_step, "the chain's next step", 100)
    assert (later["args"], later.get("parent_results")) == ([1], [{"done": 0}]), later
    _ack(second, later["id"], {"done": 1})
    done = _workflow(second, flow["id"])
    assert (done["state"], done["jobs_completed"]) == ("completed", 2), done


def test_a_step_end_whose_node_died_before_telling_it_moves_the_workflow_on_from_the_store(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    # A long lease: neither node takes the other's part over while the test runs; only the
    # node started at the end adopts both dead nodes' (their advisory locks are free).
    (keeper, worker), first, second = runners(nodes, schema, "--node-lease", "120")
    steps = [_step("wf.told", "wf-told", order) for order in range(2)]
    flow = _create(first, {"type": "chain", "name": "told", "steps": steps})
    job = _fetch(second, "wf-told")
    keeper.kill()
    _ack(second, job["id"], {"done": 0})  # committed; telling the workflow's node fails
    worker.kill()  # and with it the telling, still trying
    third = start_node(nodes, schema, http=True)
    node = Runner(f"http://127.0.0.1:{third.http_port}")
    later = _fetch(node, "wf-told")  # the step's end found in the store moved the chain on
    assert (later["args"], later.get("parent_results")) == ([1], [{"done": 0}]), later
    _ack(node, later["id"], {"done": 1})
    done = _workflow(node, flow["id"])
    assert (done["state"], done["jobs_completed"]) == ("completed", 2), done
    assert "a step's end found in the store" in third.log()
    assert not schema.rows("SELECT key FROM {schema}.kv WHERE namespace = 'workflow_step'")
