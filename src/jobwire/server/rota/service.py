"""The Rota binding on the HTTP server: the `/work` WebSocket and the `/rota/v1` endpoints.

`RotaService.install(app)` adds its routes to the aiohttp application that serves OJS, so both
share one port, one event loop and one engine. HTTP errors use the OJS error body (the OJS
middleware renders `OJSError`).
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from jobwire.engine import Engine
from jobwire.engine.worker import WorkerState
from jobwire.protocols.ojs.errors import OJSError
from jobwire.protocols.ojs.times import format_time
from jobwire.protocols.rota import (
    DEFAULT_MAX_MESSAGE,
    WORKER_STATES,
    CloseCode,
    SpecError,
    load_spec,
    schema,
)
from jobwire.server.ojs.http import read_body
from jobwire.server.rota.connection import RotaConnection
from jobwire.server.rota.journal import AlertStore, LogStore
from jobwire.server.rota.registry import RegisteredSpec, SpecRegistry
from jobwire.server.runtime import Runtime

log = logging.getLogger("jobwire.rota")

BASE = "/rota/v1"
MAX_SPEC_BODY = 1024 * 1024


@dataclass(slots=True)
class RotaOptions:
    #: Seconds of silence after which a worker is gone (its jobs are requeued).
    heartbeat_timeout: float = 5.0
    #: Largest message a worker may send, in bytes; larger ones close the socket with 1009.
    max_message: int = DEFAULT_MAX_MESSAGE
    #: Ask workers for the logs of every job (else only of jobs whose OJS meta.logs is true).
    logs: bool = False
    #: Where registered specs are kept across restarts; None keeps them in memory only.
    spec_file: Path | None = None
    max_log_jobs: int = 10_000
    max_log_lines: int = 1000
    max_alerts: int = 1000
    #: Messages queued to a worker that is not reading before it is disconnected.
    max_outbox: int = 10_000
    #: Seconds a close handshake may take before the TCP connection is cut.
    close_timeout: float = 5.0
    #: Seconds without a message to a worker (revision 2) after which it is sent a `beat`.
    beat_interval: float = 1.0


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


class RotaService:
    """Also reachable from the other HTTP routes as `app[ROTA_SERVICE]` (the operator's
    worker-state route directs `rota:N` workers through `direct`)."""

    def __init__(self, runtime: Runtime, options: RotaOptions | None = None) -> None:
        self.runtime = runtime
        self.engine: Engine = runtime.engine
        self.options = options or RotaOptions()
        self.specs = SpecRegistry(self.options.spec_file)
        self.logs = LogStore(
            max_jobs=self.options.max_log_jobs, max_lines=self.options.max_log_lines
        )
        self.alerts = AlertStore(max_alerts=self.options.max_alerts)
        #: Registered workers by session id.
        self.connections: dict[str, RotaConnection] = {}
        self._open: set[RotaConnection] = set()
        self._ids = itertools.count(1)

    def next_worker_id(self) -> str:
        return f"rota:{next(self._ids)}"

    def install(self, app: web.Application) -> None:
        r = app.router
        r.add_get("/work", self.work)
        r.add_post(BASE + "/specs", self.register_spec)
        r.add_get(BASE + "/specs", self.list_specs)
        r.add_get(BASE + "/specs/{name}", self.get_spec)
        r.add_get(BASE + "/workers", self.list_workers)
        r.add_get(BASE + "/jobs/{id}/logs", self.job_logs)
        r.add_get(BASE + "/alerts", self.list_alerts)
        r.add_get(BASE + "/schema.json", self.get_schema)
        app[ROTA_SERVICE] = self
        app.on_shutdown.append(self._on_shutdown)

    async def _on_shutdown(self, app: web.Application) -> None:
        for conn in list(self._open):
            conn.close(CloseCode.GOING_AWAY, "server shutting down", reason="server shutdown")

    # ---------------------------------------------------------------- /work

    async def work(self, request: web.Request) -> web.StreamResponse:
        # aiohttp refuses frames at the hard limit itself (close 1009, no message); up to it we
        # decode the size ourselves, so the worker is told why before the close.
        limit = self.options.max_message
        ws: web.WebSocketResponse[Any] = web.WebSocketResponse(
            max_msg_size=max(2 * limit, limit + 64 * 1024),
            decode_text=False,
            timeout=self.options.close_timeout,
        )
        if not ws.can_prepare(request):
            raise OJSError(
                "invalid_request",
                "/work is a WebSocket endpoint: connect with Upgrade: websocket",
                status=426,
            )
        await ws.prepare(request)
        conn = RotaConnection(self, ws, request)
        self._open.add(conn)
        try:
            await conn.run()
        finally:
            self._open.discard(conn)
        return ws

    # ---------------------------------------------------------------- lifecycle

    def direct(self, worker_id: str, state: str) -> dict[str, Any] | None:
        """An operator's `running`, `quiet` or `terminate` for worker `worker_id`, sent over
        its socket; the worker as listed, or None when no Rota worker has that id.
        A terminating worker cannot be resumed (OJSError conflict)."""
        conn = self.connections.get(worker_id)
        if conn is None or conn.closing or conn.session is None:
            return None
        if state not in WORKER_STATES:
            raise OJSError("invalid_request", f"state must be one of {', '.join(WORKER_STATES)}")
        if conn.session.state is WorkerState.TERMINATE and state != "terminate":
            raise OJSError("conflict", "a terminating worker cannot be resumed", status=409)
        conn.direct(WorkerState(state))
        return {"worker_id": worker_id, **conn.json()}

    async def get_schema(self, request: web.Request) -> web.Response:
        return web.Response(body=_SCHEMA, content_type="application/schema+json")

    # ---------------------------------------------------------------- specs

    async def register_spec(self, request: web.Request) -> web.Response:
        raw = await read_body(request, MAX_SPEC_BODY + 1)
        if len(raw) > MAX_SPEC_BODY:
            raise OJSError("payload_too_large", "a spec document is at most 1 MiB", status=413)
        try:
            spec = load_spec(raw)
        except SpecError as exc:
            raise OJSError("invalid_request", f"not a job spec: {exc}") from None
        try:
            entry, previous = self.specs.register(spec)
        except OSError as exc:
            log.error("cannot save the Rota spec file: %s", exc)
            raise OJSError(
                "backend_error", "the spec could not be saved", status=503, retryable=True
            ) from None
        changed = previous is None or previous.checksum != entry.checksum
        if changed:
            log.info("job spec %s registered, checksum %s", entry.name, entry.checksum)
            for conn in list(self.connections.values()):
                conn.specs_changed()
        body = _spec_json(entry)
        body["replaced"] = previous.checksum if previous is not None and changed else None
        return _json({"spec": body}, 201 if changed else 200)

    async def list_specs(self, request: web.Request) -> web.Response:
        return _json({"specs": [_spec_json(entry) for entry in self.specs.all()]})

    async def get_spec(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        entry = self.specs.get(name)
        if entry is None:
            raise OJSError("not_found", f"no job spec named {name} is registered")
        return _json({"spec": _spec_json(entry)})

    # ---------------------------------------------------------------- status views

    async def list_workers(self, request: web.Request) -> web.Response:
        workers = [conn.json() for conn in self.connections.values()]
        return _json({"workers": workers})

    async def job_logs(self, request: web.Request) -> web.Response:
        job_id = request.match_info["id"]
        logs = self.logs.get(job_id)
        if logs is None:
            if job_id not in self.engine.jobs:
                raise OJSError("not_found", f"job {job_id} not found and no logs are kept for it")
            return _json({"job": job_id, "lines": [], "dropped": 0})
        lines = [{**entry, "time": format_time(entry["time"])} for entry in logs.lines]
        return _json({"job": job_id, "lines": lines, "dropped": logs.dropped})

    async def list_alerts(self, request: web.Request) -> web.Response:
        after = request.query.get("after", "0")
        if not after.isdigit():
            raise OJSError("invalid_request", "after must be an alert id (a decimal integer)")
        alerts = [
            {**alert, "time": format_time(alert["time"])} for alert in self.alerts.since(int(after))
        ]
        return _json({"alerts": alerts})


ROTA_SERVICE = web.AppKey("rota_service", RotaService)
_SCHEMA = orjson.dumps(schema(), option=orjson.OPT_INDENT_2)


def _spec_json(entry: RegisteredSpec) -> dict[str, Any]:
    return {
        "name": entry.name,
        "checksum": entry.checksum,
        "registered_at": format_time(entry.registered_at),
        "spec": entry.spec,
    }
