"""What the OJS binding keeps across a restart with the SQLite store: cron registrations,
workflows in progress (and their jobs), dead-worker-free job state; and what it refuses
when the store cannot write."""

from __future__ import annotations

import resource
from pathlib import Path
from typing import Any

from tests.ojs.dsl import Response, Runner
from tests.servers import ServerProcess, start_jobwire


def ok(response: Response, status: int = 200) -> Any:
    assert response.status == status, response.raw
    return response.body


def start(workdir: Path, *args: str) -> tuple[ServerProcess, Runner]:
    server = start_jobwire(args, store=f"sqlite:{workdir / 'jobs.db'}", workdir=workdir, http=True)
    return server, Runner(f"http://127.0.0.1:{server.http_port}")


def stop(server: ServerProcess) -> None:
    code = server.stop()
    assert code == 0, f"jobwire exited with {code}:\n{server.log()}"


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


def test_an_admin_reset_is_not_undone_by_a_restart(tmp_path: Path) -> None:
    server, http = start(tmp_path, "--allow-reset")
    try:
        ok(http.request("POST", "/ojs/v1/jobs", {"type": "t", "args": ["before reset"]}), 201)
        ok(http.request("POST", "/ojs/v1/admin/reset", {}))
        ok(http.request("POST", "/ojs/v1/jobs", {"type": "t", "args": ["after reset"]}), 201)
    finally:
        stop(server)
    server, http = start(tmp_path)
    try:
        fetched = ok(http.request("POST", "/ojs/v1/workers/fetch", {"queues": ["default"]}))
        assert [job["args"] for job in fetched["jobs"]] == [["after reset"]]
        empty = ok(http.request("POST", "/ojs/v1/workers/fetch", {"queues": ["default"]}))
        assert empty["jobs"] == []
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
