"""The SDK's RotaWorker against a real server: the Gearman worker's task API over `/work`."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from jobwire.sdk import JobFailed
from jobwire.sdk.ws_job import Retry, RotaJob
from jobwire.sdk.ws_worker import RotaWorker
from tests.interop.gearman_raw import Cmd, GearmanSocket
from tests.rota.support import Rota, poll, run
from tests.servers import ServerProcess

RESIZE = {"name": "resize", "version": 3}


def with_worker(
    server: ServerProcess,
    worker: RotaWorker,
    scenario: Callable[[Rota], Awaitable[None]],
) -> None:
    """Run `scenario` while `worker` serves; stop the worker gracefully afterwards."""

    async def main(rota: Rota) -> None:
        serving = asyncio.create_task(worker.serve())
        try:
            await poll(lambda: _sleep0(worker), lambda w: w.worker_id is not None)
            await scenario(rota)
        finally:
            worker.stop()
            await serving

    run(server, main)


async def _sleep0(worker: RotaWorker) -> RotaWorker:
    await asyncio.sleep(0)
    return worker


def make_worker(server: ServerProcess, **kwargs: Any) -> RotaWorker:
    return RotaWorker(f"http://127.0.0.1:{server.http_port}", grace_period=10, **kwargs)


def test_async_and_thread_tasks_run_ojs_and_gearman_jobs(server: ServerProcess) -> None:
    worker = make_worker(server, concurrency=2)
    threads: list[str] = []

    @worker.task("resize", spec=RESIZE)
    async def resize(job: RotaJob) -> dict[str, Any]:
        path, size = job.args
        job.send_status(1, 2)
        return {"path": path, "size": size, "attempt": job.attempt}

    @worker.task("reverse")
    def reverse(job: RotaJob) -> str:
        threads.append(threading.current_thread().name)
        return job.text[::-1]

    async def scenario(rota: Rota) -> None:
        assert worker.specs_accepted == {"resize": True, "reverse": True}
        job_id = await rota.http.push("resize", ["a.png", 64])
        done = await rota.http.wait_job(job_id, lambda job: job["state"] == "completed")
        assert done["result"] == {"path": "a.png", "size": 64, "attempt": 1}
        assert done["progress"] == {"current": 1, "total": 2}
        with GearmanSocket(server) as client:
            handle = client.submit_fg("reverse", b"stressed")
            packets = await asyncio.to_thread(client.results_until_done)
        assert packets[-1].type is Cmd.WORK_COMPLETE
        assert packets[-1].args[1:] == (b"desserts",)
        assert handle
        assert threads and threads[0].startswith("jobwire-")

    async def setup(rota: Rota) -> None:
        await rota.http.register_spec(RESIZE)
        await rota.http.register_spec({"name": "reverse"})

    run(server, setup)
    with_worker(server, worker, scenario)


def test_failures_and_retries(server: ServerProcess) -> None:
    worker = make_worker(server)
    tries: list[int] = []

    @worker.task("flaky")
    async def flaky(job: RotaJob) -> str:
        tries.append(job.attempt)
        if job.attempt == 1:
            raise Retry("not yet")
        return "finally"

    @worker.task("broken")
    async def broken(job: RotaJob) -> None:
        raise ValueError("bad input")

    @worker.task("refuses")
    def refuses(job: RotaJob) -> None:
        raise JobFailed(job.handle, "no thanks")

    async def setup(rota: Rota) -> None:
        for name in ("flaky", "broken", "refuses"):
            await rota.http.register_spec({"name": name})

    async def scenario(rota: Rota) -> None:
        flaky_id = await rota.http.push("flaky", [])
        done = await rota.http.wait_job(flaky_id, lambda job: job["state"] == "completed")
        assert (done["attempt"], done["result"]) == (2, "finally")
        assert tries == [1, 2]
        broken_id = await rota.http.push("broken", [])
        failed = await rota.http.wait_job(broken_id, lambda job: job["state"] == "discarded")
        assert (failed["error"]["code"], failed["error"]["message"]) == ("ValueError", "bad input")
        refused_id = await rota.http.push("refuses", [])
        failed = await rota.http.wait_job(refused_id, lambda job: job["state"] == "discarded")
        assert failed["error"]["code"] == "JobFailed"

    run(server, setup)
    with_worker(server, worker, scenario)


def test_logs_and_alerts_reach_the_server(server: ServerProcess) -> None:
    worker = make_worker(server)

    @worker.task("report")
    def report(job: RotaJob) -> None:
        job.log("step 1", "step 2")
        job.alert("disk nearly full", "error")

    async def setup(rota: Rota) -> None:
        await rota.http.register_spec({"name": "report"})

    async def scenario(rota: Rota) -> None:
        job_id = await rota.http.push("report", [], meta={"logs": True})
        await rota.http.wait_job(job_id, lambda job: job["state"] == "completed")
        logs = await rota.http.get(f"/rota/v1/jobs/{job_id}/logs")
        assert [line["line"] for line in logs["lines"]] == ["step 1", "step 2"]
        alerts = (await rota.http.get("/rota/v1/alerts"))["alerts"]
        assert [(a["level"], a["message"], a["job"]) for a in alerts] == [
            ("error", "disk nearly full", job_id)
        ]

    run(server, setup)
    with_worker(server, worker, scenario)


def test_a_worker_with_an_old_spec_is_told_and_gets_nothing(server: ServerProcess) -> None:
    worker = make_worker(server)

    @worker.task("resize", spec={"name": "resize", "version": 1})
    async def resize(job: RotaJob) -> None:
        raise AssertionError("must not run")

    async def setup(rota: Rota) -> None:
        await rota.http.register_spec(RESIZE)

    async def scenario(rota: Rota) -> None:
        assert worker.specs_accepted == {"resize": False}
        [listed] = (await rota.http.get("/rota/v1/workers"))["workers"]
        assert listed["specs"][0]["reason"] == "checksum_mismatch"

    run(server, setup)
    with_worker(server, worker, scenario)


def test_stop_lets_running_jobs_finish(server: ServerProcess) -> None:
    worker = make_worker(server)
    started = asyncio.Event()
    release = asyncio.Event()

    @worker.task("slow")
    async def slow(job: RotaJob) -> str:
        started.set()
        await release.wait()
        return "finished"

    async def main(rota: Rota) -> None:
        await rota.http.register_spec({"name": "slow"})
        serving = asyncio.create_task(worker.serve())
        job_id = await rota.http.push("slow", [])
        await asyncio.wait_for(started.wait(), 30)
        worker.stop()
        release.set()
        await serving
        done = await rota.http.wait_job(job_id, lambda job: job["state"] == "completed")
        assert done["result"] == "finished"

    run(server, main)


def test_task_spec_must_name_the_task() -> None:
    worker = RotaWorker()
    with pytest.raises(ValueError, match="must match"):
        worker.add_task("a", lambda job: None, spec={"name": "b"})
