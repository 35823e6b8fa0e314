"""The dashboard in a real browser: Debian's Chromium, headless, driven by Playwright, against
a server with Gearman, OJS and Rota workers and clients at work.

Each page loads without a console error at desktop and phone width (no sideways scrolling
on a phone) and leaves a screenshot in `.ci/artifacts/`; the overview's chart is redrawn
from the live stream; Quiet reaches an OJS and a Rota worker; Retry runs a dead job again.
Every wait is on a condition (Playwright's own, or `wait_until`).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from jobwire.sdk.client import AsyncClient
from jobwire.sdk.lifecycle import WorkerState
from jobwire.sdk.worker import Job, Worker
from jobwire.sdk.ws_job import RotaJob
from jobwire.sdk.ws_worker import RotaWorker
from tests.server.dashboard_support import Browser, wait_until
from tests.servers import ServerProcess, start_jobwire

CHROMIUM = os.environ.get("JOBWIRE_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / ".ci" / "artifacts"
ROTA_SPEC = {"name": "rota-traffic"}
VIEWPORTS = {"desktop": (1280, 900), "phone": (390, 844)}

playwright_api = pytest.importorskip("playwright.sync_api")
pytestmark = pytest.mark.skipif(
    not (os.path.exists(CHROMIUM) or shutil.which("chromium")),
    reason="Debian's chromium is not installed (.ci/run installs it)",
)


class Traffic:
    """Workers and clients of three protocols, in a thread with its own event loop, until
    `stop()`: a Gearman worker and client, an OJS worker (registered, heartbeating) and
    producer, a Rota worker and producer. Bounded: each producer stops after `limit` jobs."""

    def __init__(self, server: ServerProcess, limit: int = 20_000) -> None:
        self.server = server
        self.limit = limit
        self.base = f"http://127.0.0.1:{server.http_port}"
        self.ojs_state = "running"  # what the OJS worker's latest heartbeat reply said
        self.ojs_worker = "ojs-live"
        self.rota = RotaWorker(self.base, concurrency=2)
        self.gearman = Worker([server.address])
        self.done = 0
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, name="traffic", daemon=True)
        self._failure: BaseException | None = None

        @self.rota.task("rota-traffic", spec=ROTA_SPEC)
        def rota_task(job: RotaJob) -> str:
            return "rota ok"

        @self.gearman.task("gm-traffic")
        def gearman_task(job: Job) -> bytes:
            job.send_status(1, 2)
            return b"gearman ok"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)
        if self._failure is not None:
            raise self._failure

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported by stop()
            self._failure = exc

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with aiohttp.ClientSession() as http:
            await self._post(http, "/rota/v1/specs", ROTA_SPEC)
            await self._post(
                http,
                "/ojs/v1/workers/register",
                {"worker_id": self.ojs_worker, "queues": ["ojs-traffic"], "concurrency": 5},
            )
            tasks = [
                asyncio.create_task(self.rota.serve()),
                asyncio.create_task(self.gearman.serve()),
                asyncio.create_task(self._ojs_worker(http)),
                asyncio.create_task(self._producers(http)),
            ]
            await self._stop.wait()
            self.rota.stop()
            self.gearman.stop()
            for task in tasks[2:]:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            for result in results:
                if isinstance(result, Exception) and not isinstance(result, asyncio.CancelledError):
                    raise result

    async def _post(self, http: aiohttp.ClientSession, path: str, body: Any) -> Any:
        async with http.post(self.base + path, json=body) as response:
            assert response.status < 300, (path, response.status, await response.text())
            return await response.json(content_type=None)

    async def _ojs_worker(self, http: aiohttp.ClientSession) -> None:
        me = self.ojs_worker
        while True:
            beat = await self._post(http, "/ojs/v1/workers/heartbeat", {"worker_id": me})
            self.ojs_state = beat["state"]
            if self.ojs_state == "running":
                body = {"worker_id": me, "queues": ["ojs-traffic"], "count": 5}
                fetched = await self._post(http, "/ojs/v1/workers/fetch", body)
                for job in fetched["jobs"]:
                    await self._post(
                        http, "/ojs/v1/workers/ack", {"job_id": job["id"], "result": "ok"}
                    )
                    self.done += 1
            await asyncio.sleep(0.05)  # pacing of the traffic, not a wait for a result

    async def _producers(self, http: aiohttp.ClientSession) -> None:
        async with AsyncClient([self.server.address]) as gearman:
            for n in range(self.limit):
                await gearman.submit_background("gm-traffic", str(n).encode())
                ojs = {"type": "ojs.traffic", "args": [n], "options": {"queue": "ojs-traffic"}}
                await self._post(http, "/ojs/v1/jobs", ojs)
                await self._post(http, "/ojs/v1/jobs", {"type": "rota-traffic", "args": [n]})
                if n % 7 == 0:  # some failures for the chart's third line
                    await self._post(
                        http,
                        "/ojs/v1/jobs",
                        {
                            "type": "gone",
                            "args": [n],
                            "options": {
                                "queue": "failing",
                                "retry": {"max_attempts": 1, "on_exhaustion": "dead_letter"},
                            },
                        },
                    )
                await asyncio.sleep(0.1)  # pacing


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("dashboard-browser")
    server = start_jobwire(http=True, store=f"sqlite:{workdir / 'jobs.db'}", workdir=workdir)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def traffic(server: ServerProcess) -> Iterator[Traffic]:
    traffic = Traffic(server)
    traffic.start()
    api = Browser(server.http_port or 0)

    def protocols() -> set[str] | None:
        workers = api.json("GET", "/ojs/v1/workers")["workers"]
        seen = {w["protocol"] for w in workers if w["state"] == "running"}
        return seen if {"gearman", "ojs", "rota"} <= seen else None

    wait_until(protocols, "Gearman, OJS and Rota workers", deadline=60)
    wait_until(lambda: traffic.done >= 3 or None, "OJS jobs done", deadline=60)
    try:
        yield traffic
    finally:
        traffic.stop()


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium"),
            args=["--no-sandbox", "--disable-dev-shm-usage"],
        )
        try:
            yield browser
        finally:
            browser.close()


def open_page(chromium: Any, viewport: str = "desktop") -> tuple[Any, list[str]]:
    width, height = VIEWPORTS[viewport]
    page = chromium.new_page(viewport={"width": width, "height": height})
    page.set_default_timeout(30_000)
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    return page, errors


PAGES = {
    "overview": "/",
    "queues": "/ui/queues",
    "queue": "/ui/queues/ojs-traffic",
    "workers": "/ui/workers",
    "jobs-dead": "/ui/jobs?list=dead",
    "jobs-scheduled": "/ui/jobs?list=scheduled",
    "cron": "/ui/cron",
    "workflows": "/ui/workflows",
}


@pytest.mark.parametrize("viewport", sorted(VIEWPORTS))
def test_every_page_loads_cleanly_and_is_screenshotted(
    server: ServerProcess, traffic: Traffic, chromium: Any, viewport: str
) -> None:
    """Promise: every page loads without a console error or a failed request, fits a phone's
    width without sideways scrolling, and leaves a screenshot in .ci/artifacts/."""
    api = Browser(server.http_port or 0)
    entry = {"name": "hourly", "expression": "0 * * * *", "job_template": {"type": "t"}}
    api.json("POST", "/ojs/v1/cron", entry)
    job = wait_until(
        lambda: next(
            iter(api.json("POST", "/ojs/v1/workers/fetch", {"queues": ["failing"]})["jobs"]), None
        ),
        "a failing job",
    )
    api.json(
        "POST",
        "/ojs/v1/workers/nack",
        {"job_id": job["id"], "error": {"code": "boom", "message": "failed for the test"}},
    )
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    pages = {**PAGES, "job": f"/ui/jobs/{job['id']}"}
    page, errors = open_page(chromium, viewport)
    failed: list[str] = []
    page.on("requestfailed", lambda r: failed.append(r.url) if "/ui/stream" not in r.url else None)
    page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    try:
        for name, path in pages.items():
            page.goto(server_url(server) + path, wait_until="load")
            assert page.locator("main h1").count() == 1
            overflow = page.evaluate(
                "document.documentElement.scrollWidth - document.documentElement.clientWidth"
            )
            assert overflow <= 1, f"{name} scrolls sideways by {overflow}px at {viewport} width"
            page.screenshot(
                path=str(ARTIFACTS / f"dashboard-{name}-{viewport}.png"), full_page=True
            )
    finally:
        page.close()
    assert errors == [] and failed == [], (errors, failed)


def server_url(server: ServerProcess) -> str:
    return f"http://127.0.0.1:{server.http_port}"


def test_the_chart_follows_the_live_stream(
    server: ServerProcess, traffic: Traffic, chromium: Any
) -> None:
    """Promise: with traffic on every listener, the overview's chart is redrawn from the
    server-sent events: its submitted line changes and the per-second figures are live."""
    page, errors = open_page(chromium)
    try:
        page.goto(server_url(server) + "/")
        before = page.get_attribute("#line-submitted", "points")

        def updates() -> int:
            return int(page.get_attribute("#chart", "data-updates") or 0)

        # The page's CSP forbids eval, so conditions are polled from here, not in the page.
        wait_until(lambda: updates() >= 3 or None, "three chart updates")
        wait_until(
            lambda: page.get_attribute("#line-submitted", "points") != before or None,
            "the submitted line to change",
        )

        def peak() -> float:
            points = page.get_attribute("#line-submitted", "points") or ""
            return min(float(p.split(",")[1]) for p in points.split()) if points else 999.0

        wait_until(lambda: peak() < 158 or None, "a submitted rate above zero on the chart")
        assert float(page.inner_text("#now-submitted")) >= 0
    finally:
        page.close()
    assert errors == []


def test_quiet_reaches_an_ojs_and_a_rota_worker(
    server: ServerProcess, traffic: Traffic, chromium: Any
) -> None:
    """Promise: Quiet on the workers page takes effect on the worker itself: the OJS worker's
    heartbeat is answered quiet, the Rota worker goes quiet; Resume undoes both."""
    rota_id = traffic.rota.worker_id
    assert rota_id is not None
    page, errors = open_page(chromium)
    try:
        for worker in (traffic.ojs_worker, rota_id):
            page.goto(server_url(server) + "/ui/workers")
            page.locator(f'tr[data-worker="{worker}"] button', has_text="Quiet").click()
            page.wait_for_url("**/ui/workers")
            assert page.locator(f'tr[data-worker="{worker}"] td.state').inner_text() == "quiet"
        wait_until(lambda: traffic.ojs_state == "quiet" or None, "the OJS worker to hear quiet")
        wait_until(
            lambda: traffic.rota.state is WorkerState.QUIET or None, "the Rota worker to go quiet"
        )
        for worker in (traffic.ojs_worker, rota_id):
            page.goto(server_url(server) + "/ui/workers")
            page.locator(f'tr[data-worker="{worker}"] button', has_text="Resume").click()
            page.wait_for_url("**/ui/workers")
        wait_until(lambda: traffic.ojs_state == "running" or None, "the OJS worker to resume")
        wait_until(
            lambda: traffic.rota.state is WorkerState.RUNNING or None, "the Rota worker to resume"
        )
    finally:
        page.close()
    assert errors == []


def test_retry_of_a_dead_job_runs_it_again(
    server: ServerProcess, traffic: Traffic, chromium: Any
) -> None:
    """Promise: Retry on a dead job's page puts it back; the OJS worker runs it to the end."""
    api = Browser(server.http_port or 0)
    retry = {"max_attempts": 1, "on_exhaustion": "dead_letter"}
    body = {"type": "flaky", "args": ["x"], "options": {"queue": "ojs-retry", "retry": retry}}
    job_id = api.json("POST", "/ojs/v1/jobs", body)["job"]["id"]
    [fetched] = api.json("POST", "/ojs/v1/workers/fetch", {"queues": ["ojs-retry"]})["jobs"]
    api.json(
        "POST",
        "/ojs/v1/workers/nack",
        {"job_id": fetched["id"], "error": {"code": "e", "message": "first try"}},
    )
    page, errors = open_page(chromium)
    try:
        page.goto(server_url(server) + "/ui/jobs?list=dead")
        page.locator(f'input[type=checkbox][value="{job_id}"]').check()
        page.locator("button", has_text="Retry").click()
        page.wait_for_url("**/ui/jobs?list=dead")
        assert page.locator(f'input[value="{job_id}"]').count() == 0
    finally:
        page.close()
    [again] = api.json("POST", "/ojs/v1/workers/fetch", {"queues": ["ojs-retry"]})["jobs"]
    assert again["id"] == job_id
    api.json("POST", "/ojs/v1/workers/ack", {"job_id": job_id, "result": "second try"})
    assert api.json("GET", f"/ojs/v1/jobs/{job_id}")["job"]["state"] == "completed"
    assert errors == []
