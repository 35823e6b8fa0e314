"""Lease ownership over the OJS HTTP binding, against a real jobwire process: an ack, nack,
progress report or heartbeat from a worker that does not hold the job's lease is refused
(409 `conflict` naming the job's state, never the holder) and changes nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from tests.rota.support import Http
from tests.servers import ServerProcess, start_jobwire


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    proc = start_jobwire(["--allow-reset"], http=True)
    yield proc
    code = proc.stop()
    assert code == 0, f"jobwire exited with {code}:\n{proc.log()}"


async def fetched_by(http: Http, worker_id: str, queue: str) -> str:
    reply = await http.post(
        "/ojs/v1/workers/fetch", {"worker_id": worker_id, "queues": [queue]}, 200
    )
    assert len(reply["jobs"]) == 1, reply
    job_id: str = reply["jobs"][0]["id"]
    return job_id


def in_session(server: ServerProcess, scenario: Any) -> None:
    async def main() -> None:
        async with aiohttp.ClientSession() as session:
            await scenario(Http(session, server))

    asyncio.run(main())


def conflict(status: int, reply: Any) -> str:
    assert status == 409, (status, reply)
    assert reply["error"]["code"] == "conflict", reply
    message: str = reply["error"]["message"]
    return message


@pytest.mark.parametrize("verb", ["ack", "nack"])
def test_an_ack_or_nack_from_another_worker_is_refused_and_changes_nothing(
    server: ServerProcess, verb: str
) -> None:
    async def scenario(http: Http) -> None:
        job_id = await http.push("own", [1], queue=f"own-{verb}")
        await fetched_by(http, "holder-a", f"own-{verb}")
        body: dict[str, Any] = {"job_id": job_id, "worker_id": "intruder-b"}
        if verb == "nack":
            body["error"] = {"message": "no", "retryable": False}
        # An intruder that never fetched anything, and one that exists and holds nothing.
        status, reply = await http.request("POST", f"/ojs/v1/workers/{verb}", body)
        message = conflict(status, reply)
        assert "leased to another worker" in message
        assert "holder-a" not in message
        await http.post("/ojs/v1/workers/heartbeat", {"worker_id": "other-c"}, 200)
        body["worker_id"] = "other-c"
        status, reply = await http.request("POST", f"/ojs/v1/workers/{verb}", body)
        assert "holder-a" not in conflict(status, reply)
        job = await http.job(job_id)
        assert job["state"] == "active", job
        assert job["attempt"] == 1, job
        # The holder's own ack goes through.
        body["worker_id"] = "holder-a"
        await http.post(f"/ojs/v1/workers/{verb}", body, 200)
        job = await http.job(job_id)
        assert job["state"] == ("completed" if verb == "ack" else "discarded"), job
        # Now finished: even the former holder is refused, naming the state.
        status, reply = await http.request("POST", f"/ojs/v1/workers/{verb}", body)
        assert job["state"] in conflict(status, reply)

    in_session(server, scenario)


def test_a_requeued_job_refuses_its_former_holder(server: ServerProcess) -> None:
    async def scenario(http: Http) -> None:
        job_id = await http.push("own", [1], queue="own-requeue")
        await fetched_by(http, "first", "own-requeue")
        await http.post(
            "/ojs/v1/workers/nack",
            {"job_id": job_id, "worker_id": "first", "requeue": True, "error": {"message": "x"}},
            200,
        )
        await fetched_by(http, "second", "own-requeue")
        status, reply = await http.request(
            "POST", "/ojs/v1/workers/ack", {"job_id": job_id, "worker_id": "first"}
        )
        assert "leased to another worker" in conflict(status, reply)
        assert (await http.job(job_id))["state"] == "active"

    in_session(server, scenario)


def test_progress_and_heartbeat_from_another_worker_change_nothing(
    server: ServerProcess,
) -> None:
    async def scenario(http: Http) -> None:
        job_id = await http.push("own", [1], queue="own-progress")
        await fetched_by(http, "holder", "own-progress")
        status, reply = await http.request(
            "PUT", f"/ojs/v1/jobs/{job_id}/progress", {"progress": 0.5, "worker_id": "other"}
        )
        assert "leased to another worker" in conflict(status, reply)
        progress = await http.get(f"/ojs/v1/jobs/{job_id}/progress")
        assert progress["progress"] == 0.0, progress
        beat = await http.post(
            "/ojs/v1/workers/heartbeat", {"worker_id": "other", "active_jobs": [job_id]}, 200
        )
        assert beat["jobs_extended"] == [], beat
        assert beat["jobs_not_held"] == [{"job_id": job_id, "state": "leased to another worker"}], (
            beat
        )
        beat = await http.post(
            "/ojs/v1/workers/heartbeat", {"worker_id": "holder", "active_jobs": [job_id]}, 200
        )
        assert beat["jobs_extended"] == [job_id], beat
        status, _ = await http.request(
            "PUT", f"/ojs/v1/jobs/{job_id}/progress", {"progress": 0.5, "worker_id": "holder"}
        )
        assert status == 200

    in_session(server, scenario)


def test_an_ack_without_a_worker_id_is_still_accepted(server: ServerProcess) -> None:
    """The OJS spec's ack names no worker: such acks are not checked (the SDK names it)."""

    async def scenario(http: Http) -> None:
        job_id = await http.push("own", [1], queue="own-anon")
        await fetched_by(http, "someone", "own-anon")
        await http.post("/ojs/v1/workers/ack", {"job_id": job_id}, 200)
        assert (await http.job(job_id))["state"] == "completed"

    in_session(server, scenario)
