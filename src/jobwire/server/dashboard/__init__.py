"""The operator's dashboard: server-rendered pages at `/` and under `/ui/` on the HTTP port.

Pages are Jinja2 templates with autoescaping on (every value a job, queue or worker brings
is escaped; nothing is marked safe), styled by one CSS file, and read without JavaScript.
One small script of our own (`static/dashboard.js`, no build step, no library) follows the
throughput stream (`/ui/stream`, server-sent events) and redraws the overview's SVG chart,
which the server renders in full for readers without JavaScript. The Content-Security-Policy
allows scripts and styles from this origin only, so injected markup could not run anyway.

Actions are HTML form POSTs guarded by a double-submit token: a random token in a
SameSite=Strict cookie that each form repeats in a hidden field; a POST whose field does
not match the cookie, or whose Origin is another host, is refused (403). Actions call the
same functions as the admin API (`direct_everywhere`, the dead letter queue, the engine).

Every route is added in `Dashboard.add_routes`, each wrapped by `Dashboard.guard`: the one
place a check for every dashboard request goes (the admin role, once the server has
authentication).

On a cluster (nodes sharing a PostgreSQL store) the pages show the whole cluster where one
read gives it: every node's workers (`every_worker`, one question to each other node), the
jobs of each queue that other nodes or the shared queue hold (one SQL query), the job lists
(scheduled, retrying, dead) merged over every node's part and a search by id or unique key
(the operation `dashboard.jobs`, one question to each other node), and a job another node
holds or keeps among its dead letters (read-only). When the database or a node cannot
answer, a page shows this node's part and says so. The overview's jobs and dead letters
are every node's and the shared queue's (the operation `admin.counts`, as the admin API
counts them); its throughput stays this node's.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import hmac
import logging
import secrets
import sys
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from itertools import islice
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote, urlencode

import jinja2
import orjson
from aiohttp import web

from jobwire import __version__
from jobwire.engine.errors import EngineError, IllegalTransition, UnknownJob
from jobwire.engine.job import Job, JobState, origin_name
from jobwire.engine.worker import WorkerState
from jobwire.protocols.ojs.errors import OJSError
from jobwire.protocols.ojs.times import format_time, parse_time
from jobwire.server.ojs.admin import direct_everywhere
from jobwire.server.ojs.http import reply
from jobwire.server.ojs.observability import priority_name
from jobwire.server.ojs.operations import every_node
from jobwire.server.ojs.workerlist import every_worker, workers_here
from jobwire.server.pauses import set_queue_paused

if TYPE_CHECKING:
    from jobwire.engine.worker import WorkerSession
    from jobwire.server.ojs.app import OJSService
    from jobwire.store.postgres import PostgresStore

log = logging.getLogger("jobwire")
T = TypeVar("T")

PREFIX = "/ui"
CSRF_COOKIE = "jobwire_csrf"
CSRF_FIELD = "csrf"
#: Seconds of throughput history the overview's chart shows.
HISTORY = 300
#: Bytes of a payload, result or error shown on a job's page.
PREVIEW = 2048
PER_PAGE = 50
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
#: Which kinds of worker the quiet and terminate buttons reach, and how (the workers page).
LIFECYCLE = {
    "ojs": "told in its next heartbeat reply; a quiet worker's fetches get no job",
    "rota": "told over its /work socket at once",
    "gearman": "server-side: no job and no wake-up; terminate closes it once idle",
    "mdp": "server-side: no job is handed to it",
    "ppp": "server-side: no job is handed to it",
    "wmp": "server-side: no job is handed to it",
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: What `every_worker` says of a worker that ended.
TERMINATED = WorkerState.TERMINATED.value
#: The job lists: what a note calls each, and the state of the engine's jobs it lists (None:
#: the dead letter queue's entries).
JOB_LISTS: dict[str, tuple[str, JobState | None]] = {
    "scheduled": ("scheduled jobs", JobState.SCHEDULED),
    "retrying": ("retrying jobs", JobState.RETRYABLE),
    "dead": ("dead letters", None),
}
#: The operation each node of a cluster answers for its own jobs: its part of a job list, or
#: a job it keeps (`Dashboard._jobs_for_another_node`).
JOBS_OPERATION = "dashboard.jobs"
#: Rows of a job list a cluster's pages reach at most: each node sends the first rows of its
#: part up to the page shown, so a deep page would bring every node's whole list.
CLUSTER_LIST_MAX = 5000


@dataclass(slots=True)
class Sample:
    """One second of throughput."""

    at: float
    submitted: float
    completed: float
    failed: float


class Throughput:
    """Once a second: jobs submitted, completed and failed in that second (all queues) and
    completed per queue over the last minute, from the event log's counters."""

    def __init__(self, service: OJSService) -> None:
        self.service = service
        self.samples: deque[Sample] = deque(maxlen=HISTORY)
        self._minute: deque[Counter[str]] = deque(maxlen=61)
        self._last: tuple[int, int, int] | None = None
        self._task: asyncio.Task[None] | None = None
        self.tick = asyncio.Event()
        self.closing = False

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        self.closing = True
        self.tick.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(1.0)

    def sample(self) -> None:
        submitted, done, failed, by_queue = self.service.events.throughput()
        completed: Counter[str] = Counter(by_queue)
        now = (submitted, done, failed)
        if self._last is not None:
            sub, comp, fail = (a - b for a, b in zip(now, self._last, strict=True))
            self.samples.append(Sample(time.time(), sub, comp, fail))
        self._last = now
        self._minute.append(completed)
        tick, self.tick = self.tick, asyncio.Event()
        tick.set()

    def per_minute(self, queue: str) -> int:
        """Jobs of `queue` completed over the last minute (or since start)."""
        if not self._minute:
            return 0
        return self._minute[-1][queue] - self._minute[0][queue]

    def points(self) -> dict[str, Any]:
        samples = list(self.samples)
        return {
            "t": [round(s.at, 1) for s in samples],
            "submitted": [s.submitted for s in samples],
            "completed": [s.completed for s in samples],
            "failed": [s.failed for s in samples],
        }


