"""What the OJS binding keeps across a restart with the SQLite store: cron registrations,
workflows in progress (and their jobs), dead-worker-free job state, the dead letter queue and
the event log; and what it refuses when the store cannot write, or forgets on a reset.

Acknowledgements surviving a kill -9 (push 201, batch 201, ack 200) are in
tests/interop/test_ack_durability.py."""

from __future__ import annotations

import resource
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from jobwire.protocols.ojs.ids import uuid7
from tests.interop.gearman_raw import GearmanSocket, status
from tests.ojs.dsl import Response, Runner
from tests.servers import ServerProcess, start_jobwire

ENDINGS = ["SIGTERM", "SIGKILL"]


def ok(response: Response, status: int = 200) -> Any:
    assert response.status == status, response.raw
    return response.body


def start(workdir: Path, *args: str) -> tuple[ServerProcess, Runner]:
    server = start_jobwire(args, store=f"sqlite:{workdir / 'jobs.db'}", workdir=workdir, http=True)
    return server, Runner(f"http://127.0.0.1:{server.http_port}")


def stop(server: ServerProcess) -> None:
    code = server.stop()
    assert code == 0, f"jobwire exited with {code}:\n{server.log()}"


def end(server: ServerProcess, ending: str) -> None:
    """Stop cleanly (SIGTERM, checkpointed) or kill -9 (the redo log is replayed)."""
    if ending == "SIGTERM":
        stop(server)
    else:
        server.kill()


@contextmanager
def full_disk(server: ServerProcess) -> Iterator[None]:
    """Every file write of the server fails (EFBIG), as on a full disk, until the block ends."""
    unlimited = resource.RLIM_INFINITY
    resource.prlimit(server.proc.pid, resource.RLIMIT_FSIZE, (1, unlimited))
    try:
        yield
    finally:
        resource.prlimit(server.proc.pid, resource.RLIMIT_FSIZE, (unlimited, unlimited))


def fetch_all(http: Runner, queue: str) -> list[dict[str, Any]]:
    """Every job a fetch on `queue` hands out now (fetches until one comes back empty)."""
    jobs: list[dict[str, Any]] = []
    while True:
        got = ok(http.request("POST", "/ojs/v1/workers/fetch", {"queues": [queue], "count": 10}))
        if not got["jobs"]:
            return jobs
        jobs.extend(got["jobs"])


def queue_counts(http: Runner, queue: str) -> dict[str, int]:
    """The queue's stats: its jobs by state, and total."""
    stats = ok(http.request("GET", f"/ojs/v1/queues/{queue}/stats"))["queue"]
    return {key: value for key, value in stats.items() if isinstance(value, int)}


def test_cron_and_workflows_survive_a_restart(tmp_path: Path) -> None:
    server, http = start(tmp_path)
    try:
        cron = {
            "name": "nightly",
            "expression": "0 3 * * *",
            "timezone": "Europe/Paris",
            "job_template": {"type": "report.build", "args": [1], "options": {"queue": "r"}},
        }
        registered = ok(http.request("POST", "/ojs/v1/cron", cron), 201)["cron"]
        gone = dict(cron, name="deleted")
        ok(http.request("POST", "/ojs/v1/cron", gone), 201)
        ok(http.request("DELETE", "/ojs/v1/cron/deleted"))
        chain = {
            "type": "chain",
            "name": "two-steps",
            "steps": [
                {"type": "a", "args": [], "options": {"queue": "wf"}},
                {"type": "b", "args": [], "options": {"queue": "wf"}},
            ],
        }
        flow = ok(http.request("POST", "/ojs/v1/workflows", chain), 201)["workflow"]
    finally:
        stop(server)

    server, http = start(tmp_path)
    try:
        entries = ok(http.request("GET", "/ojs/v1/cron"))["crons"]
        assert [e["name"] for e in entries] == ["nightly"]
        assert entries[0]["next_run_at"] == registered["next_run_at"]
        assert entries[0]["timezone"] == "Europe/Paris"
        assert ok(http.request("GET", f"/ojs/v1/workflows/{flow['id']}"))["workflow"]["state"] == (
            "running"
        )
        for expected in ("a", "b"):
            fetched = ok(http.request("POST", "/ojs/v1/workers/fetch", {"queues": ["wf"]}))
            [job] = fetched["jobs"]
            assert job["type"] == expected
            ok(http.request("POST", "/ojs/v1/workers/ack", {"job_id": job["id"], "result": 1}))
        done = ok(http.request("GET", f"/ojs/v1/workflows/{flow['id']}"))["workflow"]
        assert done["state"] == "completed" and done["steps_completed"] == 2
    finally:
        stop(server)


