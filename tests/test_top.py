"""`jobwire top` driven headless by Textual's pilot in an 80x24 terminal, against a real server:
it lists queues and workers of every protocol, `p` pauses and resumes a queue, `w` quiets a
worker, `s` sorts, and the tables fit 80 columns."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from textual.widgets import DataTable

from jobwire.top import Top
from tests.interop.gearman_raw import Cmd, GearmanSocket
from tests.servers import ServerProcess, start_jobwire

DEADLINE = 30.0


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    server = start_jobwire(http=True)
    try:
        yield server
    finally:
        server.stop()


def call(server: ServerProcess, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.http_port}{path}",
        data=data,
        method=method,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=DEADLINE) as response:
        return json.loads(response.read())


async def until(pilot: Any, check: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + DEADLINE
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


def rows(table: DataTable[Any]) -> list[list[str]]:
    return [[str(cell) for cell in table.get_row_at(i)] for i in range(table.row_count)]


def test_top_shows_pauses_quiets_and_sorts(server: ServerProcess) -> None:
    with GearmanSocket(server) as gearman:
        for _ in range(3):
            gearman.submit_bg("top-busy", b"x")
        gearman.submit_bg("top-idle", b"x")
    call(server, "POST", "/ojs/v1/workers/register", {"worker_id": "top-w", "queues": ["q"]})

    def paused(name: str) -> bool:
        items = call(server, "GET", "/ojs/v1/admin/queues?per_page=1000")["items"]
        return bool(next(q for q in items if q["name"] == name)["paused"])

    async def scenario() -> None:
        app = Top(f"http://127.0.0.1:{server.http_port}", refresh_every=0.2)
        async with app.run_test(size=(80, 24)) as pilot:
            queues = app.query_one("#queues", DataTable)
            workers = app.query_one("#workers", DataTable)
            await until(
                pilot,
                lambda: (
                    {"top-busy", "top-idle"} <= {r[0] for r in rows(queues)}
                    and any(r[0] == "top-w" for r in rows(workers))
                ),
                "the queues and the worker",
            )
            # Sorted by ready jobs, most first.
            names = [r[0] for r in rows(queues)]
            assert names.index("top-busy") < names.index("top-idle")
            assert {r[0]: r[1] for r in rows(queues)}["top-busy"] == "3"
            for table in (queues, workers):
                assert table.virtual_size.width <= 80, table.virtual_size

            queues.focus()
            queues.move_cursor(row=names.index("top-busy"))
            await pilot.press("p")
            await until(pilot, lambda: paused("top-busy"), "the queue to pause")
            await until(
                pilot,
                lambda: {r[0]: r[5] for r in rows(queues)}.get("top-busy") == "paused",
                "the paused queue on screen",
            )
            queues.move_cursor(row=[r[0] for r in rows(queues)].index("top-busy"))
            await pilot.press("p")
            await until(pilot, lambda: not paused("top-busy"), "the queue to resume")

            await pilot.press("s")  # next column: active
            assert app.sort_column["queues"] == 2

            workers.focus()
            ids = [r[0] for r in rows(workers)]
            workers.move_cursor(row=ids.index("top-w"))
            await pilot.press("w")
            beat = call(server, "POST", "/ojs/v1/workers/heartbeat", {"worker_id": "top-w"})
            assert beat["state"] == "quiet"
            await until(
                pilot,
                lambda: {r[0]: r[2] for r in rows(workers)}.get("top-w") == "quiet",
                "the quiet worker on screen",
            )

    asyncio.run(scenario())


def test_top_says_when_the_server_cannot_be_reached() -> None:
    async def scenario() -> None:
        app = Top("http://127.0.0.1:9", refresh_every=0.2)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.error is not None, "the error")
            assert "127.0.0.1:9" in str(app.query_one("#status").render())

    asyncio.run(scenario())


def test_a_gearman_worker_is_listed_with_its_abilities(server: ServerProcess) -> None:
    with GearmanSocket(server) as worker:
        worker.send(Cmd.CAN_DO, "top-fn")

        async def scenario() -> None:
            app = Top(f"http://127.0.0.1:{server.http_port}", refresh_every=0.2)
            async with app.run_test(size=(80, 24)) as pilot:
                workers = app.query_one("#workers", DataTable)
                await until(
                    pilot,
                    lambda: any(r[1] == "gearman" and r[4] == "top-fn" for r in rows(workers)),
                    "the Gearman worker",
                )

        asyncio.run(scenario())
