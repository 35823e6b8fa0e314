"""State two nodes share (store/pgshared.py): unique keys, cron ticks, pauses.

Real server processes on the local PostgreSQL, each test in a schema of its own, driven
through the wire (Gearman packets, OJS HTTP). Every wait polls for a condition up to a
generous deadline; nothing depends on how long anything takes.
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import pytest

from tests.cluster.conftest import start_nodes
from tests.cluster.test_pgcluster import sleeping_worker, wake_and_grab
from tests.interop.gearman_raw import Cmd, GearmanSocket, wait_until
from tests.ojs.dsl import Runner
from tests.pg import Schema
from tests.servers import ServerProcess

pytestmark = pytest.mark.interop

#: Generous: the machine is shared, and cron fires once a second.
LONG = 120.0


def api(node: ServerProcess) -> Runner:
    return Runner(f"http://127.0.0.1:{node.http_port}")


def created(client: GearmanSocket) -> str:
    reply = client.expect(Cmd.JOB_CREATED)
    return str(reply.args[0].decode())


# ---------------------------------------------------------------------- unique keys


def test_the_same_unique_key_submitted_on_two_nodes_at_once_makes_one_job(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    first, second = start_nodes(nodes, schema, 2)
    keys = [f"key-{n}" for n in range(40)]
    with GearmanSocket(first) as one, GearmanSocket(second) as other:
        # Both nodes get every submit before either answers: their batches race for the keys.
        for key in keys:
            one.send(Cmd.SUBMIT_JOB_BG, "coalesce", key, f"one {key}")
            other.send(Cmd.SUBMIT_JOB_BG, "coalesce", key, f"other {key}")
        handles_one = [created(one) for _ in keys]
        handles_other = [created(other) for _ in keys]
    assert handles_one == handles_other  # each submit names the job that holds its key
    assert len(set(handles_one)) == len(keys)
    rows = schema.rows("SELECT id, ukey FROM {schema}.jobs ORDER BY id")
    assert sorted(row[0] for row in rows) == sorted(handles_one)
    assert sorted(str(row[1]).rpartition("\x1f")[2] for row in rows) == sorted(keys)
    # Each job runs once: a worker on the second node runs every one, claimed or its own.
    ran: list[str] = []
    with GearmanSocket(second) as worker:
        worker.send(Cmd.CAN_DO, "coalesce")
        while len(ran) < len(keys):
            assigned = worker.grab()
            if assigned.type == Cmd.NO_JOB:  # its node claims for it meanwhile
                worker.send(Cmd.PRE_SLEEP)
                assert worker.expect(Cmd.NOOP)
                continue
            ran.append(assigned.args[0].decode())
            worker.send(Cmd.WORK_COMPLETE, assigned.args[0], b"")
    wait_until(lambda: schema.rows("SELECT count(*) FROM {schema}.jobs") == [(0,)] or None, "run")
    assert sorted(ran) == sorted(handles_one)


def test_a_unique_job_waits_for_its_key_then_runs_and_frees_it(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    first, second = start_nodes(nodes, schema, 2)
    with GearmanSocket(first) as worker, GearmanSocket(first) as client:
        worker.send(Cmd.CAN_DO, "solo")
        assert worker.grab().type == Cmd.NO_JOB
        worker.send(Cmd.PRE_SLEEP)
        handle = client.submit_bg("solo", "payload", unique="the-key")
        # Kept on this node (its worker is free), run once its key is settled.
        assert worker.expect(Cmd.NOOP)
        assigned = worker.grab()
        assert (assigned.type, assigned.args[0].decode()) == (Cmd.JOB_ASSIGN_UNIQ, handle)
        with GearmanSocket(second) as late:
            assert late.submit_bg("solo", "other payload", unique="the-key") == handle
        worker.send(Cmd.WORK_COMPLETE, handle, "done")
    wait_until(lambda: schema.rows("SELECT count(*) FROM {schema}.jobs") == [(0,)] or None, "done")
    with GearmanSocket(second) as client:
        again = client.submit_bg("solo", "payload", unique="the-key")
    assert again != handle  # the key was freed with its job
    assert schema.rows("SELECT id FROM {schema}.jobs") == [(again,)]


def follows(node: ServerProcess, handle: str) -> bool:
    """Whether `node`'s clients of `handle`, a job another node holds, hear of it from now on
    (logged at DEBUG once it is arranged)."""
    return f"clients here follow job {handle}" in node.log()


def test_foreground_clients_on_two_nodes_of_one_unique_key_share_one_run(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    first, second = start_nodes(nodes, schema, 2, "--verbose", "DEBUG")
    with GearmanSocket(first) as one, GearmanSocket(second) as other:
        handle = one.submit_fg("shared-fg", "asked first", unique="the-key")
        # Held until the key is settled, then named after the job that holds it.
        assert other.submit_fg("shared-fg", "asked second", unique="the-key") == handle
        wait_until(lambda: follows(second, handle), "the second node's client follows it")
        # One worker, on the second node: it runs the first node's job, once.
        with sleeping_worker(second, "shared-fg") as worker:
            assert worker.expect(Cmd.NOOP)
            assigned = worker.grab()
            assert (assigned.args[0].decode(), assigned.args[-1]) == (handle, b"asked first")
            worker.send(Cmd.WORK_STATUS, handle, "1", "2")
            worker.send(Cmd.WORK_DATA, handle, "part")
            worker.send(Cmd.WORK_COMPLETE, handle, "answer")
            for client in (one, other):
                assert client.expect(Cmd.WORK_STATUS).args == (handle.encode(), b"1", b"2")
                assert client.expect(Cmd.WORK_DATA).args == (handle.encode(), b"part")
                assert client.expect(Cmd.WORK_COMPLETE).args == (handle.encode(), b"answer")
            assert worker.grab().type == Cmd.NO_JOB  # nothing else to run: it ran once
    wait_until(lambda: schema.rows("SELECT count(*) FROM {schema}.jobs") == [(0,)] or None, "done")
    with GearmanSocket(second) as client:  # its key went with it
        assert client.submit_bg("shared-fg", "again", unique="the-key") != handle


def test_the_same_unique_key_submitted_in_the_foreground_on_two_nodes_at_once_runs_once(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    first, second = start_nodes(nodes, schema, 2, "--verbose", "DEBUG")
    keys = [f"key-{n}" for n in range(20)]
    with GearmanSocket(first) as one, GearmanSocket(second) as other:
        # Both nodes get every submit before either answers: their batches race for the keys.
        for key in keys:
            one.send(Cmd.SUBMIT_JOB, "fg-race", key, f"one {key}")
            other.send(Cmd.SUBMIT_JOB, "fg-race", key, f"other {key}")
        handles = [created(one) for _ in keys]
        assert [created(other) for _ in keys] == handles
        assert len(set(handles)) == len(keys)
        for handle in handles:  # the clients of the node that lost the key follow the job
            wait_until(lambda h=handle: follows(first, h) or follows(second, h), "followed")
        ran: dict[str, bytes] = {}
        with GearmanSocket(second) as worker:
            worker.send(Cmd.CAN_DO, "fg-race")
            while len(ran) < len(keys):
                assigned = worker.grab()
                if assigned.type == Cmd.NO_JOB:  # its node claims for it meanwhile
                    worker.send(Cmd.PRE_SLEEP)
                    assert worker.expect(Cmd.NOOP)
                    continue
                handle, payload = assigned.args[0].decode(), assigned.args[-1]
                assert handle not in ran  # each once
                ran[handle] = payload
                worker.send(Cmd.WORK_COMPLETE, handle, payload.upper())
            assert worker.grab().type == Cmd.NO_JOB
        assert sorted(ran) == sorted(handles)
        expected = {(handle.encode(), payload.upper()) for handle, payload in ran.items()}
        for client in (one, other):
            got = {client.expect(Cmd.WORK_COMPLETE).args for _ in keys}
            assert got == expected
    wait_until(lambda: schema.rows("SELECT count(*) FROM {schema}.jobs") == [(0,)] or None, "done")


def test_a_foreground_client_joins_a_background_job_running_on_another_node(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    first, second = start_nodes(nodes, schema, 2, "--verbose", "DEBUG")
    with sleeping_worker(second, "fg-unique") as worker, GearmanSocket(first) as client:
        with GearmanSocket(second) as other:  # a background job with the key, there
            background = other.submit_bg("fg-unique", "queued", unique="same")
        assert worker.expect(Cmd.NOOP)
        assert worker.grab().args[0].decode() == background
        # The foreground submit on the other node joins it, as it would on one node.
        assert client.submit_fg("fg-unique", "asked", unique="same") == background
        wait_until(lambda: follows(first, background), "the client follows it")
        worker.send(Cmd.WORK_DATA, background, "part")
        worker.send(Cmd.WORK_COMPLETE, background, "answer")
        assert client.expect(Cmd.WORK_DATA).args == (background.encode(), b"part")
        assert client.expect(Cmd.WORK_COMPLETE).args == (background.encode(), b"answer")
        worker.send(Cmd.PRE_SLEEP)  # and nothing else was made to run
        assert worker.grab().type == Cmd.NO_JOB


def test_a_client_following_a_job_whose_node_died_hears_of_its_run_elsewhere(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    doomed, survivor = start_nodes(nodes, schema, 2, "--node-lease", "2", "--verbose", "DEBUG")
    with GearmanSocket(doomed) as holder, GearmanSocket(survivor) as client:
        holder.send(Cmd.CAN_DO, "fragile-key")
        with GearmanSocket(doomed) as other:
            handle = other.submit_bg("fragile-key", "payload", unique="k")
        assert holder.grab().args[0].decode() == handle  # running there
        assert client.submit_fg("fragile-key", "asked", unique="k") == handle
        wait_until(lambda: follows(survivor, handle), "the client follows it")
        with sleeping_worker(survivor, "fragile-key") as worker:
            doomed.kill()  # SIGKILL: its lease runs out, its job goes back to the shared queue
            assert wake_and_grab(worker) == (handle, b"payload")
            worker.send(Cmd.WORK_COMPLETE, handle, "answer")
            assert client.expect(Cmd.WORK_COMPLETE).args == (handle.encode(), b"answer")


def test_a_client_following_a_stalled_holder_is_answered_once_it_continues(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    """The holder's node does not answer (stopped, its lease long enough to outlast it): the
    client's node runs the job itself after a while, which finds the key still held and
    follows the holder again, until it answers. The job runs once."""
    stalled, asking = start_nodes(nodes, schema, 2, "--node-lease", "120", "--verbose", "DEBUG")
    with GearmanSocket(stalled) as worker, GearmanSocket(asking) as client:
        worker.send(Cmd.CAN_DO, "slow-key")
        with GearmanSocket(stalled) as other:
            handle = other.submit_bg("slow-key", "payload", unique="k")
        assert worker.grab().args[0].decode() == handle
        os.kill(stalled.proc.pid, signal.SIGSTOP)
        try:
            assert client.submit_fg("slow-key", "asked", unique="k") == handle
            wait_until(lambda: "running it here" in asking.log() or None, "given up asking", LONG)
        finally:
            os.kill(stalled.proc.pid, signal.SIGCONT)
        wait_until(lambda: follows(asking, handle), "the client follows it", LONG)
        worker.send(Cmd.WORK_COMPLETE, handle, "answer")
        assert client.expect(Cmd.WORK_COMPLETE).args == (handle.encode(), b"answer")
        assert worker.grab().type == Cmd.NO_JOB  # the job made in its place lost its key
    wait_until(lambda: schema.rows("SELECT count(*) FROM {schema}.jobs") == [(0,)] or None, "done")


def test_a_foreground_unique_job_a_node_cannot_run_reaches_its_client_from_another(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    first, second = start_nodes(nodes, schema, 2)
    with sleeping_worker(second, "fg-unique") as worker, GearmanSocket(first) as client:
        handle = client.submit_fg("fg-unique", "asked", unique="mine")
        # In the index with its key while it waits in the shared queue.
        rows = schema.rows("SELECT id, ukey FROM {schema}.jobs")
        assert rows == [(handle, "e\x1ffg-unique\x1fmine")]
        assert worker.expect(Cmd.NOOP)
        assigned = worker.grab()
        assert (assigned.args[0].decode(), assigned.args[-1]) == (handle, b"asked")
        worker.send(Cmd.WORK_COMPLETE, handle, "answer")
        assert client.expect(Cmd.WORK_COMPLETE).args == (handle.encode(), b"answer")
    wait_until(lambda: schema.rows("SELECT count(*) FROM {schema}.jobs") == [(0,)] or None, "done")


def test_a_background_submit_joins_a_foreground_job_another_node_holds(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    first, second = start_nodes(nodes, schema, 2)
    with GearmanSocket(first) as client, GearmanSocket(second) as other:
        handle = client.submit_fg("fg-held", "asked", unique="k")
        assert other.submit_bg("fg-held", "later", unique="k") == handle
        with sleeping_worker(second, "fg-held") as worker:
            assert worker.expect(Cmd.NOOP)
            assert worker.grab().args[0].decode() == handle
            worker.send(Cmd.WORK_COMPLETE, handle, "answer")
            assert client.expect(Cmd.WORK_COMPLETE).args == (handle.encode(), b"answer")
            worker.send(Cmd.PRE_SLEEP)
            assert worker.grab().type == Cmd.NO_JOB  # the background submit made no job


def test_an_ojs_unique_push_conflicts_with_the_job_another_node_holds(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    first, second = start_nodes(nodes, schema, 2, http=True)

    def push(node: ServerProcess, on_conflict: str) -> Any:
        body = {
            "type": "mail",
            "args": ["ann@example.com"],
            "options": {"queue": "mails", "unique": {"on_conflict": on_conflict}},
        }
        return api(node).request("POST", "/ojs/v1/jobs", body)

    pushed = push(first, "reject")
    assert pushed.status == 201, pushed.raw
    job_id = pushed.body["job"]["id"]
    assert pushed.body["job"]["state"] == "available"
    refused = push(second, "reject")
    assert refused.status == 409, refused.raw
    assert refused.body["error"]["details"]["existing_job_id"] == job_id
    joined = push(second, "ignore")
    assert joined.status == 200, joined.raw
    assert (joined.body["job"]["id"], joined.body["duplicate"]) == (job_id, True)
    assert schema.rows("SELECT id FROM {schema}.jobs") == [(job_id,)]


def _mail(on_conflict: str, to: str = "ann@example.com") -> dict[str, Any]:
    return {
        "type": "mail",
        "args": [to],
        "options": {"queue": "mails", "unique": {"on_conflict": on_conflict}},
    }


def test_an_ojs_batch_checks_its_unique_keys_against_the_whole_cluster(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    first, second = start_nodes(nodes, schema, 2, http=True)
    pushed = api(first).request("POST", "/ojs/v1/jobs", _mail("reject"))
    assert pushed.status == 201, pushed.raw
    holder = pushed.body["job"]["id"]
    plain = {"type": "mail", "args": ["bob@example.com"], "options": {"queue": "mails"}}
    # reject: the whole batch is refused, naming the job on the first node; nothing is made.
    batch = {"jobs": [plain, _mail("reject")]}
    refused = api(second).request("POST", "/ojs/v1/jobs/batch", batch)
    assert refused.status == 409, refused.raw
    details = refused.body["error"]["details"]
    assert (details["index"], details["existing_job_id"]) == (1, holder)
    assert schema.rows("SELECT id FROM {schema}.jobs") == [(holder,)]
    # ignore: the batch answers that job in its place, and makes the others.
    batch = {"jobs": [plain, _mail("ignore")]}
    joined = api(second).request("POST", "/ojs/v1/jobs/batch", batch)
    assert joined.status == 201, joined.raw
    made, answered = joined.body["jobs"]
    assert answered["id"] == holder and made["id"] != holder
    ids = {row[0] for row in schema.rows("SELECT id FROM {schema}.jobs")}
    assert ids == {holder, made["id"]}


def test_an_ojs_batchs_unique_keys_hold_for_pushes_on_another_node(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    first, second = start_nodes(nodes, schema, 2, http=True)
    batch = {"jobs": [_mail("reject", "a@example.com"), _mail("reject", "b@example.com")]}
    made = api(first).request("POST", "/ojs/v1/jobs/batch", batch)
    assert made.status == 201, made.raw
    ids = [job["id"] for job in made.body["jobs"]]
    refused = api(second).request("POST", "/ojs/v1/jobs", _mail("reject", "b@example.com"))
    assert refused.status == 409, refused.raw
    assert refused.body["error"]["details"]["existing_job_id"] == ids[1]
    again = api(second).request("POST", "/ojs/v1/jobs/batch", batch)
    assert again.status == 409, again.raw
    assert again.body["error"]["details"]["existing_job_id"] == ids[0]


def test_an_ojs_unique_policy_with_fewer_states_lets_a_push_on_another_node_pass_a_scheduled_holder(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    """The cluster's index holds a key while its job lives; the policy of the new push
    decides whether the holder, in the state it is in, conflicts."""
    first, second = start_nodes(nodes, schema, 2, http=True)

    def push(node: ServerProcess, states: list[str], **options: Any) -> Any:
        unique = {"keys": ["type", "args"], "on_conflict": "reject", "states": states}
        body = {
            "type": "report",
            "args": [7],
            "options": {"queue": "reports", "unique": unique, **options},
        }
        return api(node).request("POST", "/ojs/v1/jobs", body)

    later = push(first, ["scheduled", "available"], scheduled_at="+PT1H")
    assert later.status == 201, later.raw
    assert later.body["job"]["state"] == "scheduled"
    refused = push(second, ["scheduled", "available"])  # scheduled is among its states
    assert refused.status == 409, refused.raw
    assert refused.body["error"]["details"]["existing_job_id"] == later.body["job"]["id"]
    passed = push(second, ["available", "active"])  # a scheduled holder does not count
    assert passed.status == 201, passed.raw
    assert passed.body["job"]["id"] != later.body["job"]["id"]
    assert schema.rows("SELECT count(*) FROM {schema}.jobs") == [(2,)]


def test_an_ojs_replace_on_one_node_cancels_the_holder_on_the_other_and_takes_the_key(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    first, second = start_nodes(nodes, schema, 2, http=True)

    def push(node: ServerProcess, version: int, on_conflict: str = "replace") -> Any:
        body = {
            "type": "report",
            "args": [{"version": version}],
            "options": {
                "queue": "reports",
                "unique": {"keys": ["type"], "on_conflict": on_conflict},
            },
        }
        return api(node).request("POST", "/ojs/v1/jobs", body)

    old = push(first, 1)
    assert old.status == 201, old.raw
    new = push(second, 2)
    assert new.status == 201, new.raw
    assert new.body["job"]["args"] == [{"version": 2}]
    old_id, new_id = old.body["job"]["id"], new.body["job"]["id"]
    assert old_id != new_id
    for node in (first, second):
        jobs = api(node)
        assert jobs.request("GET", f"/ojs/v1/jobs/{old_id}").body["job"]["state"] == "cancelled"
        assert jobs.request("GET", f"/ojs/v1/jobs/{new_id}").body["job"]["state"] == "available"
    # The key is the new job's now, in the whole cluster.
    refused = push(first, 3, "reject")
    assert refused.status == 409, refused.raw
    assert refused.body["error"]["details"]["existing_job_id"] == new_id


# ---------------------------------------------------------------------- cron


def cron_jobs(schema: Schema) -> list[str]:
    """The tick each stored cron job was made for."""
    rows = schema.rows("SELECT ext FROM {schema}.jobs WHERE queue = 'ticks'")
    return [json.loads(bytes(row[0]))["meta"]["cron_triggered_at"] for row in rows]  # type: ignore[arg-type]


def test_a_cron_entry_registered_on_one_node_fires_each_tick_on_one_node(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    first, second = start_nodes(nodes, schema, 2, http=True)
    entry = {
        "name": "every-second",
        "expression": "* * * * * *",
        "overlap_policy": "allow",  # the jobs stay queued: every tick makes one
        "job_template": {"type": "tick", "args": [], "options": {"queue": "ticks"}},
    }
    registered = api(first).request("POST", "/ojs/v1/cron", entry)
    assert registered.status == 201, registered.raw

    def listed() -> Any:
        got = api(second).request("GET", "/ojs/v1/cron")
        return [c["name"] for c in got.body["crons"]] == ["every-second"] or None

    wait_until(listed, "the other node lists the entry", LONG)
    wait_until(lambda: len(cron_jobs(schema)) >= 4 or None, "four ticks", LONG)
    ticks = cron_jobs(schema)
    assert len(ticks) == len(set(ticks)), ticks  # no tick fired twice
    fired_by = schema.rows("SELECT DISTINCT node FROM {schema}.cron_ticks")
    assert fired_by, "the ticks are recorded"

    def seen_on(node: ServerProcess) -> Any:
        got = api(node).request("GET", "/ojs/v1/cron/every-second").body["cron"]
        return got if got["run_count"] >= 4 and got["last_run_at"] else None

    for node in (first, second):  # whichever node fired, both show the runs
        wait_until(lambda node=node: seen_on(node), "the last run on every node", LONG)
    deleted = api(second).request("DELETE", "/ojs/v1/cron/every-second")
    assert deleted.status == 200, deleted.raw

    def gone_on_first() -> Any:
        return api(first).request("GET", "/ojs/v1/cron/every-second").status == 404 or None

    wait_until(gone_on_first, "the deletion reaches the other node", LONG)
    ticks = cron_jobs(schema)
    assert len(ticks) == len(set(ticks)), ticks


# ---------------------------------------------------------------------- pauses


def queue_paused(node: ServerProcess, queue: str) -> bool:
    """As the node's list of queues shows it."""
    got = api(node).request("GET", "/ojs/v1/queues")
    assert got.status == 200, got.raw
    [shown] = [q for q in got.body["queues"] if q["name"] == queue]
    return bool(shown["paused"]) and shown["status"] == "paused"


