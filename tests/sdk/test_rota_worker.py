"""The SDK's RotaWorker obeys the operator (`jobwire worker-state rota:N ...`) and notices a
server that is gone, even one that keeps the connection open but says nothing."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from jobwire.sdk.lifecycle import WorkerState
from jobwire.sdk.ws_job import RotaJob
from jobwire.sdk.ws_worker import RotaWorker
from tests.rota.support import Rota, poll, run
from tests.servers import ServerProcess, start_jobwire, wait_for_port

HOLD = {"name": "hold"}


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    marker = request.node.get_closest_marker("server_args")
    proc = start_jobwire(list(marker.args) if marker else [], http=True)
    yield proc
    proc.stop()


def worker_state(server: ServerProcess, worker_id: str, state: str) -> str:
    url = f"http://127.0.0.1:{server.http_port}"
    done = subprocess.run(
        [sys.executable, "-m", "jobwire", "worker-state", worker_id, state, "--url", url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


async def until(check: object) -> None:
    await poll(_tick, lambda _: bool(check()))  # type: ignore[operator]


async def _tick() -> None:
    await asyncio.sleep(0)


def test_the_operator_quiets_resumes_and_terminates_a_rota_worker(server: ServerProcess) -> None:
    worker = RotaWorker(f"http://127.0.0.1:{server.http_port}", concurrency=2, grace_period=60)
    release = asyncio.Event()
    started: list[str] = []

    @worker.task("hold", spec=HOLD)
    async def hold(job: RotaJob) -> str:
        started.append(job.id)
        await release.wait()
        return f"done {job.args[0]}"

    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(HOLD)
        serving = asyncio.create_task(worker.serve())
        try:
            first = await rota.http.push("hold", [1])
            await until(lambda: started == [first])
            me = worker.worker_id
            assert me is not None and me.startswith("rota:")

            said = await asyncio.to_thread(worker_state, server, me, "quiet")
            assert said == f"{me}: quiet"
            await until(lambda: worker.state is WorkerState.QUIET)
            second = await rota.http.push("hold", [2])
            assert (await rota.http.job(second))["state"] == "available"

            await asyncio.to_thread(worker_state, server, me, "running")
            await until(lambda: started == [first, second])
            assert worker.state is WorkerState.RUNNING

            await asyncio.to_thread(worker_state, server, me, "terminate")
            await until(lambda: worker.state is not WorkerState.RUNNING)
            release.set()
            # It finishes what it holds, and exits on its own.
            await asyncio.wait_for(asyncio.shield(serving), 60)
        finally:
            worker.stop()
            release.set()
            await serving
        assert worker.state is WorkerState.TERMINATED
        for job_id, n in ((first, 1), (second, 2)):
            job = await rota.http.job(job_id)
            assert (job["state"], job["result"]) == ("completed", f"done {n}")
        workers = await poll(lambda: rota.http.get("/rota/v1/workers"), lambda b: True)
        assert workers["workers"] == []

    run(server, scenario)


@pytest.mark.server_args("--rota-beat-interval", "0.1", "--rota-heartbeat-timeout", "1")
def test_a_silent_server_is_left_and_rejoined_when_it_speaks_again(server: ServerProcess) -> None:
    worker = RotaWorker(
        f"http://127.0.0.1:{server.http_port}",
        reconnect_base=0.05,
        reconnect_cap=0.2,
        connect_timeout=2,
    )

    @worker.task("hold", spec=HOLD)
    def hold(job: RotaJob) -> str:
        return "ok"

    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(HOLD)
        serving = asyncio.create_task(worker.serve())
        try:
            await until(lambda: worker.registrations == 1)
            # Stopped, the server keeps the connection open and says nothing: only its
            # missing beats tell the worker it is gone.
            server.proc.send_signal(signal.SIGSTOP)
            try:
                await until(lambda: worker.server_silences == 1)
            finally:
                server.proc.send_signal(signal.SIGCONT)
            await until(lambda: worker.registrations == 2)
            job_id = await rota.http.push("hold", [])
            done = await rota.http.wait_job(job_id, lambda job: job["state"] == "completed")
            assert done["result"] == "ok"
        finally:
            worker.stop()
            await serving

    run(server, scenario)


def test_a_worker_reconnects_to_a_restarted_server(server: ServerProcess) -> None:
    worker = RotaWorker(
        f"http://127.0.0.1:{server.http_port}", reconnect_base=0.05, reconnect_cap=0.2
    )

    @worker.task("hold", spec=HOLD)
    def hold(job: RotaJob) -> str:
        return "again"

    async def scenario(rota: Rota) -> None:
        await rota.http.register_spec(HOLD)
        serving = asyncio.create_task(worker.serve())
        try:
            await until(lambda: worker.registrations == 1)
            server.kill()
            restarted = start_jobwire(
                ["--http-port", str(server.http_port)], port=server.port, workdir=server.workdir
            )
            server.proc = restarted.proc
            assert server.http_port is not None
            await asyncio.to_thread(wait_for_port, server.http_port, restarted.proc)
            await rota.http.register_spec(HOLD)  # the memory store forgot it
            await until(lambda: worker.registrations == 2)
            job_id = await rota.http.push("hold", [])
            done = await rota.http.wait_job(job_id, lambda job: job["state"] == "completed")
            assert done["result"] == "again"
        finally:
            worker.stop()
            await serving

    run(server, scenario)
