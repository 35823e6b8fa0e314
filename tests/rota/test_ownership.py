"""Lease ownership on `/work`: a result or progress for a job assigned to another worker is
refused with `job_not_held` naming the job's state (never the holder) and changes nothing."""

from __future__ import annotations

from tests.rota.support import Rota, run
from tests.servers import ServerProcess

SPEC = {"name": "own", "version": 1}


def test_a_result_for_another_workers_job_is_refused_and_changes_nothing(
    server: ServerProcess,
) -> None:
    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(SPEC)
        job_id = await rota.http.push("own", [1])
        async with rota.worker() as holder, rota.worker() as intruder:
            await holder.register([SPEC], wants=1)
            assert (await holder.assignment())["job"]["id"] == job_id
            await intruder.register([SPEC], hostname="intruder")
            seq = await intruder.heartbeat(
                status={"progress": [{"job": job_id, "current": 9, "total": 9}]},
                results=[{"job": job_id, "outcome": "success", "data": "forged"}],
            )
            errors = [m for m in await intruder.round_trip() if m.get("type") == "error"]
            assert [e["code"] for e in errors] == ["job_not_held", "job_not_held"], errors
            assert all(e["seq"] == seq and e["job"] == job_id for e in errors), errors
            assert all("leased to another worker" in e["message"] for e in errors), errors
            job = await rota.http.job(job_id)
            assert job["state"] == "active" and not job.get("progress"), job
            await holder.heartbeat(results=[{"job": job_id, "outcome": "success", "data": 1}])
            await holder.round_trip()
            job = await rota.http.job(job_id)
            assert job["state"] == "completed" and job["result"] == 1, job
            # Finished now: the former holder's second result is refused too, naming it.
            await holder.heartbeat(results=[{"job": job_id, "outcome": "success", "data": 2}])
            errors = [m for m in await holder.round_trip() if m.get("type") == "error"]
            assert [e["code"] for e in errors] == ["job_not_held"], errors
            assert "completed" in errors[0]["message"], errors

    run(server, scenario)
