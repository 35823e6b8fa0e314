"""The `/work` WebSocket against a real server: registration, assignments, results, status."""

from __future__ import annotations

from typing import Any

import pytest

from jobwire.protocols.rota import checksum
from tests.rota.support import Rota, poll, run, spec_ref
from tests.servers import ServerProcess

RESIZE = {"name": "resize", "version": 1, "params": {"path": "string", "size": "integer"}}
RESIZE_V2 = {**RESIZE, "version": 2}
EMAIL = {"name": "email", "version": 1}


def test_first_heartbeat_registers_the_worker(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(RESIZE)
        async with rota.worker() as worker:
            welcome = await worker.register(
                [RESIZE], queues=["default", "images"], hostname="box-1"
            )
            assert welcome["v"] == 1
            assert welcome["worker"].startswith("rota:")
            assert welcome["heartbeat_timeout"] == 5.0
            assert welcome["specs"] == [{**spec_ref(RESIZE), "accepted": True}]
            await worker.heartbeat(status={"cpu": 12.5, "ram": 1 << 20})
            await worker.round_trip()
            [listed] = (await rota.http.get("/rota/v1/workers"))["workers"]
            assert listed["id"] == welcome["worker"]
            assert (listed["hostname"], listed["os"], listed["pid"]) == ("box-1", "Linux", 1234)
            assert listed["queues"] == ["default", "images"]
            assert (listed["cpu"], listed["ram"]) == (12.5, 1 << 20)
            assert listed["specs"][0]["accepted"] is True
        # Gone from the listing once the socket closes.
        await poll(lambda: rota.http.get("/rota/v1/workers"), lambda body: body["workers"] == [])

    run(server, scenario)


def test_assignment_carries_a_copy_of_the_job(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(RESIZE)
        job_id = await rota.http.push("resize", ["a.png", 64], meta={"owner": "me"}, priority=5)
        async with rota.worker() as worker:
            await worker.register([RESIZE], wants=1)
            assignment = await worker.assignment()
            job = assignment["job"]
            assert assignment["logs"] is False
            assert job["id"] == job_id
            assert (job["spec"], job["queue"], job["priority"]) == ("resize", "default", 5)
            assert job["args"] == ["a.png", 64]
            assert job["payload"] == '["a.png",64]'  # the bytes a Gearman worker would get
            assert (job["attempt"], job["max_attempts"]) == (1, 3)
            assert job["meta"] == {"owner": "me"}
            assert job["created_at"].endswith("Z")
            assert (await rota.http.job(job_id))["state"] == "active"

    run(server, scenario)


def test_never_more_jobs_than_the_worker_wants(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(RESIZE)
        ids = [await rota.http.push("resize", [n]) for n in range(4)]
        async with rota.worker() as worker:
            await worker.register([RESIZE], wants=0)
            assert await worker.round_trip() == []  # wants 0: nothing
            await worker.heartbeat(wants=2)
            first = [(await worker.assignment())["job"]["id"] for _ in range(2)]
            assert first == ids[:2]  # FIFO
            assert await worker.round_trip() == []  # two held, two wanted: no more
            # `wants` counts the jobs held: repeating it asks for nothing new.
            await worker.heartbeat(wants=2)
            assert await worker.round_trip() == []
            # A result frees a slot; the same heartbeat still wants 2 in all.
            await worker.heartbeat(
                results=[{"job": first[0], "outcome": "success", "data": None}], wants=2
            )
            assert (await worker.assignment())["job"]["id"] == ids[2]
            assert await worker.round_trip() == []
            # Asking for fewer than it holds takes nothing back and gives nothing.
            await worker.heartbeat(
                results=[{"job": first[1], "outcome": "success", "data": None}], wants=1
            )
            assert await worker.round_trip() == []
            await worker.heartbeat(wants=2)
            assert (await worker.assignment())["job"]["id"] == ids[3]

    run(server, scenario)


def test_work_that_arrives_later_is_pushed_to_a_waiting_worker(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(RESIZE)
        async with rota.worker() as worker:
            await worker.register([RESIZE], wants=1)
            assert await worker.round_trip() == []
            job_id = await rota.http.push("resize", [1])
            assert (await worker.assignment())["job"]["id"] == job_id

    run(server, scenario)


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        ({"data": {"width": 64}}, {"width": 64}),
        ({"data": "done"}, "done"),
        ({"data": [1, 2]}, [1, 2]),
        ({"data_base64": "aGk="}, "hi"),
    ],
)
def test_success_completes_the_job(
    server: ServerProcess, result: dict[str, Any], expected: Any
) -> None:
    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(RESIZE)
        job_id = await rota.http.push("resize", [1])
        async with rota.worker() as worker:
            await worker.register([RESIZE], wants=1)
            await worker.assignment()
            await worker.heartbeat(results=[{"job": job_id, "outcome": "success", **result}])
            await worker.round_trip()
            job = await rota.http.job(job_id)
            assert job["state"] == "completed"
            assert job["result"] == expected

    run(server, scenario)


def test_failure_discards_the_job_with_its_error(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(RESIZE)
        job_id = await rota.http.push("resize", [1])
        async with rota.worker() as worker:
            await worker.register([RESIZE], wants=1)
            await worker.assignment()
            error = {"code": "bad_image", "message": "not a PNG", "details": {"offset": 4}}
            await worker.heartbeat(
                results=[{"job": job_id, "outcome": "failure", "error": error}], wants=1
            )
            assert await worker.round_trip() == []  # not retryable: not handed out again
            job = await rota.http.job(job_id)
            assert job["state"] == "discarded"
            assert job["error"]["code"] == "bad_image"
            assert job["error"]["message"] == "not a PNG"
            assert job["error"]["details"] == {"offset": 4}

    run(server, scenario)


def test_retryable_failure_runs_the_job_again(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(RESIZE)
        job_id = await rota.http.push("resize", [1])
        async with rota.worker() as worker:
            await worker.register([RESIZE], wants=1)
            assert (await worker.assignment())["job"]["attempt"] == 1
            failure = {"code": "busy", "message": "try later", "retryable": True}
            await worker.heartbeat(
                results=[{"job": job_id, "outcome": "failure", "error": failure}], wants=1
            )
            again = await worker.assignment()
            assert again["job"]["id"] == job_id
            assert again["job"]["attempt"] == 2

    run(server, scenario)


def test_progress_is_the_jobs_progress(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(RESIZE)
        job_id = await rota.http.push("resize", [1])
        async with rota.worker() as worker:
            await worker.register([RESIZE], wants=1)
            await worker.assignment()
            await worker.heartbeat(
                status={"progress": [{"job": job_id, "current": 3, "total": 10}]}
            )
            await worker.round_trip()
            job = await rota.http.job(job_id)
            assert job["progress"] == {"current": 3, "total": 10}

    run(server, scenario)


def test_logs_are_kept_only_when_the_assignment_asked(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(RESIZE)
        logged = await rota.http.push("resize", [1], meta={"logs": True})
        quiet = await rota.http.push("resize", [2])
        async with rota.worker() as worker:
            await worker.register([RESIZE], wants=2)
            first, second = await worker.assignment(), await worker.assignment()
            assert (first["job"]["id"], first["logs"]) == (logged, True)
            assert (second["job"]["id"], second["logs"]) == (quiet, False)
            seq = await worker.heartbeat(
                status={
                    "logs": [
                        {"job": logged, "lines": ["starting", "resized to 64"]},
                        {"job": quiet, "lines": ["unwanted"]},
                    ]
                }
            )
            [refusal] = await worker.round_trip()
            assert refusal["code"] == "logs_not_requested"
            assert (refusal["job"], refusal["seq"], refusal["fatal"]) == (quiet, seq, False)
            logs = await rota.http.get(f"/rota/v1/jobs/{logged}/logs")
            assert [entry["line"] for entry in logs["lines"]] == ["starting", "resized to 64"]
            assert {entry["attempt"] for entry in logs["lines"]} == {1}
            assert (await rota.http.get(f"/rota/v1/jobs/{quiet}/logs"))["lines"] == []
        status, _ = await rota.http.request("GET", "/rota/v1/jobs/no-such-job/logs")
        assert status == 404

    run(server, scenario)


@pytest.mark.server_args("--rota-logs")
def test_rota_logs_flag_asks_for_every_jobs_logs(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(RESIZE)
        await rota.http.push("resize", [1])
        async with rota.worker() as worker:
            await worker.register([RESIZE], wants=1)
            assert (await worker.assignment())["logs"] is True

    run(server, scenario)


def test_alerts_are_readable_over_http(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        async with rota.worker() as worker:
            welcome = await worker.register([], hostname="box-7")
            await worker.heartbeat(
                status={
                    "alerts": [
                        {"level": "warning", "message": "disk 91% full"},
                        {"level": "critical", "message": "GPU lost", "job": "j-1"},
                    ]
                }
            )
            await worker.round_trip()
        alerts = (await rota.http.get("/rota/v1/alerts"))["alerts"]
        assert [(a["level"], a["message"], a["job"]) for a in alerts] == [
            ("warning", "disk 91% full", None),
            ("critical", "GPU lost", "j-1"),
        ]
        assert {a["worker"] for a in alerts} == {welcome["worker"]}
        assert {a["hostname"] for a in alerts} == {"box-7"}
        later = await rota.http.get(f"/rota/v1/alerts?after={alerts[0]['id']}")
        assert [a["message"] for a in later["alerts"]] == ["GPU lost"]

    run(server, scenario)


def test_checksum_mismatch_gets_no_assignment(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(RESIZE_V2)
        job_id = await rota.http.push("resize", [1])
        async with rota.worker() as old, rota.worker() as new:
            welcome = await old.register([RESIZE], wants=1)  # offers v1's checksum
            assert welcome["specs"] == [
                {**spec_ref(RESIZE), "accepted": False, "reason": "checksum_mismatch"}
            ]
            assert await old.round_trip() == []
            await new.register([RESIZE_V2], wants=1)
            assert (await new.assignment())["job"]["id"] == job_id
            assert await old.round_trip() == []

    run(server, scenario)


def test_unregistered_spec_gets_no_assignment(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        await rota.http.push("email", ["a@b.c"])
        async with rota.worker() as worker:
            welcome = await worker.register([EMAIL], wants=1)
            assert welcome["specs"][0]["reason"] == "not_registered"
            assert await worker.round_trip() == []

    run(server, scenario)


def test_partial_match_gets_the_matching_specs(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(RESIZE_V2)
        await rota.http.register_spec(EMAIL)
        resize_job = await rota.http.push("resize", [1])
        email_job = await rota.http.push("email", ["a@b.c"])
        async with rota.worker() as worker:
            welcome = await worker.register([RESIZE, EMAIL], wants=5)
            verdicts = {v["name"]: v["accepted"] for v in welcome["specs"]}
            assert verdicts == {"resize": False, "email": True}
            assert (await worker.assignment())["job"]["id"] == email_job
            assert await worker.round_trip() == []
            assert (await rota.http.job(resize_job))["state"] == "available"

    run(server, scenario)


def test_a_new_spec_version_moves_work_to_the_workers_that_have_it(
    server: ServerProcess,
) -> None:
    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(RESIZE)
        async with rota.worker() as old, rota.worker() as new:
            await old.register([RESIZE], wants=1)
            welcome = await new.register([RESIZE_V2], wants=1)
            assert welcome["specs"][0]["accepted"] is False
            first = await rota.http.push("resize", [1])
            assert (await old.assignment())["job"]["id"] == first
            # Deploy v2: the status quo changes, each worker is told its new verdicts.
            registered = await rota.http.register_spec(RESIZE_V2)
            assert registered["replaced"] == checksum(RESIZE)
            changed_old = await old.expect("specs")
            assert changed_old["specs"][0]["reason"] == "checksum_mismatch"
            changed_new = await new.expect("specs")
            assert changed_new["specs"][0]["accepted"] is True
            second = await rota.http.push("resize", [2])
            assert (await new.assignment())["job"]["id"] == second
            # The old worker still finishes what it holds.
            await old.heartbeat(results=[{"job": first, "outcome": "success", "data": 1}])
            await old.round_trip()
            assert (await rota.http.job(first))["state"] == "completed"

    run(server, scenario)


def test_queues_restrict_what_a_worker_gets(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(RESIZE)
        await rota.http.push("resize", [1])  # queue default
        images = await rota.http.push("resize", [2], queue="images")
        async with rota.worker() as worker:
            await worker.register([RESIZE], wants=2, queues=["images"])
            assert (await worker.assignment())["job"]["id"] == images
            assert await worker.round_trip() == []

    run(server, scenario)
