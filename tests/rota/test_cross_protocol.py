"""One engine: Gearman and OJS jobs run on `/work` WebSocket workers, and what the worker
reports (progress, results, failures) is what Gearman clients and OJS readers see."""

from __future__ import annotations

import asyncio
import base64

from tests.interop.gearman_raw import Cmd, GearmanSocket
from tests.rota.support import Rota, run
from tests.servers import ServerProcess

REVERSE = {"name": "reverse", "description": "reverse a string"}


def test_gearman_foreground_job_runs_on_a_websocket_worker(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(REVERSE)
        with GearmanSocket(server) as client, GearmanSocket(server) as observer:
            async with rota.worker() as worker:
                await worker.register([REVERSE], wants=1)
                handle = client.submit_fg("reverse", b"hello")
                assignment = await worker.assignment()
                job = assignment["job"]
                assert (job["id"], job["spec"], job["queue"]) == (handle, "reverse", "reverse")
                assert job["payload"] == "hello"  # the Gearman bytes
                assert job["args"] == ["hello"]  # the OJS view of them
                await worker.heartbeat(
                    status={"progress": [{"job": handle, "current": 1, "total": 2}]}
                )
                await worker.round_trip()
                status = observer.request(Cmd.GET_STATUS, handle, reply=Cmd.STATUS_RES)
                assert status.args[1:] == (b"1", b"1", b"1", b"2")  # known, running, 1/2
                ojs = await rota.http.job(handle)
                assert (ojs["state"], ojs["progress"]) == ("active", {"current": 1, "total": 2})
                await worker.heartbeat(
                    results=[{"job": handle, "outcome": "success", "data": "olleh"}]
                )
                packets = await asyncio.to_thread(client.results_until_done)
        assert [(p.type, p.args[1:]) for p in packets] == [
            (Cmd.WORK_STATUS, (b"1", b"2")),
            (Cmd.WORK_COMPLETE, (b"olleh",)),
        ]

    run(server, scenario)


def test_a_failure_reaches_the_gearman_client_as_work_fail(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(REVERSE)
        with GearmanSocket(server) as client:
            async with rota.worker() as worker:
                await worker.register([REVERSE], wants=1)
                handle = client.submit_fg("reverse", b"x")
                await worker.assignment()
                error = {"code": "too_short", "message": "need two letters"}
                await worker.heartbeat(
                    results=[{"job": handle, "outcome": "failure", "error": error}]
                )
                packets = await asyncio.to_thread(client.results_until_done)
        assert [p.type for p in packets] == [Cmd.WORK_FAIL]

    run(server, scenario)


def test_binary_gearman_payloads_and_results_travel_as_base64(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(REVERSE)
        with GearmanSocket(server) as client:
            async with rota.worker() as worker:
                await worker.register([REVERSE], wants=1)
                handle = client.submit_fg("reverse", b"\xff\x00\x01")
                job = (await worker.assignment())["job"]
                assert "payload" not in job
                assert base64.b64decode(job["payload_base64"]) == b"\xff\x00\x01"
                data = base64.b64encode(b"\x01\x00\xff").decode()
                await worker.heartbeat(
                    results=[{"job": handle, "outcome": "success", "data_base64": data}]
                )
                packets = await asyncio.to_thread(client.results_until_done)
        assert packets[-1].type is Cmd.WORK_COMPLETE
        assert packets[-1].args[1] == b"\x01\x00\xff"

    run(server, scenario)


def test_gearman_background_job_result_is_visible_over_ojs(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(REVERSE)
        with GearmanSocket(server) as client:
            handle = client.submit_bg("reverse", b"abc")
        async with rota.worker() as worker:
            await worker.register([REVERSE], wants=1)
            assert (await worker.assignment())["job"]["id"] == handle
            await worker.heartbeat(
                results=[{"job": handle, "outcome": "success", "data": {"reversed": "cba"}}]
            )
            await worker.round_trip()
        job = await rota.http.job(handle)
        assert (job["state"], job["result"]) == ("completed", {"reversed": "cba"})

    run(server, scenario)


def test_ojs_push_runs_on_a_websocket_worker(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(REVERSE)
        async with rota.worker() as worker:
            await worker.register([REVERSE], wants=1)
            job_id = await rota.http.push("reverse", ["stressed"])
            job = (await worker.assignment())["job"]
            assert (job["id"], job["args"]) == (job_id, ["stressed"])
            await worker.heartbeat(
                results=[{"job": job_id, "outcome": "success", "data": "desserts"}]
            )
            await worker.round_trip()
        done = await rota.http.job(job_id)
        assert (done["state"], done["result"]) == ("completed", "desserts")

    run(server, scenario)


def test_cancelling_over_ojs_revokes_the_job_on_the_worker(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(REVERSE)
        async with rota.worker() as worker:
            await worker.register([REVERSE], wants=1)
            job_id = await rota.http.push("reverse", ["x"])
            await worker.assignment()
            status, body = await rota.http.request("DELETE", f"/ojs/v1/jobs/{job_id}")
            assert (status, body["job"]["state"]) == (200, "cancelled")
            revoke = await worker.expect("revoke")
            assert (revoke["job"], revoke["reason"]) == (job_id, "cancelled")
            # Its late result is refused; the slot it held is free again.
            seq = await worker.heartbeat(
                results=[{"job": job_id, "outcome": "success", "data": 1}], wants=1
            )
            [error] = await worker.round_trip()
            assert (error["code"], error["seq"]) == ("job_not_held", seq)
            next_id = await rota.http.push("reverse", ["y"])
            assert (await worker.assignment())["job"]["id"] == next_id

    run(server, scenario)