def test_a_push_the_store_could_not_write_is_refused_and_never_runs(tmp_path: Path) -> None:
    server, http = start(tmp_path)
    try:
        kept = ok(http.request("POST", "/ojs/v1/jobs", {"type": "t", "args": ["kept"]}), 201)
        # Every file write of the server now fails (EFBIG), as on a full disk.
        unlimited = resource.RLIM_INFINITY
        resource.prlimit(server.proc.pid, resource.RLIMIT_FSIZE, (1, unlimited))
        try:
            single = http.request("POST", "/ojs/v1/jobs", {"type": "t", "args": ["refused"]})
            batch = http.request(
                "POST",
                "/ojs/v1/jobs/batch",
                {"jobs": [{"type": "t", "args": ["refused b1"]}, {"type": "t", "args": ["b2"]}]},
            )
        finally:
            resource.prlimit(server.proc.pid, resource.RLIMIT_FSIZE, (unlimited, unlimited))
        for refused in (single, batch):
            assert refused.status == 503, refused.raw
            assert refused.body["error"]["code"] == "backend_error"
        # Neither the refused job nor the refused batch is handed to a worker.
        fetched = ok(http.request("POST", "/ojs/v1/workers/fetch", {"queues": ["default"]}))
        assert [job["args"] for job in fetched["jobs"]] == [["kept"]]
        assert fetched["jobs"][0]["id"] == kept["job"]["id"]
        empty = ok(http.request("POST", "/ojs/v1/workers/fetch", {"queues": ["default"]}))
        assert empty["jobs"] == []
    finally:
        stop(server)


def test_a_push_whose_commit_failed_leaves_no_job_behind(tmp_path: Path) -> None:
    """Promise: a push answered 503 leaves nothing behind, before or after a kill -9: no job by
    its id (404), none in the queue's counts or fetches, its id and unique key free again."""
    server, http = start(tmp_path)
    queue = "refused"
    unique = {"keys": ["type", "args"], "on_conflict": "reject"}

    def job(job_id: str, arg: str) -> dict[str, Any]:
        options = {"queue": queue, "unique": unique}
        return {"id": job_id, "type": "t", "args": [arg], "options": options}

    single, batch = uuid7(), [uuid7(), uuid7()]
    refused = [single, *batch]
    try:
        kept = ok(http.request("POST", "/ojs/v1/jobs", job(uuid7(), "kept")), 201)["job"]
        with full_disk(server):
            answers = [
                http.request("POST", "/ojs/v1/jobs", job(single, "single")),
                http.request(
                    "POST",
                    "/ojs/v1/jobs/batch",
                    {"jobs": [job(batch[0], "b0"), job(batch[1], "b1")]},
                ),
            ]
        assert [answer.status for answer in answers] == [503, 503], [a.raw for a in answers]
        for job_id in refused:
            assert http.request("GET", f"/ojs/v1/jobs/{job_id}").status == 404, job_id
        counts = queue_counts(http, queue)
        assert (counts["total"], counts["available"]) == (1, 1), counts
        assert counts["cancelled"] == counts["discarded"] == 0, counts
    finally:
        server.kill()

    server, http = start(tmp_path)
    try:
        for job_id in refused:
            assert http.request("GET", f"/ojs/v1/jobs/{job_id}").status == 404, job_id
        assert queue_counts(http, queue)["total"] == 1
        assert [j["id"] for j in fetch_all(http, queue)] == [kept["id"]]
        # The refused id and unique key were never taken: the same push is a new job now.
        again = ok(http.request("POST", "/ojs/v1/jobs", job(single, "single")), 201)["job"]
        assert again["id"] == single
    finally:
        stop(server)


