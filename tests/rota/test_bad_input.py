"""Bad input on `/work`: an error message, a close code where the worker can't be trusted, and
nobody else affected."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.rota.support import RawWorker, Rota, run
from tests.servers import ServerProcess

RESIZE = {"name": "resize"}


async def _healthy_neighbour_still_works(rota: Rota, neighbour: RawWorker) -> None:
    """Another worker, connected all along, still gets and completes jobs."""
    job_id = await rota.http.push("resize", ["after"])
    assert (await neighbour.assignment())["job"]["id"] == job_id
    await neighbour.heartbeat(results=[{"job": job_id, "outcome": "success", "data": "ok"}])
    await neighbour.round_trip()
    assert (await rota.http.job(job_id))["state"] == "completed"


@pytest.mark.parametrize(
    ("frame", "code", "close"),
    [
        ("{not json", "malformed_json", 1007),
        (b'{"v": 1, "type": "heartbeat"}', "binary_message", 1003),
        ('{"v": 2, "type": "heartbeat"}', "unsupported_version", 1002),
        ('{"type": "heartbeat"}', "unsupported_version", 1002),
        ('{"v": 1, "type": "heartbeat", "wants": -1}', "invalid_message", 1002),
        ("[]", "invalid_message", 1002),
        # Deeper than any reply could carry back (protocols/json_depth).
        (
            '{"v": 1, "type": "heartbeat", "x": ' + "[" * 200 + "]" * 200 + "}",
            "invalid_message",
            1002,
        ),
    ],
)
def test_untrustworthy_input_closes_the_socket_and_requeues(
    server: ServerProcess, frame: str | bytes, code: str, close: int
) -> None:
    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(RESIZE)
        held = await rota.http.push("resize", ["held"])
        async with rota.worker() as neighbour, rota.worker() as broken:
            await broken.register([RESIZE], wants=1)
            assert (await broken.assignment())["job"]["id"] == held
            await neighbour.register([RESIZE], wants=1)
            await broken.send_raw(frame)
            closed_with, messages = await broken.closed()
            assert closed_with == close
            [error] = messages
            assert (error["type"], error["code"], error["fatal"]) == ("error", code, True)
            # The job it held goes to the neighbour, attempt counted.
            again = await neighbour.assignment()
            assert (again["job"]["id"], again["job"]["attempt"]) == (held, 2)
            await neighbour.heartbeat(results=[{"job": held, "outcome": "success", "data": 1}])
            await neighbour.round_trip()
            await _healthy_neighbour_still_works(rota, neighbour)

    run(server, scenario)


def test_invalid_fields_are_named(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        async with rota.worker() as worker:
            await worker.register([])
            seq = await worker.heartbeat(status={"progress": [{"job": "j", "current": "x"}]})
            code, [error] = await worker.closed()
            assert code == 1002
            assert "status.progress[0].current" in error["message"]
            assert error["seq"] == seq

    run(server, scenario)


def test_the_first_heartbeat_must_register(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        async with rota.worker() as worker:
            await worker.heartbeat(wants=1)
            code, [error] = await worker.closed()
            assert (code, error["code"]) == (1008, "not_registered")

    run(server, scenario)


def test_unknown_message_types_are_refused_but_harmless(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(RESIZE)
        async with rota.worker() as worker:
            await worker.register([RESIZE])
            seq = await worker.send(type="telemetry", data=[1, 2])
            error = await worker.expect("error")
            assert (error["code"], error["seq"], error["fatal"]) == ("unknown_type", seq, False)
            await worker.heartbeat(wants=1)
            job_id = await rota.http.push("resize", [1])
            assert (await worker.assignment())["job"]["id"] == job_id

    run(server, scenario)


def test_a_second_registration_is_ignored(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        async with rota.worker() as worker:
            welcome = await worker.register([], hostname="first")
            seq = await worker.heartbeat(register={"hostname": "second", "specs": []})
            error = await worker.expect("error")
            assert (error["code"], error["seq"], error["fatal"]) == (
                "already_registered",
                seq,
                False,
            )
            [listed] = (await rota.http.get("/rota/v1/workers"))["workers"]
            assert (listed["id"], listed["hostname"]) == (welcome["worker"], "first")

    run(server, scenario)


@pytest.mark.parametrize(
    "part",
    [
        {"results": [{"job": "{job}", "outcome": "success", "data": "stolen"}]},
        {"results": [{"job": "no-such-job", "outcome": "failure", "error": {}}]},
        {"status": {"progress": [{"job": "{job}", "current": 1, "total": 2}]}},
        {"status": {"logs": [{"job": "{job}", "lines": ["x"]}]}},
    ],
)
def test_updates_for_jobs_the_worker_does_not_hold_are_refused(
    server: ServerProcess, part: dict[str, Any]
) -> None:
    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(RESIZE)
        job_id = await rota.http.push("resize", [1], meta={"logs": True})
        async with rota.worker() as owner, rota.worker() as thief:
            await owner.register([RESIZE], wants=1)
            await owner.assignment()
            await thief.register([RESIZE])
            raw = orjson.dumps(part).decode().replace("{job}", job_id)
            seq = await thief.heartbeat(**orjson.loads(raw))
            [error] = await thief.round_trip()
            assert (error["code"], error["seq"], error["fatal"]) == ("job_not_held", seq, False)
            assert error["job"] in (job_id, "no-such-job")
            job = await rota.http.job(job_id)
            assert job["state"] == "active"
            assert "progress" not in job
            assert (await rota.http.get(f"/rota/v1/jobs/{job_id}/logs"))["lines"] == []
            # The owner is unaffected and finishes it.
            await owner.heartbeat(results=[{"job": job_id, "outcome": "success", "data": "ok"}])
            await owner.round_trip()
            assert (await rota.http.job(job_id))["result"] == "ok"

    run(server, scenario)


@pytest.mark.server_args("--rota-max-message", "2048")
def test_oversized_messages_close_with_1009(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(RESIZE)
        async with rota.worker() as neighbour:
            await neighbour.register([RESIZE], wants=1)
            async with rota.worker() as big:
                await big.register([])
                await big.send(status={"alerts": [{"message": "x" * 3000}]})
                code, [error] = await big.closed()
                assert (code, error["code"]) == (1009, "message_too_big")
            async with rota.worker() as huge:
                # Far over the limit: aiohttp refuses the frame from its header and closes
                # with 1009 while the rest of the frame is still on its way. Whether this
                # client finishes writing first (and reads the 1009) or meets the reset of
                # a socket closed with unread data depends on timing; either way the server
                # handled no message and stays up for the others.
                await huge.register([])
                try:
                    await huge.send(status={"alerts": [{"message": "x" * 1_000_000}]})
                except ConnectionError:  # reset while writing
                    reset = True
                else:
                    reset = False
                code, messages = await huge.closed()
                assert messages == []
                assert code == 1009 or (reset and code in (None, 1006)), code
            await _healthy_neighbour_still_works(rota, neighbour)

    run(server, scenario)


def test_plain_http_on_work_is_told_to_upgrade(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        status, body = await rota.http.request("GET", "/work")
        assert status == 426
        assert body["error"]["code"] == "invalid_request"

    run(server, scenario)
