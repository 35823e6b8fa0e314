"""Several `jobwire serve` nodes on one PostgreSQL schema: one cluster (store/pgcluster.py).

Real server processes on the local PostgreSQL, each test in a schema of its own (tests/pg.py).
Every wait polls for a condition up to a generous deadline; the fallback poll is set to 60 s,
so a job that moves between nodes well before that moved on a notification, not the poll.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from jobwire.store.pgcluster import CLAIM_BATCH
from tests.cluster.conftest import POLL, start_node, start_nodes
from tests.interop.gearman_raw import DEADLINE, Cmd, GearmanSocket, wait_until
from tests.interop.gearman_raw import status as status_of
from tests.ojs.dsl import Runner
from tests.pg import Schema
from tests.servers import ServerProcess

pytestmark = pytest.mark.interop


def start_cluster(
    nodes: list[ServerProcess], schema: Schema, *args: str, http: bool = False
) -> tuple[ServerProcess, ServerProcess]:
    first, second = start_nodes(nodes, schema, 2, *args, http=http)
    return first, second


def sleeping_worker(node: ServerProcess, function: str) -> GearmanSocket:
    """A worker that has asked for work, found none and sleeps (PRE_SLEEP)."""
    worker = GearmanSocket(node)
    worker.send(Cmd.CAN_DO, function)
    assert worker.grab().type == Cmd.NO_JOB
    worker.send(Cmd.PRE_SLEEP)
    return worker


def wake_and_grab(worker: GearmanSocket) -> tuple[str, bytes]:
    """Wait for the NOOP, then grab: (handle, payload)."""
    assert worker.expect(Cmd.NOOP)
    assigned = worker.grab()
    assert assigned.type == Cmd.JOB_ASSIGN_UNIQ, assigned
    handle, _function, _unique, payload = assigned.args
    return handle.decode(), payload


def push_reports(runner: Runner, queue: str, count: int) -> list[str]:
    """`count` OJS jobs of type "report" pushed to `queue`: their ids, in push order."""
    ids = []
    for n in range(count):
        pushed = runner.request(
            "POST", "/ojs/v1/jobs", {"type": "report", "args": [n], "options": {"queue": queue}}
        )
        assert pushed.status == 201, pushed.raw
        ids.append(pushed.body["job"]["id"])
    return ids


def test_a_job_submitted_on_one_node_wakes_a_sleeping_worker_on_another(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    first, second = start_cluster(nodes, schema)
    with sleeping_worker(second, "shared") as worker, GearmanSocket(first) as client:
        started = time.monotonic()
        handle = client.submit_bg("shared", "from the first node")
        assert wake_and_grab(worker) == (handle, b"from the first node")
        assert time.monotonic() - started < float(POLL) / 2  # notified, not polled
        worker.send(Cmd.WORK_COMPLETE, handle, "done")
    wait_until(lambda: schema.rows("SELECT count(*) FROM {schema}.jobs") == [(0,)] or None, "gone")
    assert "claiming failed" not in second.log()


def test_a_scheduled_job_that_comes_due_where_no_worker_is_free_goes_to_one_that_waits(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    """The node a scheduled job was submitted to keeps it until it is due, then offers it
    to the shared queue when none of its workers is free: the other node's sleeping worker
    is woken by the notification. Before, the job stayed queued on its node until the
    other node asked again (the poll, 60 s here) while that worker slept."""
    first, second = start_cluster(nodes, schema)
    with sleeping_worker(second, "timed") as worker, GearmanSocket(first) as client:
        due = str(int(time.time()) + 2)
        handle = (
            client.request(Cmd.SUBMIT_JOB_EPOCH, "timed", "", due, "later", reply=Cmd.JOB_CREATED)
            .args[0]
            .decode()
        )
        assert wake_and_grab(worker) == (handle, b"later")
        assert time.time() >= int(due)  # not before it was due
        worker.send(Cmd.WORK_COMPLETE, handle, "done")
    wait_until(lambda: schema.rows("SELECT count(*) FROM {schema}.jobs") == [(0,)] or None, "gone")


def test_a_dead_node_s_scheduled_job_runs_elsewhere_when_it_comes_due(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    """A node SIGKILLed while it keeps a scheduled job: the job goes back to the shared queue
    once the node's lease ran out, still not due, and no notification will say when it is.
    The other node's sleeping worker gets it when it comes due: the node planned a claim
    for then. Before, it waited for the poll (60 s here)."""
    doomed, survivor = start_cluster(nodes, schema, "--node-lease", "2")
    with sleeping_worker(survivor, "timed") as worker, GearmanSocket(doomed) as client:
        due = int(time.time()) + 15  # well after the lease runs out
        handle = (
            client.request(Cmd.SUBMIT_JOB_EPOCH, "timed", "", str(due), "x", reply=Cmd.JOB_CREATED)
            .args[0]
            .decode()
        )
        doomed.kill()  # SIGKILL
        wait_until(
            lambda: schema.rows("SELECT owner IS NULL FROM {schema}.jobs") == [(True,)] or None,
            "the job back in the shared queue",
        )
        assert time.time() < due, "reaped only once due: this test would not tell"
        assert wake_and_grab(worker) == (handle, b"x")
        assert time.time() >= due  # not before it was due
        worker.send(Cmd.WORK_COMPLETE, handle, "done")
    wait_until(lambda: schema.rows("SELECT count(*) FROM {schema}.jobs") == [(0,)] or None, "gone")


def test_one_fetch_on_a_node_gets_a_job_pushed_on_another(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    first, second = start_cluster(nodes, schema, http=True)
    pusher = Runner(f"http://127.0.0.1:{first.http_port}")
    fetcher = Runner(f"http://127.0.0.1:{second.http_port}")
    pushed = pusher.request(
        "POST", "/ojs/v1/jobs", {"type": "report", "args": [7], "options": {"queue": "q1"}}
    )
    assert pushed.status == 201, pushed.raw
    job_id = pushed.body["job"]["id"]
    # No worker on the first node: the job waits in the shared queue, and the second node
    # polls it only every minute, so only the fetch's own claim can find it.
    assert schema.rows("SELECT owner IS NULL FROM {schema}.jobs") == [(True,)]
    fetched = fetcher.request("POST", "/ojs/v1/workers/fetch", {"queues": ["q1"], "count": 2})
    assert fetched.status == 200, fetched.raw
    jobs = fetched.body["jobs"]
    assert [(job["id"], job["args"], job["attempt"]) for job in jobs] == [(job_id, [7], 1)]
    acked = fetcher.request("POST", "/ojs/v1/workers/ack", {"job_id": job_id, "result": {"ok": 1}})
    assert acked.status == 200, acked.raw
    done = fetcher.request("GET", f"/ojs/v1/jobs/{job_id}")
    assert (done.status, done.body["job"]["state"]) == (200, "completed"), done.raw
    wait_until(lambda: schema.rows("SELECT count(*) FROM {schema}.jobs") == [(0,)] or None, "gone")
    assert "claiming for a fetch failed" not in second.log()


def test_a_fetch_claims_no_more_shared_jobs_than_it_misses(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    first, second = start_cluster(nodes, schema, http=True)
    pusher = Runner(f"http://127.0.0.1:{first.http_port}")
    fetcher = Runner(f"http://127.0.0.1:{second.http_port}")
    ids = push_reports(pusher, "q2", 3)
    assert schema.rows("SELECT count(*) FROM {schema}.jobs WHERE owner IS NULL") == [(3,)]
    fetched = fetcher.request("POST", "/ojs/v1/workers/fetch", {"queues": ["q2"], "count": 1})
    assert [job["id"] for job in fetched.body["jobs"]] == ids[:1], fetched.raw  # oldest first
    owned = "SELECT count(*) FROM {schema}.jobs WHERE owner IS NOT NULL"
    assert schema.rows(owned) == [(1,)]  # one claim statement, LIMIT 1
    rest = fetcher.request("POST", "/ojs/v1/workers/fetch", {"queues": ["q2"], "count": 5})
    assert [job["id"] for job in rest.body["jobs"]] == ids[1:], rest.raw


def test_a_fetch_answers_with_what_it_has_when_the_shared_queue_is_unreachable(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    _first, second = start_cluster(nodes, schema, http=True)
    fetcher = Runner(f"http://127.0.0.1:{second.http_port}")
    schema.go_away()
    try:
        fetched = fetcher.request("POST", "/ojs/v1/workers/fetch", {"queues": ["q1"]})
        assert (fetched.status, fetched.body["jobs"]) == (200, []), fetched.raw
        assert "claiming for a fetch failed" in second.log()
    finally:
        schema.come_back()


def test_a_killed_node_s_running_jobs_run_again_elsewhere_once_with_the_attempt_counted(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    doomed, survivor = start_cluster(nodes, schema, "--node-lease", "2")
    holders = [GearmanSocket(doomed) for _ in range(3)]
    for holder in holders:
        holder.send(Cmd.CAN_DO, "fragile")
    handles: set[str] = set()
    with GearmanSocket(doomed) as client:
        for i in range(3):
            handles.add(client.submit_bg("fragile", f"job {i}"))
    held = set()
    for holder in holders:  # each runs one: a free worker, so the node kept every job
        assigned = holder.grab()
        assert assigned.type == Cmd.JOB_ASSIGN_UNIQ, assigned
        held.add(assigned.args[0].decode())
    assert held == handles

    def running_on_doomed() -> bool | None:
        rows = schema.rows("SELECT state, attempts, owner IS NOT NULL FROM {schema}.jobs")
        return rows == [(4, 1, True)] * 3 or None  # ACTIVE, one attempt, owned

    wait_until(running_on_doomed, "the leases stored")
    workers = [sleeping_worker(survivor, "fragile") for _ in range(3)]
    doomed.kill()  # SIGKILL
    for holder in holders:
        holder.close()
    ran: list[str] = []
    for worker in workers:
        handle, _payload = wake_and_grab(worker)
        ran.append(handle)
    assert sorted(ran) == sorted(handles)  # each once

    def attempts() -> list[tuple[object, ...]] | None:
        rows = schema.rows("SELECT attempts FROM {schema}.jobs")
        return rows if rows == [(2,)] * 3 else None

    wait_until(attempts, "the second attempts stored")
    for worker, handle in zip(workers, ran, strict=True):
        worker.send(Cmd.WORK_COMPLETE, handle, "ok")
        assert worker.grab().type == Cmd.NO_JOB  # nothing else to run: none twice
        worker.close()
    wait_until(lambda: schema.rows("SELECT count(*) FROM {schema}.jobs") == [(0,)] or None, "gone")
    assert "found dead" in survivor.log()


def test_a_node_declared_dead_stops_and_writes_nothing_over_the_requeued_job(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    frozen, survivor = start_cluster(nodes, schema, "--node-lease", "2")
    holder = GearmanSocket(frozen)
    holder.send(Cmd.CAN_DO, "once")
    with GearmanSocket(frozen) as client:
        handle = client.submit_bg("once", "payload")
    assert holder.grab().args[0].decode() == handle
    wait_until(
        lambda: schema.rows("SELECT state FROM {schema}.jobs") == [(4,)] or None, "lease stored"
    )
    worker = sleeping_worker(survivor, "once")
    os.kill(frozen.proc.pid, signal.SIGSTOP)  # alive but silent: its lease runs out
    try:
        assert wake_and_grab(worker)[0] == handle
    finally:
        os.kill(frozen.proc.pid, signal.SIGCONT)
    holder.send(Cmd.WORK_COMPLETE, handle, "late")  # the old holder finishes: must not count

    def exited() -> int | None:
        return frozen.proc.poll()

    assert wait_until(exited, "the node declared dead stops", DEADLINE) != 0
    assert "declared dead" in frozen.log()
    survivor_node = schema.rows("SELECT owner FROM {schema}.jobs")
    assert len(survivor_node) == 1 and survivor_node[0][0] is not None  # still the survivor's
    worker.send(Cmd.WORK_COMPLETE, handle, "ok")
    wait_until(lambda: schema.rows("SELECT count(*) FROM {schema}.jobs") == [(0,)] or None, "gone")
    holder.close()
    worker.close()


def test_status_views_answer_for_jobs_another_node_or_no_node_holds(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    first, second = start_cluster(nodes, schema, http=True)
    holder = GearmanSocket(first)
    holder.send(Cmd.CAN_DO, "viewed")
    with GearmanSocket(first) as client:
        running = client.submit_bg("viewed", "held by the first node")
        assert holder.grab().args[0].decode() == running
        queued = client.submit_bg("viewed", "no worker is free: the shared queue")

    def stored() -> bool | None:
        rows = schema.rows("SELECT state, owner IS NULL FROM {schema}.jobs ORDER BY seq")
        return rows == [(4, False), (3, True)] or None

    wait_until(stored, "one job running on the first node, one in the shared queue")
    with GearmanSocket(second) as other:
        for handle, expected in ((running, (b"1", b"1")), (queued, (b"1", b"0"))):
            status = other.request(Cmd.GET_STATUS, handle, reply=Cmd.STATUS_RES)
            assert status.args[:3] == (handle.encode(), *expected)
        unknown = other.request(Cmd.GET_STATUS, "H:nowhere:1", reply=Cmd.STATUS_RES)
        assert unknown.args[1:3] == (b"0", b"0")
    assert status_of(second)["viewed"][:2] == (2, 1)  # gearadmin --status: every node's jobs
    api = Runner(f"http://127.0.0.1:{second.http_port}")
    job = api.request("GET", f"/ojs/v1/jobs/{running}")
    assert job.status == 200, job.raw
    assert (job.body["job"]["id"], job.body["job"]["state"]) == (running, "active")
    queues = api.request("GET", "/ojs/v1/queues").body["queues"]
    assert {queue["name"]: queue["available"] for queue in queues}["viewed"] == 1
    holder.send(Cmd.WORK_COMPLETE, running, "done")
    holder.close()


def test_a_foreground_client_on_one_node_hears_its_job_run_on_another(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    """Through the shared queue (the peer links carry it otherwise: test_peerlink.py)."""
    first, second = start_cluster(nodes, schema, "--peer-listen", "off")
    big = bytes(range(256)) * 80  # 20 kB: too large for a notification, sent through a row
    with sleeping_worker(second, "remote-fg") as worker, GearmanSocket(first) as client:
        handle = client.submit_fg("remote-fg", "question")
        assert wake_and_grab(worker) == (handle, b"question")
        worker.send(Cmd.WORK_STATUS, handle, "1", "2")
        worker.send(Cmd.WORK_DATA, handle, "part")
        worker.send(Cmd.WORK_COMPLETE, handle, big)
        assert client.expect(Cmd.WORK_STATUS).args == (handle.encode(), b"1", b"2")
        assert client.expect(Cmd.WORK_DATA).args == (handle.encode(), b"part")
        assert client.expect(Cmd.WORK_COMPLETE).args == (handle.encode(), big)
        failing = client.submit_fg("remote-fg", "doomed")
        worker.send(Cmd.PRE_SLEEP)
        assert wake_and_grab(worker) == (failing, b"doomed")
        worker.send(Cmd.WORK_FAIL, failing)
        assert client.expect(Cmd.WORK_FAIL).args == (failing.encode(),)
    wait_until(lambda: schema.rows("SELECT count(*) FROM {schema}.relay") == [(0,)] or None, "read")


def test_a_node_that_stops_hands_its_queued_jobs_to_the_others(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    leaving = start_node(nodes, schema)
    with GearmanSocket(leaving) as client:  # alone: it keeps every job
        handles = {client.submit_bg("handed", f"job {i}") for i in range(3)}
    assert schema.rows("SELECT count(*) FROM {schema}.jobs WHERE owner IS NULL") == [(0,)]
    staying = start_node(nodes, schema)
    worker = sleeping_worker(staying, "handed")
    assert leaving.stop() == 0  # SIGTERM: a clean stop
    ran = set()
    for _ in handles:
        handle, _payload = wake_and_grab(worker)
        ran.add(handle)
        worker.send(Cmd.WORK_COMPLETE, handle, "ok")
        worker.send(Cmd.PRE_SLEEP)
    assert ran == handles
    worker.close()


def test_jobs_a_node_kept_while_alone_run_on_a_node_whose_worker_waits(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    keeper = start_node(nodes, schema)
    with GearmanSocket(keeper) as client:  # alone: it keeps every job, and has no worker
        handles = {client.submit_bg("kept", f"job {i}") for i in range(4)}
    assert schema.rows("SELECT count(*) FROM {schema}.jobs WHERE owner IS NULL") == [(0,)]
    joiner = start_node(nodes, schema)
    for node in (keeper, joiner):
        wait_until(lambda node=node: "cluster: 2 nodes" in node.log() or None, "nodes meet", 60)
    worker = sleeping_worker(joiner, "kept")
    ran = set()
    started = time.monotonic()
    for _ in handles:  # the joiner asks, the keeper gives: by notification, not the poll
        handle, _payload = wake_and_grab(worker)
        ran.add(handle)
        worker.send(Cmd.WORK_COMPLETE, handle, "ok")
        worker.send(Cmd.PRE_SLEEP)
    assert ran == handles
    assert time.monotonic() - started < float(POLL) / 2
    worker.close()
    wait_until(lambda: schema.rows("SELECT count(*) FROM {schema}.jobs") == [(0,)] or None, "gone")
    assert keeper.proc.poll() is None  # it gave them; it did not have to stop first


def test_an_ojs_fetch_gets_the_jobs_another_node_kept_for_its_own_fetches(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    keeper, other = start_cluster(nodes, schema, http=True)
    on_keeper = Runner(f"http://127.0.0.1:{keeper.http_port}")
    on_other = Runner(f"http://127.0.0.1:{other.http_port}")
    # A fetch on the keeper makes it keep the queue's new jobs for its own fetches.
    assert on_keeper.request("POST", "/ojs/v1/workers/fetch", {"queues": ["kq"]}).status == 200
    ids = set(push_reports(on_keeper, "kq", 3))
    assert schema.rows("SELECT count(*) FROM {schema}.jobs WHERE owner IS NULL") == [(0,)]
    fetched: set[str] = set()

    def fetch_on_the_other() -> bool | None:
        reply = on_other.request("POST", "/ojs/v1/workers/fetch", {"queues": ["kq"], "count": 3})
        assert reply.status == 200, reply.raw
        fetched.update(job["id"] for job in reply.body["jobs"])
        return fetched == ids or None

    wait_until(fetch_on_the_other, "the other node's fetches got the kept jobs", DEADLINE)
    owners = schema.rows("SELECT DISTINCT owner FROM {schema}.jobs")
    assert len(owners) == 1 and owners[0][0] is not None  # all claimed by the other node
    for job_id in ids:
        acked = on_other.request("POST", "/ojs/v1/workers/ack", {"job_id": job_id})
        assert acked.status == 200, acked.raw


def test_a_waiting_worker_makes_its_node_claim_a_batch_not_one_job(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    """One connection may run many jobs at once (the SDK's worker slots): a claim for one
    waiting worker takes `CLAIM_BATCH` jobs in one statement, not one per round trip."""
    first, second = start_cluster(nodes, schema)
    with GearmanSocket(first) as client:  # no worker on the first node: all go to the shared queue
        for i in range(CLAIM_BATCH + 8):
            client.submit_bg("batched", f"job {i}")
    unowned = "SELECT count(*) FROM {schema}.jobs WHERE owner IS NULL"
    assert schema.rows(unowned) == [(CLAIM_BATCH + 8,)]
    with sleeping_worker(second, "batched") as worker:
        handle, _payload = wake_and_grab(worker)
        assert schema.rows(unowned) == [(8,)]  # one claim took the batch
        worker.send(Cmd.WORK_COMPLETE, handle, "ok")


def test_a_job_whose_lease_ran_out_goes_to_the_shared_queue_for_another_node(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    from tests.cluster.test_cluster_ops import fetch, push, runners

    _, first, second = runners(nodes, schema)
    job_id = push(first, "abandoned", visibility_timeout_ms=200)
    assert fetch(second, "abandoned", "gone")["id"] == job_id  # and never acked
    # The second node fetched from that queue a moment ago, yet the job does not wait
    # there: its fetcher let it go, so it goes back to the shared queue.
    owner = "SELECT owner IS NULL, state FROM {schema}.jobs WHERE id = '" + job_id + "'"
    wait_until(lambda: schema.rows(owner) == [(True, 3)] or None, "the job in the shared queue")
    for node in (first, second):  # the row carries why it runs again
        shown = node.request("GET", f"/ojs/v1/jobs/{job_id}").body["job"]
        assert shown["error"]["code"] == "visibility_timeout", shown
    again = fetch(first, "abandoned", "next")
    assert (again["id"], again["attempt"]) == (job_id, 2), again


def test_a_job_claimed_after_its_expiry_is_discarded_not_handed_out(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    from tests.cluster.test_cluster_ops import push, runners, state

    _, first, second = runners(nodes, schema)
    job_id = push(first, "expiring", expires_at="+PT1S")  # to the shared queue
    expires = first.request("GET", f"/ojs/v1/jobs/{job_id}").body["job"]["expires_at"]
    wait_until(
        lambda: (
            time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 1)) > expires[:19] or None
        ),
        "the job's expiry to pass",
    )
    asked = {"queues": ["expiring"], "worker_id": "late"}
    fetched = second.request("POST", "/ojs/v1/workers/fetch", asked)
    assert (fetched.status, fetched.body["jobs"]) == (200, []), fetched.raw
    assert state(first, job_id) == state(second, job_id) == "discarded"


def test_a_foreground_client_hears_its_job_failed_when_the_batch_that_shared_it_failed(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    """JOB_CREATED of a foreground job goes at once; the job leaves the engine for the shared
    queue with its batch. When that batch fails, the engine's retraction no longer sees the
    job: the cluster tells its client."""
    first, _second = start_cluster(nodes, schema)
    schema.rows(
        "ALTER TABLE {schema}.jobs ADD CONSTRAINT refuse_doomed CHECK (function <> 'doomed')"
    )
    with GearmanSocket(first) as client:
        handle = client.submit_fg("doomed", "nobody may store me")
        assert client.expect(Cmd.WORK_FAIL).args == (handle.encode(),)
        with sleeping_worker(first, "fine") as worker:  # the node serves on
            handle = client.submit_fg("fine", "hello")
            assert wake_and_grab(worker) == (handle, b"hello")
            worker.send(Cmd.WORK_COMPLETE, handle, "bye")
            assert client.expect(Cmd.WORK_COMPLETE).args == (handle.encode(), b"bye")