@pytest.mark.parametrize("ending", ENDINGS)
def test_an_admin_reset_is_not_undone_by_a_restart(tmp_path: Path, ending: str) -> None:
    """Promise: `POST /ojs/v1/admin/reset` clears the store too: no job from before it comes
    back after a restart, whatever its state or protocol."""
    server, http = start(tmp_path, "--allow-reset")
    try:
        ids = [
            ok(http.request("POST", "/ojs/v1/jobs", body), 201)["job"]["id"]
            for body in (
                {"type": "t", "args": ["before reset"]},
                {"type": "t", "args": ["staged"], "options": {"pending": True}},
                {"type": "t", "args": ["later"], "options": {"delay_until": "+PT1H"}},
                {"type": "t", "args": ["running"], "options": {"queue": "busy"}},
            )
        ]
        fetched = ok(http.request("POST", "/ojs/v1/workers/fetch", {"queues": ["busy"]}))
        assert [j["id"] for j in fetched["jobs"]] == [ids[-1]]  # active at the reset
        with GearmanSocket(server) as client:
            ids.append(client.submit_bg("gearman.reset", "before reset"))
        ok(http.request("POST", "/ojs/v1/admin/reset", {}))
        later = {"type": "t", "args": ["after reset"]}
        after = ok(http.request("POST", "/ojs/v1/jobs", later), 201)
    finally:
        end(server, ending)
    server, http = start(tmp_path)
    try:
        for job_id in ids:
            got = http.request("GET", f"/ojs/v1/jobs/{job_id}")
            assert got.status == 404, (job_id, got.raw)
        assert [j["id"] for j in fetch_all(http, "default")] == [after["job"]["id"]]
        assert fetch_all(http, "busy") == []
        assert status(server).get("gearman.reset", (0, 0, 0))[:2] == (0, 0)
    finally:
        stop(server)


@pytest.mark.parametrize("ending", ENDINGS)
def test_an_admin_reset_forgets_cron_and_workflows_across_a_restart(
    tmp_path: Path, ending: str
) -> None:
    """Promise: cron registrations and workflows, kept in the store, are gone for good after
    `POST /ojs/v1/admin/reset`: a restart does not bring them back."""
    server, http = start(tmp_path, "--allow-reset")
    try:
        cron = {"name": "nightly", "expression": "0 3 * * *", "job_template": {"type": "c"}}
        ok(http.request("POST", "/ojs/v1/cron", cron), 201)
        chain = {"type": "chain", "name": "flow", "steps": [{"type": "a", "args": []}]}
        flow = ok(http.request("POST", "/ojs/v1/workflows", chain), 201)["workflow"]
        ok(http.request("POST", "/ojs/v1/admin/reset", {}))
    finally:
        end(server, ending)
    server, http = start(tmp_path)
    try:
        assert ok(http.request("GET", "/ojs/v1/cron"))["crons"] == []
        assert http.request("GET", f"/ojs/v1/workflows/{flow['id']}").status == 404
        assert fetch_all(http, "default") == []
    finally:
        stop(server)


def test_a_pending_job_stays_pending_across_a_crash_until_it_is_activated(
    tmp_path: Path,
) -> None:
    """A staged job must not run because the server restarted, and its activation, once
    answered, must not be undone by a kill -9."""
    server, http = start(tmp_path)
    try:
        job = {"type": "staged", "args": [], "options": {"queue": "st", "pending": True}}
        staged = ok(http.request("POST", "/ojs/v1/jobs", job), 201)["job"]
        later = ok(http.request("POST", "/ojs/v1/jobs", job), 201)["job"]
        assert staged["state"] == later["state"] == "pending"
    finally:
        server.kill()

    server, http = start(tmp_path)
    try:
        for pushed in (staged, later):
            got = ok(http.request("GET", f"/ojs/v1/jobs/{pushed['id']}"))["job"]
            assert got["state"] == "pending"
        nothing = ok(http.request("POST", "/ojs/v1/workers/fetch", {"queues": ["st"]}))
        assert nothing["jobs"] == []
        activated = ok(http.request("POST", f"/ojs/v1/jobs/{staged['id']}/activate"))["job"]
        assert activated["state"] == "available"
    finally:
        server.kill()

    server, http = start(tmp_path)
    try:
        got = ok(http.request("GET", f"/ojs/v1/jobs/{staged['id']}"))["job"]
        assert got["state"] == "available"
        still = ok(http.request("GET", f"/ojs/v1/jobs/{later['id']}"))["job"]
        assert still["state"] == "pending"
        fetched = ok(http.request("POST", "/ojs/v1/workers/fetch", {"queues": ["st"]}))
        assert [j["id"] for j in fetched["jobs"]] == [staged["id"]]
    finally:
        stop(server)


