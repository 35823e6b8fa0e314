"""`jobwire top`: a live terminal view of a server's queues, workers and rates.

It reads what any operator tool may read over HTTP, so it works against a local or remote
server (`--url`) and over SSH: the admin API's queues, `GET /ojs/v1/workers` (workers of
every protocol) and the Prometheus counters at `/metrics` (jobs completed and failed by
queue; rates are their change between two refreshes). It refreshes every second and fits
80 columns. Keys: `p` pauses or resumes the queue under the cursor, `w` quiets the worker
under the cursor (`W` resumes it), `s` sorts by the next column, `r` reverses, `tab`
moves between the tables, `q` quits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import quote

import aiohttp
import click
from prometheus_client.parser import text_string_to_metric_families
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable, Footer, Static

QUEUE_COLUMNS = ("queue", "ready", "active", "done/s", "fail/s", "state")
WORKER_COLUMNS = ("worker", "protocol", "state", "jobs", "abilities")


@dataclass
class Snapshot:
    """One refresh's figures."""

    at: float
    queues: list[dict[str, Any]] = field(default_factory=list)
    workers: list[dict[str, Any]] = field(default_factory=list)
    completed: dict[str, float] = field(default_factory=dict)
    failed: dict[str, float] = field(default_factory=dict)


def counters_by_queue(text: str, name: str) -> dict[str, float]:
    """A counter family of the exposition, summed by its `queue` label."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                queue = sample.labels.get("queue", "")
                out[queue] = out.get(queue, 0.0) + sample.value
    return out


class Client:
    """The few HTTP calls `top` makes."""

    def __init__(self, url: str, session: aiohttp.ClientSession) -> None:
        self.url = url.rstrip("/")
        self.session = session

    async def _json(self, path: str) -> Any:
        async with self.session.get(self.url + path) as response:
            response.raise_for_status()
            return await response.json(content_type=None)

    async def snapshot(self) -> Snapshot:
        queues = await self._json("/ojs/v1/admin/queues?per_page=1000")
        workers = await self._json("/ojs/v1/workers")
        async with self.session.get(self.url + "/metrics") as response:
            response.raise_for_status()
            text = await response.text()
        return Snapshot(
            at=time.monotonic(),
            queues=queues["items"],
            workers=workers["workers"],
            completed=counters_by_queue(text, "jobwire_jobs_completed"),
            failed=counters_by_queue(text, "jobwire_jobs_failed"),
        )

    async def post(self, path: str, body: dict[str, Any] | None = None) -> None:
        async with self.session.post(self.url + path, json=body or {}) as response:
            response.raise_for_status()


def _rate(now: Snapshot, before: Snapshot | None, series: str, queue: str) -> float:
    if before is None or now.at <= before.at:
        return 0.0
    new: dict[str, float] = getattr(now, series)
    old: dict[str, float] = getattr(before, series)
    return max(0.0, new.get(queue, 0.0) - old.get(queue, 0.0)) / (now.at - before.at)


class Top(App[None]):
    """The view; `refresh_every` seconds between refreshes."""

    CSS = """
    Screen { layout: vertical; }
    #status { height: 1; background: $primary-background; }
    DataTable { height: 1fr; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "quit"),
        Binding("p", "pause", "pause/resume queue"),
        Binding("w", "quiet", "quiet worker"),
        Binding("W", "resume_worker", "resume worker", show=False),
        Binding("s", "sort", "sort"),
        Binding("r", "reverse", "reverse"),
    ]

    def __init__(self, url: str, refresh_every: float = 1.0) -> None:
        super().__init__()
        self.url = url
        self.refresh_every = refresh_every
        self.snapshot: Snapshot | None = None
        self.previous: Snapshot | None = None
        self.sort_column = {"queues": 1, "workers": 0}
        self.sort_reverse = {"queues": True, "workers": False}
        self.error: str | None = None
        self.refreshes = 0
        self._session: aiohttp.ClientSession | None = None
        self._client: Client | None = None

    def compose(self) -> ComposeResult:
        yield Static("connecting...", id="status")
        queues: DataTable[Any] = DataTable(id="queues", cursor_type="row", zebra_stripes=True)
        queues.add_columns(*QUEUE_COLUMNS)
        yield queues
        workers: DataTable[Any] = DataTable(id="workers", cursor_type="row", zebra_stripes=True)
        workers.add_columns(*WORKER_COLUMNS)
        yield workers
        yield Footer()

    async def on_mount(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        self._client = Client(self.url, self._session)
        self.title = f"jobwire top · {self.url}"
        await self.refresh_data()
        self.set_interval(self.refresh_every, self.refresh_data)

    async def on_unmount(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def refresh_data(self) -> None:
        assert self._client is not None
        try:
            snapshot = await self._client.snapshot()
        except (aiohttp.ClientError, TimeoutError, KeyError, ValueError) as exc:
            self.error = f"{self.url}: {exc or type(exc).__name__}"
            self.query_one("#status", Static).update(self.error)
            return
        self.error = None
        self.previous, self.snapshot = self.snapshot, snapshot
        self.refreshes += 1
        self.render_tables()

    # ------------------------------------------------------------------ rendering

    def queue_rows(self) -> list[tuple[Any, ...]]:
        now = self.snapshot
        if now is None:
            return []
        rows = []
        for q in now.queues:
            name = q["name"]
            counts = q.get("counts", {})
            rows.append(
                (
                    name,
                    int(q.get("depth", 0)),
                    int(counts.get("active", 0)),
                    round(_rate(now, self.previous, "completed", name), 1),
                    round(_rate(now, self.previous, "failed", name), 1),
                    "paused" if q.get("paused") else "",
                )
            )
        return self._sorted("queues", rows)

    def worker_rows(self) -> list[tuple[Any, ...]]:
        now = self.snapshot
        if now is None:
            return []
        rows = [
            (
                str(w["worker_id"]),
                w["protocol"],
                w["state"],
                len(w.get("active_jobs") or []),
                ",".join(w.get("abilities") or []),
            )
            for w in now.workers
            if w["state"] != "terminated"
        ]
        return self._sorted("workers", rows)

    def _sorted(self, table: str, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        column = self.sort_column[table]
        return sorted(
            rows, key=lambda row: (row[column], str(row[0])), reverse=self.sort_reverse[table]
        )

    def render_tables(self) -> None:
        now = self.snapshot
        assert now is not None
        queue_rows = self.queue_rows()
        worker_rows = self.worker_rows()
        done = sum(row[3] for row in queue_rows)
        failed = sum(row[4] for row in queue_rows)
        sort_q = QUEUE_COLUMNS[self.sort_column["queues"]]
        self.query_one("#status", Static).update(
            f"{len(queue_rows)} queues · {len(worker_rows)} workers · "
            f"{done:.1f} done/s · {failed:.1f} failed/s · sort: {sort_q}"
        )
        self._fill(self.query_one("#queues", DataTable), queue_rows)
        self._fill(self.query_one("#workers", DataTable), worker_rows)

    @staticmethod
    def _fill(table: DataTable[Any], rows: list[tuple[Any, ...]]) -> None:
        """Replace the rows, keeping the cursor on the same key where it still is."""
        keep = None
        if table.row_count and table.cursor_row < table.row_count:
            keep = str(table.get_row_at(table.cursor_row)[0])
        table.clear()
        for row in rows:
            cells = [_cell(value, 30 if i == 0 else 24) for i, value in enumerate(row)]
            table.add_row(*cells, key=str(row[0]))
        if keep is not None:
            for index, row in enumerate(rows):
                if str(row[0]) == keep:
                    table.move_cursor(row=index)
                    break

    def _current(self, table_id: str) -> str | None:
        table = self.query_one(f"#{table_id}", DataTable)
        if not table.row_count:
            return None
        return str(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value)

    # ------------------------------------------------------------------ actions

    def _focused_table(self) -> str:
        focused = self.focused
        return focused.id if isinstance(focused, DataTable) and focused.id else "queues"

    async def action_pause(self) -> None:
        name = self._current("queues")
        if name is None or self.snapshot is None or self._client is None:
            return
        paused = any(q["name"] == name and q.get("paused") for q in self.snapshot.queues)
        verb = "resume" if paused else "pause"
        await self._act(f"/ojs/v1/admin/queues/{quote(name, safe='')}/{verb}")

    async def action_quiet(self) -> None:
        await self._worker_state("quiet")

    async def action_resume_worker(self) -> None:
        await self._worker_state("running")

    async def _worker_state(self, state: str) -> None:
        worker = self._current("workers")
        if worker is None:
            return
        path = f"/ojs/v1/admin/workers/{quote(worker, safe='')}/state"
        await self._act(path, {"state": state})

    async def _act(self, path: str, body: dict[str, Any] | None = None) -> None:
        assert self._client is not None
        try:
            await self._client.post(path, body)
        except aiohttp.ClientError as exc:
            self.notify(f"{path}: {exc}", severity="error")
        await self.refresh_data()

    def action_sort(self) -> None:
        table = self._focused_table()
        count = len(QUEUE_COLUMNS if table == "queues" else WORKER_COLUMNS)
        self.sort_column[table] = (self.sort_column[table] + 1) % count
        if self.snapshot is not None:
            self.render_tables()

    def action_reverse(self) -> None:
        table = self._focused_table()
        self.sort_reverse[table] = not self.sort_reverse[table]
        if self.snapshot is not None:
            self.render_tables()


def _cell(value: Any, width: int) -> str:
    text = str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


@click.command("top")
@click.option(
    "--url",
    default="http://127.0.0.1:8080",
    show_default=True,
    envvar="JOBWIRE_URL",
    help="The server's HTTP address.",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.2),
    default=1.0,
    show_default=True,
    help="Seconds between refreshes.",
)
def top_command(url: str, interval: float) -> None:
    """A live view of queues, workers and rates (keys: p pause, w quiet, s sort, q quit)."""
    Top(url, interval).run()
