"""The OjsWorker with a server that has neither jobwire's registration extension nor the HTTP
binding's `/workers/*` routes, only the worker-protocol seed's `/jobs/fetch`,
`/jobs/:id/ack` and `/jobs/:id/nack`: a minimal in-process stand-in, since jobwire has them
all. And a job given back when the grace period is over (against jobwire)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

from jobwire.sdk.lifecycle import WorkerState
from jobwire.sdk.ojs_worker import SEED_PATHS, OjsWorker
from tests.interop.gearman_raw import DEADLINE
from tests.sdk import fixtures_ojs
from tests.sdk.ojs_support import Markers, Ojs, new_worker, serving
from tests.servers import ServerProcess, start_jobwire


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    proc = start_jobwire(http=True)
    yield proc
    proc.stop()


class SeedServer:
    """Jobs in a list; fetch, ack and nack on the seed's paths, and nothing else."""

    def __init__(self, jobs: list[dict[str, Any]]) -> None:
        self.available = list(jobs)
        self.acked: dict[str, Any] = {}
        self.nacked: dict[str, Any] = {}
        self.misses: list[str] = []
        self.done = asyncio.Event()
        self.total = len(jobs)
        app = web.Application(middlewares=[self.record_misses])
        app.router.add_post("/ojs/v1/jobs/fetch", self.fetch)
        app.router.add_post("/ojs/v1/jobs/{id}/ack", self.ack)
        app.router.add_post("/ojs/v1/jobs/{id}/nack", self.nack)
        self.app = app

    @web.middleware
    async def record_misses(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPNotFound:
            self.misses.append(request.path)
            raise

    async def fetch(self, request: web.Request) -> web.Response:
        body = await request.json()
        count = body["count"]
        jobs, self.available = self.available[:count], self.available[count:]
        return web.json_response({"jobs": [{**job, "state": "active"} for job in jobs]})

    async def ack(self, request: web.Request) -> web.Response:
        self.acked[request.match_info["id"]] = (await request.json())["result"]
        self._settled()
        return web.json_response({"acknowledged": True})

    async def nack(self, request: web.Request) -> web.Response:
        self.nacked[request.match_info["id"]] = (await request.json())["error"]
        self._settled()
        return web.json_response({"state": "discarded"})

    def _settled(self) -> None:
        if len(self.acked) + len(self.nacked) == self.total:
            self.done.set()


def test_a_server_without_registration_or_worker_routes_gets_plain_fetches() -> None:
    jobs = [
        {"id": "j1", "type": "upper", "queue": "default", "args": ["plain"], "attempt": 1},
        {"id": "j2", "type": "echo", "queue": "default", "args": [1, 2], "attempt": 1},
        {"id": "j3", "type": "fail", "queue": "default", "args": [], "attempt": 1},
    ]
    seed = SeedServer(jobs)

    async def scenario() -> None:
        runner = web.AppRunner(seed.app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        worker = OjsWorker(f"http://127.0.0.1:{port}", **fixtures_ojs.SETTINGS)
        worker.tasks = dict(fixtures_ojs.worker.tasks)
        serving = asyncio.create_task(worker.serve())
        try:
            await asyncio.wait_for(seed.done.wait(), DEADLINE)
        finally:
            worker.stop()
            await asyncio.wait_for(serving, DEADLINE)
            await runner.cleanup()
        assert worker.registered is False
        assert worker.state is WorkerState.TERMINATED

    asyncio.run(scenario())
    assert seed.acked == {
        "j1": "PLAIN",
        "j2": {"args": [1, 2], "payload": "[1,2]", "attempt": 1},
    }
    assert seed.nacked["j3"]["code"] == "ValueError"
    assert "/ojs/v1/workers/register" in seed.misses
    assert "/ojs/v1/workers/fetch" in seed.misses
    assert SEED_PATHS.fetch == "/jobs/fetch"


def test_a_job_still_running_after_the_grace_period_is_given_back(
    server: ServerProcess,
) -> None:
    ojs = Ojs(server)
    markers = Markers()
    worker = new_worker(server, grace_period=0.0)
    try:
        with serving(worker):
            held = ojs.push("hold", markers.args("g1"))
            markers.wait_started("g1")
        job = ojs.job(held)
        assert job["state"] == "available"  # requeued at once, for another worker
        assert job["errors"][-1]["code"] == "worker_shutdown"
    finally:
        markers.release("g1")