@pytest.mark.parametrize("ending", ENDINGS)
def test_the_dead_letter_queue_survives_a_restart(tmp_path: Path, ending: str) -> None:
    """Promise: a job dead-lettered (its nack answered 200) is still listed under
    `GET /ojs/v1/dead-letter` after a restart, and `POST /dead-letter/{id}/retry` runs it."""
    server, http = start(tmp_path)
    queue = "dlq"
    retry = {"max_attempts": 1, "on_exhaustion": "dead_letter"}
    body = {"type": "t", "args": ["doomed"], "options": {"queue": queue, "retry": retry}}
    try:
        job = ok(http.request("POST", "/ojs/v1/jobs", body), 201)["job"]
        [fetched] = fetch_all(http, queue)
        assert fetched["id"] == job["id"]
        error = {"code": "boom", "message": "failed for good", "retryable": True}
        nacked = ok(
            http.request("POST", "/ojs/v1/workers/nack", {"job_id": job["id"], "error": error})
        )
        assert nacked["state"] == "discarded", nacked
        listed = ok(http.request("GET", f"/ojs/v1/dead-letter?queue={queue}"))
        assert [(j["id"], j["args"]) for j in listed["jobs"]] == [(job["id"], ["doomed"])]
    finally:
        end(server, ending)

    server, http = start(tmp_path)
    try:
        listed = ok(http.request("GET", f"/ojs/v1/dead-letter?queue={queue}"))
        assert [(j["id"], j["args"]) for j in listed["jobs"]] == [(job["id"], ["doomed"])]
        assert listed["total"] == 1
        assert queue_counts(http, queue)["dead_letter"] == 1
        retried = ok(http.request("POST", f"/ojs/v1/dead-letter/{job['id']}/retry"))["job"]
        assert (retried["id"], retried["state"]) == (job["id"], "available")
        [again] = fetch_all(http, queue)
        assert (again["id"], again["args"], again["attempt"]) == (job["id"], ["doomed"], 1)
        assert ok(http.request("GET", "/ojs/v1/dead-letter"))["jobs"] == []
    finally:
        stop(server)


def job_events(http: Runner, queue: str) -> list[tuple[int, str, str]]:
    """The event log's events of `queue`, oldest first, as (sequence, type, subject)."""
    events = ok(http.request("GET", f"/ojs/v1/events?queues={queue}&after=0&limit=10000"))
    return [(e["sequence"], e["type"], e["subject"]) for e in events["events"]]


# The event log is kept by snapshots (at shutdown, and every couple of seconds while it
# changes), not by a store write per job transition, which would cost every protocol's hot
# path: a clean restart keeps it whole, a crash loses the last seconds of it (README).
@pytest.mark.parametrize("ending", ["SIGTERM"])
def test_the_event_log_survives_a_restart(tmp_path: Path, ending: str) -> None:
    """Promise: events recorded before a clean restart are still listed by
    `GET /ojs/v1/events` after it, and events recorded after it follow them (sequence
    numbers keep growing, so `after=` still pages forward)."""
    server, http = start(tmp_path)
    queue = "ev"
    try:
        done = ok(
            http.request("POST", "/ojs/v1/jobs", {"type": "t", "args": [1], "queue": queue}), 201
        )
        waiting = ok(
            http.request("POST", "/ojs/v1/jobs", {"type": "t", "args": [2], "queue": queue}), 201
        )
        [fetched] = ok(http.request("POST", "/ojs/v1/workers/fetch", {"queues": [queue]}))["jobs"]
        assert fetched["id"] == done["job"]["id"]
        ok(http.request("POST", "/ojs/v1/workers/ack", {"job_id": fetched["id"], "result": 1}))
        before = job_events(http, queue)
        kinds = {(kind, subject) for _seq, kind, subject in before}
        assert {
            ("job.enqueued", done["job"]["id"]),
            ("job.enqueued", waiting["job"]["id"]),
            ("job.completed", done["job"]["id"]),
        } <= kinds, before
    finally:
        end(server, ending)

    server, http = start(tmp_path)
    try:
        assert job_events(http, queue)[: len(before)] == before
        later = ok(
            http.request("POST", "/ojs/v1/jobs", {"type": "t", "args": [3], "queue": queue}), 201
        )
        new = job_events(http, queue)[len(before) :]
        assert ("job.enqueued", later["job"]["id"]) in {
            (kind, subject) for _s, kind, subject in new
        }
        assert min(seq for seq, _kind, _subject in new) > max(seq for seq, _k, _s in before), new
    finally:
        stop(server)
