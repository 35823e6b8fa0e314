"""aiohttp handlers for `/ojs/v1`: parse the request, make one engine call, render the reply.

Everything runs on the engine's event loop, so handlers call the engine directly. A PUSH is
answered 201 only once the store has made the job durable (the engine's durability contract).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from jobwire import __version__
from jobwire.engine import Engine
from jobwire.engine.errors import EngineError, IllegalTransition, QueueFull
from jobwire.engine.job import Job, JobState
from jobwire.engine.worker import Dispatch, WorkerSession, WorkerState
from jobwire.protocols.ojs.envelope import SPEC_VERSION, PushRequest, check_queue, parse_push
from jobwire.protocols.ojs.errors import OJSError, error_body, invalid
from jobwire.protocols.ojs.ids import uuid7
from jobwire.protocols.ojs.retry import RetryPolicy, parse_retry
from jobwire.protocols.ojs.times import format_time
from jobwire.server.ojs.render import job_json, payload_for
from jobwire.server.runtime import Runtime

log = logging.getLogger("jobwire.ojs")

CONTENT_TYPE = "application/openjobspec+json"
BASE = "/ojs/v1"
DEFAULT_VISIBILITY_MS = 30_000
MAX_FETCH = 1000
#: The highest level whose conformance tests (and all lower levels') pass; see tests/ojs.
CONFORMANCE_LEVEL = 0


@dataclass(slots=True)
class OJSOptions:
    allow_reset: bool = False
    max_body: int = 1024 * 1024
    heartbeat_interval: float = 5.0
    heartbeat_timeout: float = 30.0


class _HttpWorker:
    """The engine's handle on an OJS worker: it pulls over HTTP, so there is nobody to call."""

    def wake(self) -> None:
        pass

    def assign(self, job: Job) -> None:
        pass

    def revoke(self, job: Job, reason: str) -> None:
        pass


_HANDLER = _HttpWorker()
ANONYMOUS = "ojs-anonymous"


def reply(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=orjson.dumps(body), status=status, content_type=CONTENT_TYPE, headers=headers
    )


def _http_error_code(status: int) -> str:
    return {
        404: "not_found",
        405: "method_not_allowed",
        413: "payload_too_large",
    }.get(status, "invalid_request" if status < 500 else "backend_error")


@web.middleware
async def ojs_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every reply gets the OJS headers; every failure becomes an OJS error body."""
    request_id = request.headers.get("X-Request-Id") or f"req_{uuid7()}"
    try:
        response: web.StreamResponse = await handler(request)
    except OJSError as exc:
        response = reply(error_body(exc, request_id), exc.status)
    except web.HTTPException as exc:
        code = _http_error_code(exc.status)
        error = OJSError(code, exc.reason or code, status=exc.status)
        response = reply(error_body(error, request_id), exc.status)
    except Exception:
        log.exception("OJS request %s %s failed", request.method, request.path)
        error = OJSError("backend_error", "internal error", status=500, retryable=True)
        response = reply(error_body(error, request_id), 500)
    response.headers["OJS-Version"] = SPEC_VERSION
    response.headers["X-Request-Id"] = request_id
    return response


async def read_json(request: web.Request, *, required: bool = True) -> Any:
    raw = await request.read()
    if not raw.strip():
        if required:
            raise OJSError("invalid_payload", "request body is empty; send a JSON object")
        return {}
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise OJSError("invalid_payload", f"malformed JSON: {exc}") from None


async def read_object(request: web.Request, *, required: bool = True) -> dict[str, Any]:
    body = await read_json(request, required=required)
    if not isinstance(body, dict):
        raise OJSError("invalid_payload", "request body must be a JSON object")
    return body


def _str_field(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise invalid(f"{name} is required and must be a non-empty string")
    return value


_DIRECTIVES = [WorkerState.RUNNING, WorkerState.QUIET, WorkerState.TERMINATE]


def _directive(state: Any) -> int:
    """Rank of a worker state; the server only ever moves a worker forward."""
    for rank, candidate in enumerate(_DIRECTIVES):
        if state == candidate.value:
            return rank
    return 0


def _test_directive(job: Job) -> Any:
    """The conformance suite's hook: `options.metadata.test_directive` names a worker state."""
    options = (job.ext or {}).get("options") or {}
    metadata = options.get("metadata")
    return metadata.get("test_directive") if isinstance(metadata, dict) else None


def retry_policy(job: Job) -> RetryPolicy | None:
    """The job's OJS retry policy (kept in ext as its validated JSON, so the store can keep it)."""
    if job.ext is None or "retry" not in job.ext:
        return None
    return parse_retry(job.ext["retry"])


