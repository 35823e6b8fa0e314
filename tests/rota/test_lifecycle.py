"""An operator directs a Rota worker (`POST /ojs/v1/admin/workers/rota:N/state`), and the
server beats so a worker can tell a silent server from an idle one (schema revision 2)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.rota.support import RawWorker, Rota, run, spec_ref
from tests.servers import ServerProcess

RESIZE = {"name": "resize"}


async def register(worker: RawWorker, *, wants: int, revision: int | None) -> dict[str, Any]:
    register: dict[str, Any] = {"hostname": "h", "specs": [spec_ref(RESIZE)]}
    if revision is not None:
        register["revision"] = revision
    await worker.send(register=register, wants=wants)
    return await worker.expect("welcome")


async def direct(rota: Rota, worker_id: str, state: str, expect: int = 200) -> Any:
    path = f"/ojs/v1/admin/workers/{worker_id}/state"
    return await rota.http.post(path, {"state": state}, expect)


@pytest.mark.server_args("--rota-heartbeat-timeout", "60")
def test_quiet_running_and_terminate_reach_the_worker_over_its_socket(
    server: ServerProcess,
) -> None:
    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(RESIZE)
        first = await rota.http.push("resize", [1])
        async with rota.worker() as worker:
            welcome = await register(worker, wants=2, revision=2)
            me = welcome["worker"]
            assert (await worker.assignment())["job"]["id"] == first

            reply = await direct(rota, me, "quiet")
            assert (reply["worker"]["worker_id"], reply["worker"]["state"]) == (me, "quiet")
            assert (await worker.expect("state"))["state"] == "quiet"
            # Quiet: the worker still wants 2 and holds 1, yet gets nothing new.
            second = await rota.http.push("resize", [2])
            assert await worker.round_trip() == []
            assert (await rota.http.job(second))["state"] == "available"
            [listed] = (await rota.http.get("/rota/v1/workers"))["workers"]
            assert listed["state"] == "quiet"

            await direct(rota, me, "running")
            assert (await worker.expect("state"))["state"] == "running"
            assert (await worker.assignment())["job"]["id"] == second

            await direct(rota, me, "terminate")
            assert (await worker.expect("state"))["state"] == "terminate"
            conflict = await direct(rota, me, "running", 409)
            assert conflict["error"]["code"] == "conflict"
            # It finishes what it holds; then the server closes the socket, after the ack.
            seq = await worker.heartbeat(
                results=[
                    {"job": first, "outcome": "success", "data": 1},
                    {"job": second, "outcome": "success", "data": 2},
                ]
            )
            code, before = await worker.closed()
            assert code == 1000
            assert [m for m in before if m["type"] == "ack"] == [
                {"v": 1, "type": "ack", "seq": seq}
            ]
        for job_id in (first, second):
            assert (await rota.http.job(job_id))["state"] == "completed"
        assert (await rota.http.get("/rota/v1/workers"))["workers"] == []
        missing = await direct(rota, me, "quiet", 404)
        assert missing["error"]["code"] == "not_found"

    run(server, scenario)


def test_a_terminated_idle_worker_is_closed_at_once_even_of_revision_1(
    server: ServerProcess,
) -> None:
    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(RESIZE)
        async with rota.worker() as old:
            welcome = await register(old, wants=1, revision=None)
            assert "beat_interval" not in welcome
            await direct(rota, welcome["worker"], "terminate")
            code, before = await old.closed()
            assert code == 1000
            assert before == [{"v": 1, "type": "state", "state": "terminate"}]
        job_id = await rota.http.push("resize", [1])
        assert (await rota.http.job(job_id))["state"] == "available"

    run(server, scenario)


@pytest.mark.server_args("--rota-beat-interval", "0.05", "--rota-heartbeat-timeout", "60")
def test_the_server_beats_workers_of_revision_2_only(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        async with rota.worker() as old, rota.worker() as new:
            old_welcome = await register(old, wants=0, revision=None)
            assert "revision" not in old_welcome or old_welcome["revision"] >= 2
            assert "beat_interval" not in old_welcome
            welcome = await register(new, wants=0, revision=2)
            assert (welcome["revision"], welcome["beat_interval"]) == (2, 0.05)
            # Nothing to say to an idle worker but that the server lives, again and again.
            for _ in range(3):
                assert await new.recv() == {"v": 1, "type": "beat"}
            # The old worker, connected for longer, was never sent one.
            assert await old.round_trip() == []

    run(server, scenario)
