"""Workers that go silent or drop their connection: their jobs go back, the attempt counted."""

from __future__ import annotations

import pytest

from tests.rota.support import Rota, run
from tests.servers import ServerProcess

RESIZE = {"name": "resize"}


@pytest.mark.server_args("--rota-heartbeat-timeout", "1")
def test_a_silent_worker_is_gone_and_its_job_requeued(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(RESIZE)
        job_id = await rota.http.push("resize", [1])
        async with rota.worker() as silent:
            welcome = await silent.register([RESIZE], wants=1)
            assert welcome["heartbeat_timeout"] == 1.0
            assert (await silent.assignment())["job"]["attempt"] == 1
            # Say nothing more. The server gives up on the worker and tells it why.
            code, messages = await silent.closed()
            assert code == 1008
            [error] = messages
            assert (error["code"], error["fatal"]) == ("heartbeat_timeout", True)
        job = await rota.http.job(job_id)
        assert (job["state"], job["attempt"]) == ("available", 1)
        assert job["error"]["message"] == "heartbeat timeout"
        async with rota.worker() as worker:
            await worker.register([RESIZE], wants=1)
            again = (await worker.assignment())["job"]
            assert (again["id"], again["attempt"]) == (job_id, 2)
            await worker.heartbeat(results=[{"job": job_id, "outcome": "success", "data": 1}])
            await worker.round_trip()
        assert (await rota.http.job(job_id))["state"] == "completed"

    run(server, scenario)


def test_a_worker_that_disconnects_mid_job_gives_it_back(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(RESIZE)
        job_id = await rota.http.push("resize", [1])
        async with rota.worker() as leaving:
            await leaving.register([RESIZE], wants=1)
            await leaving.assignment()
        job = await rota.http.wait_job(job_id, lambda job: job["state"] == "available")
        assert job["attempt"] == 1
        assert job["error"]["type"] == "worker_death"
        async with rota.worker() as worker:
            await worker.register([RESIZE], wants=1)
            again = (await worker.assignment())["job"]
            assert (again["id"], again["attempt"]) == (job_id, 2)

    run(server, scenario)


def test_a_vanishing_worker_uses_up_the_jobs_attempts(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(RESIZE)
        job_id = await rota.http.push("resize", [1], options={"retry": {"max_attempts": 2}})
        for attempt in (1, 2):
            async with rota.worker() as worker:
                await worker.register([RESIZE], wants=1)
                assert (await worker.assignment())["job"]["attempt"] == attempt
        job = await rota.http.wait_job(job_id, lambda job: job["state"] == "discarded")
        assert job["attempt"] == 2

    run(server, scenario)


def test_a_waiting_worker_that_leaves_passes_the_job_on(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(RESIZE)
        async with rota.worker() as stays:
            await stays.register([RESIZE], wants=0)
            async with rota.worker() as leaves:
                await leaves.register([RESIZE], wants=1)
                await leaves.round_trip()
            await stays.heartbeat(wants=1)
            await stays.round_trip()
            job_id = await rota.http.push("resize", [1])
            assert (await stays.assignment())["job"]["id"] == job_id

    run(server, scenario)