class OJSService:
    """The OJS binding's state that is not the engine's: HTTP worker sessions, start time."""

    def __init__(self, runtime: Runtime, options: OJSOptions | None = None) -> None:
        self.runtime = runtime
        self.engine: Engine = runtime.engine
        self.options = options or OJSOptions()
        self.started = time.time()
        self.workers: dict[str, WorkerSession] = {}
        self._previous_backoff = self.engine.backoff
        self.engine.backoff = self._backoff

    # ------------------------------------------------------------------ plumbing

    def app(self) -> web.Application:
        app = web.Application(middlewares=[ojs_middleware], client_max_size=self.options.max_body)
        r = app.router
        r.add_get("/ojs/manifest", self.manifest)
        r.add_get(BASE + "/health", self.health)
        r.add_post(BASE + "/jobs", self.push)
        r.add_get(BASE + "/jobs/{id}", self.get_job)
        r.add_delete(BASE + "/jobs/{id}", self.cancel)
        r.add_post(BASE + "/jobs/{id}/activate", self.activate)
        r.add_post(BASE + "/workers/fetch", self.fetch)
        r.add_post(BASE + "/workers/ack", self.ack)
        r.add_post(BASE + "/workers/nack", self.nack)
        r.add_post(BASE + "/workers/heartbeat", self.heartbeat)
        r.add_get(BASE + "/queues", self.list_queues)
        if self.options.allow_reset:
            r.add_post(BASE + "/admin/reset", self.reset)
        return app

    async def durable(self) -> None:
        """Wait until everything written so far is durable (immediate for the memory store)."""
        store = self.engine.store
        if not store.pending():
            return
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        def done(ok: bool = True) -> None:
            if not future.done():
                future.set_result(ok)

        store.after_commit(done)
        if not await future:
            raise OJSError(
                "backend_error", "the store could not commit", status=503, retryable=True
            )

    def _backoff(self, job: Job) -> float:
        ext = job.ext
        if ext is not None and ext.pop("nack_pending", False):
            policy = retry_policy(job)
            if policy is not None:
                delay = policy.delay(job.attempts)
                ext["retry_delay"] = delay
                return delay
        return self._previous_backoff(job)

    def job(self, job_id: str) -> Job:
        job = self.engine.jobs.get(job_id)
        if job is None:
            raise OJSError("not_found", f"job {job_id} not found")
        return job

    def worker(self, worker_id: str | None) -> WorkerSession:
        key = worker_id or ANONYMOUS
        session = self.workers.get(key)
        if session is None or session.state is WorkerState.TERMINATED:
            session = WorkerSession(f"ojs:{key}", _HANDLER, protocol="ojs", dispatch=Dispatch.PULL)
            session.name = key
            self.engine.add_worker(session)
            self.workers[key] = session
        else:
            self.engine.touch(session)
        return session

    # ------------------------------------------------------------------ system

    async def manifest(self, request: web.Request) -> web.Response:
        return reply(
            {
                "specversion": SPEC_VERSION,
                "ojs_version": SPEC_VERSION,
                "implementation": {
                    "name": "jobwire",
                    "version": __version__,
                    "language": "python",
                    "homepage": "https://github.com/jobwire/jobwire",
                },
                "conformance_level": CONFORMANCE_LEVEL,
                "protocols": ["http"],
                "backend": type(self.engine.store).__name__,
                "capabilities": {
                    "batch_enqueue": False,
                    "cron": False,
                    "dead_letter": False,
                    "delayed_jobs": True,
                    "job_ttl": False,
                    "priority_queues": True,
                    "rate_limiting": False,
                    "schema_validation": False,
                    "unique_jobs": False,
                    "workflows": False,
                    "pause_resume": False,
                },
                "extensions": [],
                "endpoints": {"base": BASE},
            }
        )

    async def health(self, request: web.Request) -> web.Response:
        return reply(
            {
                "status": "ok",
                "version": SPEC_VERSION,
                "uptime_seconds": int(time.time() - self.started),
                "backend": {"type": type(self.engine.store).__name__, "status": "ok"},
            }
        )

    async def reset(self, request: web.Request) -> web.Response:
        engine = self.engine
        for session in list(self.workers.values()):
            if session.state is not WorkerState.TERMINATED:
                engine.remove_worker(session, "reset")
        self.workers.clear()
        engine.reset()
        return reply({"ok": True})

    # ------------------------------------------------------------------ jobs

    async def push(self, request: web.Request) -> web.Response:
        req = parse_push(await read_json(request))
        job = self.submit(req)
        await self.durable()
        return reply({"job": job_json(job)}, 201, {"Location": f"{BASE}/jobs/{job.id}"})

    def submit(self, req: PushRequest) -> Job:
        engine = self.engine
        if req.id is not None and req.id in engine.jobs:
            raise OJSError("duplicate", f"a job with id {req.id} already exists")
        info = engine.queues.get(req.queue)
        if info is not None and info.paused:
            raise OJSError("queue_paused", f"queue {req.queue} is paused")
        ext: dict[str, Any] = {
            "ojs": True,
            "args": req.args,
            "meta": req.meta,
            "tags": req.tags,
            "extra": req.extra,
            "options": req.options,
            "retry": req.retry_raw,
            "timeout": req.timeout,
            "enqueued_at": time.time(),
        }
        try:
            job, _ = engine.submit(
                req.type,
                payload_for(req.args),
                queue=req.queue,
                priority=req.priority,
                job_id=req.id or uuid7(),
                run_at=req.run_at,
                max_attempts=req.retry.max_attempts,
                lease_timeout=req.visibility_timeout,
                pending=req.pending,
                ext=ext,
            )
        except QueueFull as exc:
            raise OJSError("rate_limited", str(exc), retryable=True) from None
        return job

    async def get_job(self, request: web.Request) -> web.Response:
        return reply({"job": job_json(self.job(request.match_info["id"]))})

    async def cancel(self, request: web.Request) -> web.Response:
        job = self.job(request.match_info["id"])
        try:
            self.engine.cancel(job)
        except IllegalTransition as exc:
            raise OJSError("conflict", str(exc), status=409) from None
        await self.durable()
        return reply({"job": job_json(job)})

    async def activate(self, request: web.Request) -> web.Response:
        job = self.job(request.match_info["id"])
        try:
            self.engine.activate(job)
        except IllegalTransition as exc:
            raise OJSError("conflict", str(exc), status=409) from None
        await self.durable()
        return reply({"job": job_json(job)})

    # ------------------------------------------------------------------ workers

    async def fetch(self, request: web.Request) -> web.Response:
        body = await read_object(request)
        queues = body.get("queues", ["default"])
        if not isinstance(queues, list) or not queues:
            raise invalid("queues must be a non-empty array of queue names")
        names = [check_queue(q) for q in queues]
        count = body.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_FETCH:
            raise invalid(f"count must be an integer in [1, {MAX_FETCH}]")
        visibility = body.get("visibility_timeout_ms")
        if visibility is None:
            lease: float | None = None
        elif isinstance(visibility, int) and not isinstance(visibility, bool) and visibility > 0:
            lease = visibility / 1000
        else:
            raise invalid("visibility_timeout_ms must be a positive integer")
        worker_id = body.get("worker_id")
        if worker_id is not None and not isinstance(worker_id, str):
            raise invalid("worker_id must be a string")
        session = self.worker(worker_id)
        if session.state is not WorkerState.RUNNING:
            return reply({"jobs": []})
        jobs = self.engine.fetch(names, count, worker=session, lease_timeout=lease)
        for job in jobs:
            lease_for = job.lease_deadline - time.time() if job.lease_deadline else None
            if lease_for is None:  # neither the fetch nor the job set one
                lease_for = DEFAULT_VISIBILITY_MS / 1000
            timeout = (job.ext or {}).get("timeout")
            if timeout:  # an execution timeout also ends the lease
                lease_for = min(lease_for, timeout)
            self.engine.extend_lease(job, lease_for)
        await self.durable()
        rendered = [job_json(job) for job in jobs]
        out: dict[str, Any] = {"jobs": rendered}
        if rendered:
            out["job"] = rendered[0]
        return reply(out)

    def active_job(self, body: dict[str, Any]) -> Job:
        job = self.job(_str_field(body, "job_id"))
        if job.state is not JobState.ACTIVE:
            raise OJSError(
                "conflict", f"job {job.id} is {job.state.name.lower()}, not active", status=409
            )
        return job

    async def ack(self, request: web.Request) -> web.Response:
        body = await read_object(request)
        job = self.active_job(body)
        result = body.get("result")
        try:
            self.engine.complete(job, orjson.dumps(result) if result is not None else b"")
        except EngineError as exc:
            raise OJSError("conflict", str(exc), status=409) from None
        if job.ext is None:
            job.ext = {}
        if result is not None:
            job.ext["result"] = result
        await self.durable()
        assert job.finished_at is not None
        return reply(
            {
                "acknowledged": True,
                "id": job.id,
                "job_id": job.id,
                "state": "completed",
                "completed_at": format_time(job.finished_at),
                "job": job_json(job),
            }
        )

    async def nack(self, request: web.Request) -> web.Response:
        body = await read_object(request)
        job = self.active_job(body)
        raw_error = body.get("error", {})
        if not isinstance(raw_error, dict):
            raise invalid("error must be an object {code, message, retryable?, details?}")
        code = raw_error.get("code", "handler_error")
        message = raw_error.get("message", "")
        if not isinstance(code, str) or not isinstance(message, str):
            raise invalid("error.code and error.message must be strings")
        retryable = raw_error.get("retryable", True)
        requeue = body.get("requeue", False)
        if not isinstance(requeue, bool):
            raise invalid("requeue must be a boolean")
        if not isinstance(retryable, bool):
            raise invalid("error.retryable must be a boolean")
        details = raw_error.get("details")
        error: dict[str, Any] = {"type": code, "code": code, "message": message or code}
        if details is not None:
            error["details"] = details
        error["attempt"] = job.attempts
        error["occurred_at"] = format_time(time.time())
        ext = job.ext if job.ext is not None else {}
        job.ext = ext
        policy = retry_policy(job)
        error_class = details.get("error_class") if isinstance(details, dict) else None
        if policy is not None and (
            policy.is_non_retryable(code) or policy.is_non_retryable(error_class)
        ):
            retryable = False
        ext.setdefault("errors", []).append(error)
        # A requeue (a worker releasing the job, e.g. on terminate) goes back at once.
        ext["nack_pending"] = not requeue
        try:
            self.engine.fail(job, message, retry=retryable or requeue)
        except EngineError as exc:
            raise OJSError("conflict", str(exc), status=409) from None
        finally:
            ext.pop("nack_pending", None)
        job.error = error
        await self.durable()
        out: dict[str, Any] = {
            "id": job.id,
            "job_id": job.id,
            "state": job.state.name.lower(),
            "attempt": job.attempts,
            "max_attempts": job_json(job)["max_attempts"],
        }
        if job.state is JobState.RETRYABLE and job.run_at is not None:
            out["next_attempt_at"] = format_time(job.run_at)
        if job.state is JobState.AVAILABLE:
            out["next_attempt_at"] = format_time(time.time())
        if ext.get("retry_delay") is not None and not job.state.terminal:
            out["retry_delay_ms"] = int(ext["retry_delay"] * 1000)
        if job.state is JobState.DISCARDED and job.finished_at is not None:
            out["discarded_at"] = out["completed_at"] = format_time(job.finished_at)
        out["job"] = job_json(job)
        return reply(out)

    async def heartbeat(self, request: web.Request) -> web.Response:
        body = await read_object(request)
        worker_id = _str_field(body, "worker_id")
        session = self.worker(worker_id)
        ids: list[Any] = []
        for name in ("active_jobs", "active_job_ids"):
            value = body.get(name)
            if isinstance(value, list):
                ids.extend(value)
            elif value is not None and not isinstance(value, int):
                raise invalid(f"{name} must be an array of job ids")
        visibility = body.get("visibility_timeout_ms")
        if visibility is not None and (
            not isinstance(visibility, int) or isinstance(visibility, bool) or visibility <= 0
        ):
            raise invalid("visibility_timeout_ms must be a positive integer")
        extended = []
        directive = _directive(body.get("state"))
        for job_id in ids:
            if not isinstance(job_id, str):
                raise invalid("active job ids must be strings")
            job = self.engine.jobs.get(job_id)
            if job is not None and job.state is JobState.ACTIVE:
                timeout = (
                    visibility / 1000
                    if visibility
                    else job.lease_timeout or DEFAULT_VISIBILITY_MS / 1000
                )
                self.engine.extend_lease(job, timeout)
                extended.append(job_id)
                directive = max(directive, _directive(_test_directive(job)))
        if directive > _directive(session.state.value):
            self.engine.set_worker_state(session, _DIRECTIVES[directive])
        return reply(
            {
                "state": session.state.value,
                "jobs_extended": extended,
                "server_time": format_time(time.time()),
                "heartbeat_interval_ms": int(self.options.heartbeat_interval * 1000),
            }
        )

    # ------------------------------------------------------------------ queues

    async def list_queues(self, request: web.Request) -> web.Response:
        queues = []
        for info in self.engine.queues.values():
            queues.append(
                {
                    "name": info.name,
                    "status": "paused" if info.paused else "active",
                    "paused": info.paused,
                    "available": info.available,
                }
            )
        return reply({"queues": queues})


async def start_http(service: OJSService, host: str, port: int) -> web.AppRunner:
    """Serve the app on host:port; the caller cleans up with `await runner.cleanup()`."""
    runner = web.AppRunner(service.app(), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True, backlog=1024)
    await site.start()
    return runner


__all__ = ["OJSOptions", "OJSService", "start_http"]
