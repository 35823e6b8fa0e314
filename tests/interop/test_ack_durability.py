"""Every listener's acknowledgement is durable: kill -9 right after it, restart on the same
store (a SQLite file, a PostgreSQL schema), and the job (or its completion) is there.

One test per listener and acknowledgement. Gearman's JOB_CREATED is covered in
test_durability.py: `test_kill_9_during_pipelined_submits_loses_no_acknowledged_job` (every
acknowledged SUBMIT_JOB_BG comes back with its payload after a kill -9) and
`test_job_active_at_the_crash_comes_back_with_its_attempt_counted` (a JOB_ASSIGN under a retry
limit); they are not repeated here. This module covers OJS (push 201, batch 201, ack 200) and
Rota (the `ack` a result heartbeat gets once its results are durable, and an assignment's
attempt under a retry limit).

Every wait reads a socket or polls up to a generous deadline; the kill comes after the client
has seen the acknowledgement, so no outcome depends on how fast the server or the disk is.
A "witness" job, pushed before the kill and never touched, proves that the restarted server
did replay the file, so that "the job is not handed out again" cannot pass on an empty store.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.ojs.dsl import Response, Runner
from tests.pg import new_schema
from tests.rota.support import DEADLINE, RawWorker, Rota, run
from tests.servers import ServerProcess, start_jobwire

pytestmark = pytest.mark.interop

# A Rota worker that waits for an ack must not be dropped for silence meanwhile.
ROTA_ARGS = ("--rota-heartbeat-timeout", "120")
SPEC = {"name": "durable.rota", "version": 1}


class Crashes:
    """Servers on one store (a SQLite file or a PostgreSQL schema), started and killed in
    turn; each run logs in a directory of its own so that the log of the run before a kill
    is kept."""

    def __init__(self, root: Path, store: str | None = None) -> None:
        self.root = root
        db = root / "data" / "jobs.db"
        db.parent.mkdir(parents=True)
        self.store = store or f"sqlite:{db}"
        self.started: list[ServerProcess] = []

    def start(self, *args: str) -> ServerProcess:
        workdir = self.root / f"run-{len(self.started)}"
        workdir.mkdir()
        if not self.store.startswith("sqlite:"):
            # Rota's registered specs live beside a SQLite store; elsewhere, in a file named.
            args = (*args, "--rota-spec-file", str(self.root / "rota-specs.json"))
        server = start_jobwire(args, store=self.store, workdir=workdir, http=True)
        self.started.append(server)
        return server


@pytest.fixture(params=["sqlite", "postgresql"])
def crashes(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Crashes]:
    with contextlib.ExitStack() as stack:
        store = None
        if request.param == "postgresql":
            store = stack.enter_context(new_schema()).dsn
        runs = Crashes(tmp_path, store)
        try:
            yield runs
        finally:
            for server in runs.started:
                server.kill()


def http(server: ServerProcess) -> Runner:
    return Runner(f"http://127.0.0.1:{server.http_port}")


def ok(response: Response, status: int = 200) -> Any:
    assert response.status == status, (response.status, response.raw)
    return response.body


def fetch_ids(api: Runner, queue: str) -> list[str]:
    """Every job a fetch on `queue` hands out now, in order (fetches until one is empty)."""
    ids: list[str] = []
    while True:
        jobs = ok(api.request("POST", "/ojs/v1/workers/fetch", {"queues": [queue], "count": 10}))
        if not jobs["jobs"]:
            return ids
        ids.extend(job["id"] for job in jobs["jobs"])


def finished_or_gone(status: int, body: Any, state: str) -> bool:
    """What `GET /ojs/v1/jobs/{id}` may honestly answer after a restart for a job that was
    finished (`state`) before it: completion and discard delete the job's row (README, "What
    is stored") and finished jobs are only retained in memory, so the restarted server does not
    know it (404); a server that kept finished jobs would show `state`. Anything else
    (available, active, retryable, scheduled) means the acknowledged outcome was lost."""
    if status == 404:
        return True
    return status == 200 and body["job"]["state"] == state


# ---------------------------------------------------------------------------------- OJS


def test_ojs_push_answered_201_survives_kill_9(crashes: Crashes) -> None:
    """Promise: a job `POST /ojs/v1/jobs` answered 201 for is found after a kill -9."""
    server = crashes.start()
    api = http(server)
    pushed = ok(
        api.request(
            "POST",
            "/ojs/v1/jobs",
            {"type": "t", "args": ["kept", 1], "meta": {"m": 1}, "options": {"queue": "pushed"}},
        ),
        201,
    )["job"]
    server.kill()

    api = http(crashes.start())
    got = ok(api.request("GET", f"/ojs/v1/jobs/{pushed['id']}"))["job"]
    assert (got["state"], got["args"], got["meta"]) == ("available", ["kept", 1], {"m": 1})
    fetched = ok(api.request("POST", "/ojs/v1/workers/fetch", {"queues": ["pushed"]}))
    assert [(job["id"], job["args"]) for job in fetched["jobs"]] == [(pushed["id"], ["kept", 1])]
    assert fetch_ids(api, "pushed") == []


def test_ojs_batch_answered_201_survives_kill_9(crashes: Crashes) -> None:
    """Promise: every job of a `POST /ojs/v1/jobs/batch` answered 201 is found after a kill -9."""
    server = crashes.start()
    api = http(server)
    batch = {
        "jobs": [{"type": "t", "args": [n], "options": {"queue": "batched"}} for n in range(3)]
    }
    created = ok(api.request("POST", "/ojs/v1/jobs/batch", batch), 201)["jobs"]
    ids = [job["id"] for job in created]
    server.kill()

    api = http(crashes.start())
    for number, job_id in enumerate(ids):
        got = ok(api.request("GET", f"/ojs/v1/jobs/{job_id}"))["job"]
        assert (got["state"], got["args"]) == ("available", [number])
    assert fetch_ids(api, "batched") == ids


def test_ojs_ack_answered_200_survives_kill_9(crashes: Crashes) -> None:
    """Promise: a job whose `POST /ojs/v1/workers/ack` was answered 200 is not handed out
    again after a kill -9."""
    server = crashes.start()
    api = http(server)
    done = ok(api.request("POST", "/ojs/v1/jobs", {"type": "t", "args": ["done"]}), 201)["job"]
    witness = ok(api.request("POST", "/ojs/v1/jobs", {"type": "t", "args": ["witness"]}), 201)
    fetched = ok(api.request("POST", "/ojs/v1/workers/fetch", {"queues": ["default"]}))
    assert [job["id"] for job in fetched["jobs"]] == [done["id"]]
    ok(api.request("POST", "/ojs/v1/workers/ack", {"job_id": done["id"], "result": {"r": 1}}))
    server.kill()

    api = http(crashes.start())
    got = api.request("GET", f"/ojs/v1/jobs/{done['id']}")
    assert finished_or_gone(got.status, got.body, "completed"), (got.status, got.raw)
    # The witness was replayed; the acknowledged job was not.
    assert fetch_ids(api, "default") == [witness["job"]["id"]]


# --------------------------------------------------------------------------------- Rota


async def until_ack(worker: RawWorker, seq: int) -> list[dict[str, Any]]:
    """Read until the server acknowledges heartbeat `seq` (`{"v": 1, "type": "ack", "seq":
    S}`, sent once that heartbeat's results are durable); return the messages before it."""
    seen: list[dict[str, Any]] = []
    end = time.monotonic() + DEADLINE
    while True:
        remaining = end - time.monotonic()
        try:
            if remaining <= 0:
                raise TimeoutError
            msg = await worker.socket.receive(timeout=remaining)
        except TimeoutError:
            raise AssertionError(
                f"no ack for heartbeat {seq} within {DEADLINE}s; received {seen}"
            ) from None
        if msg.type is not aiohttp.WSMsgType.TEXT:
            raise AssertionError(f"no ack for heartbeat {seq}; got {msg.type!r} after {seen}")
        body: dict[str, Any] = orjson.loads(msg.data)
        if body.get("type") == "ack" and body.get("seq") == seq:
            assert body["v"] == 1, body
            return seen
        seen.append(body)


RESULTS = {
    "success": ({"outcome": "success", "data": {"width": 64}}, "completed"),
    "failure": (
        {"outcome": "failure", "error": {"code": "bad", "message": "no", "retryable": False}},
        "discarded",
    ),
}


@pytest.mark.parametrize("outcome", sorted(RESULTS))
def test_rota_result_acknowledged_survives_kill_9(crashes: Crashes, outcome: str) -> None:
    """Promise: a Rota result heartbeat gets `{"type": "ack", "seq": S}` once its results are
    durable, and a job whose result was acknowledged is not run again after a kill -9."""
    result, final_state = RESULTS[outcome]
    server = crashes.start(*ROTA_ARGS)

    async def finish(rota: Rota) -> tuple[str, str]:
        await rota.http.register_spec(SPEC)
        job_id = await rota.http.push(SPEC["name"], [1], queue="rota")
        # Same queue, a type no Rota worker offers: only an OJS fetch takes it.
        witness = await rota.http.push("not.rota", ["witness"], queue="rota")
        async with rota.worker() as worker:
            await worker.register([SPEC], wants=1, queues=["rota"])
            assert (await worker.assignment())["job"]["id"] == job_id
            seq = await worker.heartbeat(results=[{"job": job_id, **result}], wants=0)
            before = await until_ack(worker, seq)
            assert [m for m in before if m["type"] != "assignment"] == [], before
            server.kill()
        return job_id, witness

    job_id, witness = run(server, finish)

    async def after_restart(rota: Rota) -> None:
        async with rota.worker() as worker:
            await worker.register([SPEC], wants=1, queues=["rota"])
            assert await worker.round_trip() == []  # nothing to assign: the job is finished
        status, body = await rota.http.request("GET", f"/ojs/v1/jobs/{job_id}")
        assert finished_or_gone(status, body, final_state), (status, body)

    server = crashes.start(*ROTA_ARGS)
    run(server, after_restart)
    assert fetch_ids(http(server), "rota") == [witness]


# Big enough that the log write of the attempt takes a while: an assignment sent before that
# write is durable is then caught by the kill in most rounds, not one in several. The
# assertions hold whatever the size, the speed of the disk, or when the kill lands.
BIG_ARG = "x" * 400_000
ROUNDS = 3


def test_rota_assignment_under_a_retry_limit_counts_its_attempt_across_kill_9(
    crashes: Crashes,
) -> None:
    """Promise (README, Durability): with a retry limit (OJS `max_attempts`) an assignment is
    sent only once the attempt it starts is recorded, so an attempt cut short by a kill -9
    counts: the job comes back with attempt 1 and is next assigned as attempt 2."""
    server = crashes.start(*ROTA_ARGS)
    options = {"queue": "attempts", "retry": {"max_attempts": 2}}

    async def assign(rota: Rota) -> str:
        await rota.http.register_spec(SPEC)
        job_id = await rota.http.push(SPEC["name"], [BIG_ARG], options=options)
        async with rota.worker() as worker:
            await worker.register([SPEC], wants=1, queues=["attempts"])
            job = (await worker.assignment())["job"]
            server.kill()  # right after the assignment arrived
        assert (job["id"], job["attempt"], job["max_attempts"]) == (job_id, 1, 2)
        return job_id

    async def after_restart(rota: Rota) -> None:
        job = await rota.http.job(job_id)
        assert (job["state"], job["attempt"]) == ("available", 1), job["attempt"]
        async with rota.worker() as worker:
            await worker.register([SPEC], wants=1, queues=["attempts"])
            again = (await worker.assignment())["job"]
            assert (again["id"], again["attempt"], again["max_attempts"]) == (job_id, 2, 2)
            await worker.heartbeat(results=[{"job": job_id, "outcome": "success", "data": 1}])
            assert await worker.round_trip() == []
        await rota.http.wait_job(job_id, lambda job: job["state"] == "completed")

    for _ in range(ROUNDS):  # a new job each round, on the server restarted by the last
        job_id = run(server, assign)
        server = crashes.start(*ROTA_ARGS)
        run(server, after_restart)