def test_a_queue_paused_on_one_node_is_paused_on_the_other_until_resumed(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    first, second = start_nodes(nodes, schema, 2, http=True)
    job = {"type": "report", "args": [1], "options": {"queue": "held"}}
    pushed = api(first).request("POST", "/ojs/v1/jobs", job)  # creates the queue there
    assert pushed.status == 201, pushed.raw
    job_id = pushed.body["job"]["id"]
    paused = api(first).request("POST", "/ojs/v1/queues/held/pause")
    assert paused.status == 200, paused.raw
    assert schema.rows("SELECT queue FROM {schema}.paused_queues") == [("held",)]
    wait_until(lambda: queue_paused(second, "held") or None, "paused on the other node", LONG)
    fetched = api(second).request("POST", "/ojs/v1/workers/fetch", {"queues": ["held"]})
    assert (fetched.status, fetched.body["jobs"]) == (200, []), fetched.raw
    # A Gearman worker for its type on the second node claims by function: not this job.
    with GearmanSocket(second) as worker:
        worker.send(Cmd.CAN_DO, "report")
        assert worker.grab().type == Cmd.NO_JOB
        assert schema.rows("SELECT owner IS NULL FROM {schema}.jobs") == [(True,)]
        resumed = api(second).request("POST", "/ojs/v1/queues/held/resume")
        assert resumed.status == 200, resumed.raw
        wait_until(lambda: not queue_paused(first, "held") or None, "resumed everywhere", LONG)
        assert schema.rows("SELECT count(*) FROM {schema}.paused_queues") == [(0,)]
        worker.send(Cmd.PRE_SLEEP)
        assert worker.expect(Cmd.NOOP)  # the resume made its node claim the job
        assigned = worker.grab()
        assert assigned.args[0].decode() == job_id