def chart(points: dict[str, Any], width: int = 600, height: int = 160) -> dict[str, Any]:
    """The chart's SVG polylines (server-side, so it shows without JavaScript)."""
    series = ("submitted", "completed", "failed")
    top = max([1.0, *(v for name in series for v in points[name])])
    out: dict[str, Any] = {"width": width, "height": height, "top": top, "lines": {}}
    for name in series:
        values = points[name][-HISTORY:]
        step = width / max(1, HISTORY - 1)
        offset = (HISTORY - len(values)) * step
        out["lines"][name] = " ".join(
            f"{offset + i * step:.1f},{height - v / top * (height - 4) - 2:.1f}"
            for i, v in enumerate(values)
        )
        out[name] = values[-1] if values else 0
    return out


def source_of(job: Job) -> str:
    """The protocol a job came in by: the engine records it at submission (`Job.origin`);
    "unknown" for a job kept by a store older than that record."""
    return origin_name(job.origin)


def preview(value: Any) -> tuple[str, int, bool]:
    """A value as text for a page: at most PREVIEW bytes, its size, and whether cut."""
    if value is None:
        return "", 0, False
    if isinstance(value, bytes | bytearray):
        raw = bytes(value)
    elif isinstance(value, str):
        raw = value.encode()
    else:
        try:
            raw = orjson.dumps(value, default=str)
        except TypeError:
            raw = repr(value).encode()
    return raw[:PREVIEW].decode("utf-8", "replace"), len(raw), len(raw) > PREVIEW


def error_text(error: Any) -> str:
    """A job's last error in a line: an OJS error's code and message, else its text."""
    if isinstance(error, dict) and "message" in error:
        code = error.get("code") or error.get("type") or "error"
        return f"{code}: {error['message']}"
    return preview(error)[0]


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def _when(epoch: float | None) -> str:
    return format_time(epoch) if epoch else "-"


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _safe_next(value: Any, default: str) -> str:
    """A local path to go back to after an action (never another site)."""
    if (
        isinstance(value, str)
        and value.startswith("/")
        and not value.startswith("//")
        and not any(c in value for c in "\\\r\n")
    ):
        return value
    return default


def _postgres(store: object) -> PostgresStore | None:
    """The store, if it is PostgreSQL's. Its module imports psycopg, which a server on another
    store never loads: looked up only if the server loaded it."""
    module = sys.modules.get("jobwire.store.postgres")
    kind: type[PostgresStore] | None = getattr(module, "PostgresStore", None)
    return store if kind is not None and isinstance(store, kind) else None


def _server_of(dsn: str) -> str:
    """`host:port/database` of a DSN: never its password, nor any other parameter."""
    from psycopg.conninfo import conninfo_to_dict  # loaded with the store

    try:
        params = conninfo_to_dict(dsn)
    except Exception:  # the store connected with it: not expected
        return "?"
    host = params.get("host") or "local socket"
    port = f":{params['port']}" if params.get("port") else ""
    return f"{host}{port}/{params.get('dbname') or '(default database)'}"


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


class Dashboard:
    def __init__(self, service: OJSService) -> None:
        self.service = service
        self.engine = service.engine
        self.throughput: Throughput | None = None
        self.env = jinja2.Environment(
            loader=jinja2.PackageLoader("jobwire.server.dashboard", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters["age"] = _age
        self.env.filters["when"] = _when
        self.env.filters["bytes"] = _bytes
        self.env.filters["q"] = lambda v: quote(str(v), safe="")
        self.static = {
            name: (resources.files(__package__) / "static" / name).read_bytes()
            for name in ("dashboard.css", "dashboard.js")
        }
        if service.runtime.remote is not None:  # each node answers for its own jobs
            service.operations.add(JOBS_OPERATION, self._jobs_for_another_node, every_node)

    # ------------------------------------------------------------------ routing

    def add_routes(self, app: web.Application) -> None:
        """Every dashboard route, each behind `guard`."""
        r = app.router
        get = [
            ("/", self.overview),
            (PREFIX + "/", self.overview),
            (PREFIX + "/stream", self.stream),
            (PREFIX + "/static/{name}", self.static_file),
            (PREFIX + "/queues", self.queues),
            (PREFIX + "/queues/{name}", self.queue),
            (PREFIX + "/workers", self.workers),
            (PREFIX + "/jobs", self.jobs),
            (PREFIX + "/jobs/{id}", self.job),
            (PREFIX + "/cron", self.cron),
            (PREFIX + "/workflows", self.workflows),
        ]
        post = [
            (PREFIX + "/queues/{name}/{action}", self.queue_action),
            (PREFIX + "/workers/{id}/state", self.worker_action),
            (PREFIX + "/jobs/{id}/{action}", self.job_action),
            (PREFIX + "/bulk", self.bulk_action),
            (PREFIX + "/cron/{name}/{action}", self.cron_action),
            (PREFIX + "/workflows/{id}/cancel", self.workflow_cancel),
        ]
        for path, handler in get:
            r.add_get(path, self.guard(handler))
        for path, handler in post:
            r.add_post(path, self.guard(self.checked(handler)))
        app.on_startup.append(self._on_startup)
        app.on_shutdown.append(self._on_shutdown)

    def guard(self, handler: Handler) -> Handler:
        """Wraps every dashboard route: security headers, and errors as HTML pages. The
        place for an access check that covers the whole dashboard."""

        async def guarded(request: web.Request) -> web.StreamResponse:
            try:
                response = await handler(request)
            except OJSError as exc:
                response = self.error_page(request, exc.status, exc.message)
            except (UnknownJob, IllegalTransition, EngineError) as exc:
                response = self.error_page(request, 409, str(exc))
            except web.HTTPException as exc:
                response = self.error_page(request, exc.status, exc.reason or "error")
            if not response.prepared:
                response.headers.update(SECURITY_HEADERS)
            return response

        return guarded

    def checked(self, handler: Handler) -> Handler:
        """A POST: its form must repeat the CSRF cookie, and come from this host."""

        async def check(request: web.Request) -> web.StreamResponse:
            form = await request.post()
            cookie = request.cookies.get(CSRF_COOKIE, "")
            token = form.get(CSRF_FIELD)
            origin = request.headers.get("Origin")
            if origin is not None and origin != "null":
                host = origin.split("://", 1)[-1]
                if host != request.host:
                    return self.error_page(request, 403, "cross-site request refused")
            if (
                not cookie
                or not isinstance(token, str)
                or not hmac.compare_digest(cookie.encode(), token.encode())
            ):
                return self.error_page(
                    request, 403, "the form's token does not match: reload the page and retry"
                )
            return await handler(request)

        return check

    async def _on_startup(self, app: web.Application) -> None:
        self.throughput = Throughput(self.service)
        self.throughput.start()

    async def _on_shutdown(self, app: web.Application) -> None:
        if self.throughput is not None:
            await self.throughput.stop()

    # ------------------------------------------------------------------ rendering

    def render(
        self,
        request: web.Request,
        template: str,
        status: int = 200,
        notes: list[str] | None = None,
        **context: Any,
    ) -> web.Response:
        """`notes`: what the page could not show (another node or the database away)."""
        token = request.cookies.get(CSRF_COOKIE, "")
        fresh = len(token) < 32
        if fresh:
            token = secrets.token_urlsafe(32)
        page = self.env.get_template(template).render(
            csrf=token,
            here=request.path_qs,
            prefix=PREFIX,
            version=__version__,
            nav=template.split(".")[0],
            cluster=self.service.runtime.cluster is not None,
            notes=notes or [],
            **context,
        )
        response = web.Response(text=page, status=status, content_type="text/html")
        if fresh:
            response.set_cookie(CSRF_COOKIE, token, path="/", httponly=True, samesite="Strict")
        return response

    def error_page(self, request: web.Request, status: int, message: str) -> web.Response:
        response = self.render(request, "error.html", status=status, message=message)
        response.headers.update(SECURITY_HEADERS)
        return response

    def back(self, request: web.Request, form: Any, default: str) -> web.Response:
        return see_other(_safe_next(form.get("next"), default))

    # ------------------------------------------------------------------ pages

    async def static_file(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        body = self.static.get(name)
        if body is None:
            raise web.HTTPNotFound()
        kind = "text/css" if name.endswith(".css") else "text/javascript"
        response = web.Response(body=body, content_type=kind)
        response.headers["Cache-Control"] = "max-age=3600"
        return response

    def _points(self) -> dict[str, Any]:
        if self.throughput is None:
            return {"t": [], "submitted": [], "completed": [], "failed": []}
        return self.throughput.points()

    def _live_workers(self) -> list[Any]:
        sessions = list(self.service.workers.values())
        sessions += [s for s in self.engine.workers.values() if s.protocol != "ojs"]
        return sessions

    # ------------------------------------------------------------------ the cluster

    async def _from_cluster(self, read: Awaitable[T]) -> T:
        """What the cluster answers; an OJSError (503) when the database or another node
        does not (the driver's errors are psycopg's, not imported here)."""
        try:
            return await read
        except OJSError:
            raise
        except Exception as exc:
            raise OJSError(
                "backend_error", f"the cluster could not be read: {_first_line(exc)}", status=503
            ) from exc

    async def _partly(self, read: Awaitable[T], what: str, notes: list[str]) -> T | None:
        """`_from_cluster`, or None and a note: the page shows this node's part."""
        try:
            return await self._from_cluster(read)
        except OJSError as exc:
            log.warning("dashboard: %s not read: %s", what, exc.message)
            notes.append(f"{what} could not be read ({exc.message}): this node's only")
            return None

    async def _workers(self, protocol: str | None, notes: list[str]) -> list[dict[str, Any]]:
        """The workers of every node on a cluster (`worker_json`, each with its `nodes`)."""
        if self.service.runtime.remote is None:
            return workers_here(self.service, protocol)
        found = await self._partly(
            every_worker(self.service, protocol), "the other nodes' workers", notes
        )
        return found if found is not None else workers_here(self.service, protocol)

    async def _held_elsewhere(self, job_id: str) -> Job | None:
        """A copy of a live job another node holds or the shared queue keeps; None: no
        cluster, or no such job."""
        cluster = self.service.runtime.cluster
        if cluster is None:
            return None
        return await self._from_cluster(cluster.find_job(job_id))

    def _jobs_for_another_node(self, _key: str, asked: Any) -> web.Response:
        """The operation `dashboard.jobs`: with `find`, the job this node keeps (engine or
        dead letters) with that id, or `by_key` unique key, as its page shows it; else this
        node's part of the list `list` (`_part_here`, its first `limit` rows)."""
        if "find" in asked:
            job = self._lookup(str(asked["find"]), by_key=bool(asked.get("by_key")))
            facts = None if job is None else self._job_facts(job)
            return reply({"node": self._node(), "job": facts})
        return reply(self._part_here(str(asked["list"]), int(asked["limit"])))

    def _part_here(self, kind: str, limit: int) -> dict[str, Any]:
        """This node's part of a cluster's job list: its first `limit` rows in the list's
        order (`_cluster_order`), each with this node's id, and how many it has in all. The
        asking page shows at most `limit` rows of the merged list: no node needs to send
        more."""
        listed = self._listed_here(kind)
        when = _cluster_order(kind)
        first = heapq.nsmallest(limit, listed, key=lambda job: (getattr(job, when) or 0.0, job.id))
        node = self._node()
        return {
            "jobs": [{**self._job_row(job), "node": node} for job in first],
            "total": len(listed),
        }

    def _node(self) -> int:
        """This node's id in its cluster (asked on a cluster only)."""
        remote = self.service.runtime.remote
        assert remote is not None
        return remote.node

    async def _cluster_list(
        self, kind: str, limit: int, notes: list[str]
    ) -> tuple[list[dict[str, Any]], int]:
        """The first `limit` rows of a job list merged over every node (each row with its
        node), and how many the list has in all; this node's alone, and a note, when the
        others do not answer. The shared queue's jobs are in no node's list."""
        parts = [self._part_here(kind, limit)]
        theirs = await self._partly(
            self.service.operations.from_every_node(
                JOBS_OPERATION, "", {"list": kind, "limit": limit}
            ),
            f"the other nodes' {JOB_LISTS[kind][0]}",
            notes,
        )
        parts += theirs or []
        when = _cluster_order(kind)
        rows = sorted(
            (row for part in parts for row in part["jobs"]),
            key=lambda row: (row[when] or 0.0, row["id"]),
        )
        return rows[:limit], sum(int(part["total"]) for part in parts)

    async def _kept_elsewhere(self, needle: str, by_key: bool) -> tuple[int, dict[str, Any]] | None:
        """The job with this id (or `by_key` unique key) that another node keeps in its
        engine or its dead letters, as its page shows it, and that node (the lowest, should
        several have one); None: none does, or no cluster."""
        found = [
            (int(answer["node"]), answer["job"])
            for answer in await self.service.operations.from_every_node(
                JOBS_OPERATION, "", {"find": needle, "by_key": by_key}
            )
            if answer["job"] is not None
        ]
        return min(found, key=lambda pair: pair[0]) if found else None

    # ------------------------------------------------------------------ figures

    def _store_health(self) -> dict[str, Any]:
        store: Any = self.service.runtime.store
        postgres = _postgres(store)
        if postgres is not None:
            return {
                "kind": "postgresql",
                "server": _server_of(postgres.dsn),
                "schema": postgres.schema,
                "node": postgres.node,
                "commits": postgres.commits,
                "round_trips": postgres.round_trips,
                "writes": postgres.write_count,
                "last_error": postgres.last_error,
            }
        if not hasattr(store, "commit_times"):
            return {"kind": "memory"}
        hist = store.commit_times
        commits = sum(hist.counts)
        return {
            "kind": f"sqlite ({store.fsync} fsync)",
            "path": str(store.path),
            "commit_ms": 1000.0 * hist.total / commits if commits else None,
            "batches": store.batches,
            "batch_size": store.write_count / store.batches if store.batches else None,
            "redo_log_bytes": store.redo_log_bytes(),
            "checkpoint_at": store.checkpoint_at or None,
            "checkpoint_seconds": store.checkpoint_seconds,
            "last_error": store.last_error,
        }

    def _queue_rows(self) -> list[dict[str, Any]]:
        """This node's queues."""
        engine = self.engine
        now = engine.clock()
        running: Counter[str] = Counter()
        for job in self._active_jobs():
            running[job.queue or "default"] += 1
        rows = []
        for name, info in sorted(engine.queues.items()):
            depth: Counter[str] = Counter()
            oldest: float | None = None
            for lane in info.lanes.values():
                for level in lane.levels:
                    depth[priority_name(level.priority)] += sum(
                        1 for job in level.entries() if job.state is JobState.AVAILABLE
                    )
                first = lane.oldest()
                if first is not None and (oldest is None or first.created_at < oldest):
                    oldest = first.created_at
            rows.append(
                {
                    "name": name,
                    "paused": info.paused,
                    "high": depth["high"],
                    "normal": depth["normal"],
                    "low": depth["low"],
                    "depth": info.available,
                    "running": running[name],
                    "per_minute": self.throughput.per_minute(name) if self.throughput else 0,
                    "oldest_age": None if oldest is None else now - oldest,
                }
            )
        return rows

    async def _cluster_queue_rows(self, notes: list[str]) -> list[dict[str, Any]]:
        """`_queue_rows`, and on a cluster the jobs each queue has that this node does not
        hold (other nodes', the shared queue's; one SQL query) in `elsewhere_waiting` (due or
        not) and `elsewhere_running`, with the queues only those have."""
        rows = self._queue_rows()
        cluster = self.service.runtime.cluster
        if cluster is None:
            return rows
        by_name = {row["name"]: row for row in rows}
        for row in rows:
            row["elsewhere_waiting"] = row["elsewhere_running"] = 0
        counts = await self._partly(cluster.elsewhere(), "the other nodes' jobs", notes)
        for (_function, queue), (jobs, running) in (counts or {}).items():
            name = queue or "default"  # as `_queue_rows` counts
            if name not in by_name:
                by_name[name] = self._queue_elsewhere(name)
                rows.append(by_name[name])
            by_name[name]["elsewhere_waiting"] += jobs - running
            by_name[name]["elsewhere_running"] += running
        rows.sort(key=lambda row: str(row["name"]))
        return rows

    def _queue_elsewhere(self, name: str) -> dict[str, Any]:
        """The row of a queue only other nodes (or the shared queue) have jobs of."""
        return {
            "name": name,
            "paused": False,  # a pause holds on every node: a paused queue is known here
            "high": 0,
            "normal": 0,
            "low": 0,
            "depth": 0,
            "running": 0,
            "per_minute": self.throughput.per_minute(name) if self.throughput else 0,
            "oldest_age": None,
            "elsewhere_waiting": 0,
            "elsewhere_running": 0,
        }

    def _active_jobs(self) -> Iterator[Job]:
        for session in self.engine.workers.values():
            yield from session.jobs.values()

    async def overview(self, request: web.Request) -> web.StreamResponse:
        points = self._points()
        # Both questions to the other nodes at once: a node that does not answer costs the
        # page one timeout, not two. Their notes in a fixed order.
        workers_notes: list[str] = []
        counts_notes: list[str] = []
        workers, (jobs, dead, whose) = await asyncio.gather(
            self._workers(None, workers_notes), self._job_counts(counts_notes)
        )
        notes = workers_notes + counts_notes
        by_protocol: Counter[str] = Counter()
        by_state: Counter[tuple[str, str]] = Counter()
        for worker in workers:
            if worker["state"] != TERMINATED:
                by_protocol[worker["protocol"]] += 1
                by_state[worker["protocol"], worker["state"]] += 1
        return self.render(
            request,
            "overview.html",
            notes=notes,
            chart=chart(points),
            queues=await self._cluster_queue_rows(notes),
            workers=sorted(by_protocol.items()),
            worker_states=by_state,
            store=self._store_health(),
            dead=dead,
            jobs=jobs,
            whose=whose,
        )

    async def _job_counts(self, notes: list[str]) -> tuple[int, int, str | None]:
        """The overview's jobs known and dead letters, and whose they are: None for a node
        alone; on a cluster "every node", or "this node" and a note when the cluster does
        not answer."""
        jobs, dead = len(self.engine.jobs), len(self.service.dead_letter)
        if self.service.runtime.remote is None:
            return jobs, dead, None
        theirs = await self._partly(self._counts_elsewhere(), "the cluster's job counts", notes)
        if theirs is None:
            return jobs, dead, "this node"
        return jobs + theirs[0], dead + theirs[1], "every node"

    async def _counts_elsewhere(self) -> tuple[int, int]:
        """Jobs and dead letters this node does not keep, as `/ojs/v1/admin/stats` counts
        them: each other live node's (the operation `admin.counts`: its jobs by queue and
        state, its dead letters as `dead_letter`), and the rows no live node holds (the
        shared queue, a dead node's jobs not yet requeued)."""
        jobs = dead = 0
        for answer in await self.service.operations.from_every_node("admin.counts", "", None):
            for counts in answer["queues"].values():
                dead += counts.get("dead_letter", 0)
                jobs += sum(counts.values()) - counts.get("dead_letter", 0)
        cluster = self.service.runtime.cluster
        if cluster is not None:
            unheld = await cluster.unheld_by_queue()
            jobs += sum(sum(states.values()) for states in unheld.values())
        return jobs, dead

    async def stream(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events: the throughput of each second, and the totals."""
        throughput = self.throughput
        if throughput is None:
            raise web.HTTPServiceUnavailable()
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",
            }
        )
        response.headers.update(SECURITY_HEADERS)
        await response.prepare(request)
        await response.write(b"retry: 2000\n\n")
        while not throughput.closing:
            await throughput.tick.wait()
            if throughput.closing:
                break
            last = throughput.samples[-1] if throughput.samples else None
            data = {
                "points": throughput.points(),
                "now": None
                if last is None
                else {
                    "submitted": last.submitted,
                    "completed": last.completed,
                    "failed": last.failed,
                },
                "depth": sum(info.available for info in self.engine.queues.values()),
                "workers": sum(
                    1 for s in self._live_workers() if s.state is not WorkerState.TERMINATED
                ),
            }
            try:
                await response.write(b"data: " + orjson.dumps(data) + b"\n\n")
            except (ConnectionResetError, RuntimeError):
                break
        return response

    async def queues(self, request: web.Request) -> web.StreamResponse:
        notes: list[str] = []
        queues = await self._cluster_queue_rows(notes)
        return self.render(request, "queues.html", notes=notes, queues=queues)

    async def queue(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        notes: list[str] = []
        row = next((q for q in await self._cluster_queue_rows(notes) if q["name"] == name), None)
        if row is None:
            raise web.HTTPNotFound(reason=f"no queue named {name!r}")
        page = _page_number(request)
        waiting: list[Job] = []  # this node's (none of a queue only other nodes have)
        info = self.engine.queues.get(name)
        lanes = list(info.lanes.values()) if info is not None else []
        for lane in sorted(lanes, key=lambda lane: lane.function.name):
            for level in lane.levels:
                waiting.extend(j for j in level.entries() if j.state is JobState.AVAILABLE)
        waiting.sort(key=lambda job: (-job.priority, job.seq))
        start = (page - 1) * PER_PAGE
        return self.render(
            request,
            "queue.html",
            notes=notes,
            queue=row,
            jobs=[self._job_row(j) for j in waiting[start : start + PER_PAGE]],
            page=page,
            pages=max(1, (len(waiting) + PER_PAGE - 1) // PER_PAGE),
            total=len(waiting),
        )

    async def workers(self, request: web.Request) -> web.StreamResponse:
        protocol = request.query.get("protocol") or None
        notes: list[str] = []
        now = time.time()
        rows = [self._worker_row(row, now) for row in await self._workers(protocol, notes)]
        rows.sort(key=lambda row: (row["protocol"], str(row["worker_id"]), row.get("nodes")))
        return self.render(
            request,
            "workers.html",
            notes=notes,
            workers=rows,
            lifecycle=sorted(LIFECYCLE.items()),
            protocol=protocol,
        )

    def _worker_row(self, row: dict[str, Any], now: float) -> dict[str, Any]:
        """A listed worker with what the page adds. Its heartbeat and jobs are those of every
        node it works on. A worker of another protocol is a connection to one node: directed
        from that node's dashboard; an OJS worker from any (`direct_everywhere`)."""
        beat = row["last_heartbeat_at"]
        row["heartbeat_age"] = now - parse_time(beat) if beat else None
        row["jobs_held"] = len(row["active_jobs"])
        session = self._session_here(row)
        row["address"] = None
        row["directable"] = False
        if session is not None:
            row["address"] = session.info.get("address") or session.info.get("peer")
            row["directable"] = (
                session.protocol in LIFECYCLE and session.state is not WorkerState.TERMINATED
            )
        elif row["protocol"] == "ojs":  # its sessions are on other nodes
            row["directable"] = row["state"] != TERMINATED
        return row

    def _session_here(self, row: dict[str, Any]) -> WorkerSession | None:
        """This node's session of a listed worker; None: only other nodes have one."""
        remote = self.service.runtime.remote
        if remote is not None and remote.node not in row["nodes"]:
            return None
        if row["protocol"] == "ojs":  # known by the id it chose
            return self.service.workers.get(row["worker_id"])
        return self.engine.workers.get(row["worker_id"])

    def _job_row(self, job: Job) -> dict[str, Any]:
        text, size, _ = preview(job.payload)
        return {
            "id": job.id,
            "function": job.function,
            "queue": job.queue,
            "state": job.state.name.lower(),
            "priority": priority_name(job.priority),
            "attempts": job.attempts,
            "created_at": job.created_at,
            "run_at": job.run_at,
            "finished_at": job.finished_at,
            "size": size,
            "preview": text[:80],
            "error": error_text(job.error)[:160],
        }

    def _lookup(self, needle: str, by_key: bool = True) -> Job | None:
        """A job of this node's engine or dead letters with this id, or `by_key` this
        unique key."""
        job = self.engine.jobs.get(needle) or self.service.dead_letter.get(needle)
        if job is not None or not by_key:
            return job
        for candidate in self.engine.uniques.values():
            if candidate.unique == needle:
                return candidate
        for candidate in self.service.dead_letter.jobs():
            if candidate.unique == needle:
                return candidate
        return None

    def _listed_here(self, kind: str) -> list[Job]:
        """This node's jobs of a list, in the order it keeps them."""
        state = JOB_LISTS[kind][1]
        if state is None:
            return self.service.dead_letter.jobs()
        return [job for job in self.engine.jobs.values() if job.state is state]

    async def jobs(self, request: web.Request) -> web.StreamResponse:
        notes: list[str] = []
        needle = request.query.get("q", "").strip()
        if needle:
            found = await self._search(needle, notes)
            if found is not None:
                return see_other(f"{PREFIX}/jobs/{quote(found, safe='')}")
        kind = request.query.get("list", "dead")
        if kind not in JOB_LISTS:
            kind = "dead"
        page = _page_number(request)
        start = (page - 1) * PER_PAGE
        remote = self.service.runtime.remote
        if remote is None:  # a node alone lists its jobs in the order it keeps them
            listed = self._listed_here(kind)
            rows = [self._job_row(j) for j in islice(listed, start, start + PER_PAGE)]
            total = len(listed)
        elif start >= CLUSTER_LIST_MAX:
            rows, total = [], 0
            notes.append(f"on a cluster the lists show their first {CLUSTER_LIST_MAX} jobs")
        else:
            rows, total = await self._cluster_list(kind, start + PER_PAGE, notes)
            rows = rows[start:]
        return self.render(
            request,
            "jobs.html",
            notes=notes,
            kind=kind,
            needle=needle,
            missing=bool(needle),
            jobs=rows,
            node=None if remote is None else remote.node,
            page=page,
            pages=max(1, (total + PER_PAGE - 1) // PER_PAGE),
            total=total,
            query=lambda **kw: urlencode({"list": kind, **kw}),
        )

    async def _search(self, needle: str, notes: list[str]) -> str | None:
        """The id of the job a search names: by id or unique key among this node's jobs, by
        id among the cluster's rows, then by either among the other nodes' jobs and dead
        letters."""
        job = self._lookup(needle) or await self._held_elsewhere(needle)
        if job is not None:
            return job.id
        kept = await self._partly(
            self._kept_elsewhere(needle, by_key=True), "the other nodes' jobs", notes
        )
        return None if kept is None else str(kept[1]["job"]["id"])

    async def job(self, request: web.Request) -> web.StreamResponse:
        job_id = request.match_info["id"]
        job = self._lookup(job_id, by_key=False)
        node = None  # the other node whose job is shown
        if job is not None:
            facts: dict[str, Any] | None = self._job_facts(job)
        else:  # then read-only: the actions act on this node's jobs
            held = await self._held_elsewhere(job_id)
            if held is not None:
                facts = self._job_facts(held)
            else:
                kept = await self._from_cluster(self._kept_elsewhere(job_id, by_key=False))
                node, facts = kept if kept is not None else (None, None)
        if facts is None:
            raise web.HTTPNotFound(reason=f"no job {job_id!r}")
        return self.render(
            request,
            "job.html",
            **facts,
            elsewhere=job is None,
            node=node,
            can_cancel=job is not None and not job.state.terminal,
            can_retry=job is not None and job.state is JobState.DISCARDED,
            can_delete=job is not None and facts["dead"],
        )

    def _job_facts(self, job: Job) -> dict[str, Any]:
        """What a job's page shows of it, as JSON: another node's page may show it."""
        return {
            "job": self._job_row(job),
            "source": source_of(job),
            "unique": job.unique,
            "payload": preview(job.payload),
            "result": preview(job.result),
            "error": preview(error_text(job.error) if job.error is not None else None),
            "history": [error_text(e)[:PREVIEW] for e in (job.ext or {}).get("errors") or []],
            "progress": job.progress,
            "max_attempts": job.max_attempts,
            "started_at": job.started_at,
            "finished_at": job.finished_at,
            "worker": job.worker.id if job.worker is not None else None,
            "dead": job.id in self.service.dead_letter,
        }

    async def cron(self, request: web.Request) -> web.StreamResponse:
        rows = []
        for entry in self.service.cron.entries():
            last = self.engine.jobs.get(entry.last_job_id) if entry.last_job_id else None
            rows.append(
                {
                    "name": entry.name,
                    "expression": entry.expression.text,
                    "timezone": entry.timezone,
                    "type": entry.template.get("type"),
                    "enabled": entry.enabled,
                    "next_run_at": entry.next_run_at,
                    "last_run_at": entry.last_run_at,
                    "runs": entry.run_count,
                    "last_job_id": entry.last_job_id,
                    "last_state": last.state.name.lower() if last is not None else None,
                }
            )
        return self.render(request, "cron.html", entries=rows)

    async def workflows(self, request: web.Request) -> web.StreamResponse:
        flows = sorted(self.service.workflows.all(), key=lambda f: -f.created_at)
        return self.render(
            request, "workflows.html", flows=[f.to_json() for f in flows[: PER_PAGE * 4]]
        )

    # ------------------------------------------------------------------ actions

    async def queue_action(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        name = request.match_info["name"]
        action = request.match_info["action"]
        if action not in ("pause", "resume") or not await self._queue_known(name):
            raise web.HTTPNotFound(reason="no such queue or action")
        await set_queue_paused(self.service.runtime, name, action == "pause")
        return self.back(request, form, PREFIX + "/queues")

    async def _queue_known(self, name: str) -> bool:
        """A queue of this node's, or on a cluster one that other nodes have jobs of (a
        pause holds on every node)."""
        cluster = self.service.runtime.cluster
        if name in self.engine.queues or cluster is None:
            return name in self.engine.queues
        counts = await self._from_cluster(cluster.elsewhere())
        return any(queue == name for _function, queue in counts)

    async def worker_action(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        state = form.get("state")
        await direct_everywhere(self.service, request.app, request.match_info["id"], str(state))
        return self.back(request, form, PREFIX + "/workers")

    def _act(self, job_id: str, action: str) -> None:
        service = self.service
        if action == "retry":
            if job_id in service.dead_letter:
                service.dead_letter.retry(job_id)
                return
            job = service.job(job_id)
            self.engine.revive(job)
        elif action == "delete":
            if job_id in service.dead_letter:
                service.dead_letter.delete(job_id)
                return
            job = service.job(job_id)
            if not job.state.terminal:
                self.engine.cancel(job)
            self.engine.forget(job)
        elif action == "cancel":
            self.engine.cancel(service.job(job_id))
        else:
            raise web.HTTPNotFound(reason=f"no action {action!r}")

    async def job_action(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        job_id = request.match_info["id"]
        action = request.match_info["action"]
        self._act(job_id, action)
        default = f"{PREFIX}/jobs/{quote(job_id, safe='')}"
        if action == "delete":
            default = PREFIX + "/jobs"
        return self.back(request, form, default)

    async def bulk_action(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        action = str(form.get("action", ""))
        if action not in ("retry", "delete", "cancel"):
            raise web.HTTPBadRequest(reason="pick retry, delete or cancel")
        for job_id in form.getall("job", []):
            with contextlib.suppress(OJSError, UnknownJob, IllegalTransition):
                self._act(str(job_id), action)
        return self.back(request, form, PREFIX + "/jobs")

    async def cron_action(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        name = request.match_info["name"]
        action = request.match_info["action"]
        if action not in ("enable", "disable") or self.service.cron.get(name) is None:
            raise web.HTTPNotFound(reason="no such cron entry or action")
        self.service.cron.set_enabled(name, action == "enable")
        return self.back(request, form, PREFIX + "/cron")

    async def workflow_cancel(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        flow = self.service.workflows.get(request.match_info["id"])
        if flow is None:
            raise web.HTTPNotFound(reason="no such workflow")
        await self.service.workflows.cancel_anywhere(flow.id, None)
        return self.back(request, form, PREFIX + "/workflows")


def see_other(location: str) -> web.Response:
    """A redirect as a plain reply (an exception would meet the OJS error middleware)."""
    return web.Response(status=303, headers={"Location": location})


def _cluster_order(kind: str) -> str:
    """What a job list on a cluster is ordered by, then the id (the order a node keeps its
    jobs in cannot be merged): dead letters oldest first, as a node keeps them; other
    jobs soonest to run first."""
    return "finished_at" if kind == "dead" else "run_at"


def _page_number(request: web.Request) -> int:
    try:
        return max(1, min(10**6, int(request.query.get("page", "1"))))
    except ValueError:
        return 1
