"""The OJS binding's service: the state it keeps beside the engine, and the aiohttp app.

Everything runs on the engine's event loop, so handlers call the engine directly. Every
reply to a request that may change something (any method but GET, HEAD and OPTIONS) waits
at the runtime's commit barrier until what it announces is durable, in one middleware
(`Edges`): a 201 or an ack 200 means durable, and a commit that fails answers
503 after the engine has retracted the jobs it carried. Routes live in one module per area
(jobs, workers, queues, dead letter, events, cron, workflows, admin); this module wires
them and holds what they share: job submission (with unique jobs, expiry, rate limits),
worker sessions and the helpers beside the engine (event log, dead letter, worker
liveness, cron).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler

from jobwire import __version__
from jobwire.engine import Engine
from jobwire.engine.cron import CronEntry, CronScheduler
from jobwire.engine.errors import IllegalTransition, QueueFull
from jobwire.engine.events import EventLog
from jobwire.engine.job import ORIGIN_CRON, ORIGIN_OJS, Job, JobState
from jobwire.engine.worker import Dispatch, WorkerSession, WorkerState
from jobwire.ports import encode_ext, key_value_store
from jobwire.ports.cluster import ClusterView
from jobwire.protocols.ojs import limits
from jobwire.protocols.ojs.envelope import SPEC_VERSION, PushRequest, parse_push
from jobwire.protocols.ojs.errors import OJSError, error_body
from jobwire.protocols.ojs.ids import uuid7
from jobwire.protocols.ojs.messages import Backpressure
from jobwire.protocols.ojs.retry import RetryPolicy, parse_retry
from jobwire.protocols.ojs.times import format_time
from jobwire.protocols.ojs.unique import UniquePolicy
from jobwire.server.ojs.deadletter_queue import DeadLetter
from jobwire.server.ojs.edges import _BODY_METHODS, _JSON_CONTENT_TYPES, Cors, refuse_non_json
from jobwire.server.ojs.eventkeeper import SAVE_EVERY, EventKeeper
from jobwire.server.ojs.http import (
    BASE,
    REQUEST_ID,
    committed,
    failure_reply,
    finish_reply,
    reply,
)
from jobwire.server.ojs.liveness import WorkerLiveness
from jobwire.server.ojs.ratelimit import KeyedLimits, QueueRateLimits
from jobwire.server.ojs.render import job_json, payload_for
from jobwire.server.ojs.unique import UniqueIndex, shares_unique_key
from jobwire.server.runtime import Runtime
from jobwire.store.sharedkeys import OJS_SHARED

log = logging.getLogger("jobwire.ojs")

MAX_FETCH = limits.MAX_FETCH
#: Methods whose replies acknowledge nothing, so they skip the commit barrier.
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: The highest level whose conformance tests (and all lower levels') pass; see tests/ojs.
CONFORMANCE_LEVEL = 4


@dataclass(slots=True)
class OJSOptions:
    allow_reset: bool = False
    max_body: int = 1024 * 1024
    heartbeat_interval: float = 5.0
    #: Seconds without a heartbeat before a registered (or beating) worker is dead.
    heartbeat_timeout: float = 30.0
    #: Seconds a fetched job is leased when neither the fetch nor the job says (worker protocol).
    visibility_timeout: float = 1800.0
    event_log_size: int = 10_000
    #: Cron runs missed while the server was down: "skip" or "once" (`engine.cron`).
    cron_catch_up: str = "skip"
    #: Origins allowed cross-origin requests (`--cors-origin`); none: CORS is off.
    cors_origins: tuple[str, ...] = ()


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


def retry_policy(job: Job) -> RetryPolicy | None:
    """The job's OJS retry policy (kept in ext as its validated JSON, so the store can keep it)."""
    if job.ext is None or "retry" not in job.ext:
        return None
    try:
        return parse_retry(job.ext["retry"])
    except OJSError as exc:  # kept by an older version that checked less: the defaults
        log.warning("job %s: its retry policy is out of range (%s)", job.id, exc.message)
        return RetryPolicy()


def wants_dead_letter(job: Job) -> bool:
    """A job that ran and failed for good goes to the dead letter queue if its policy says so."""
    retry = (job.ext or {}).get("retry")
    return (
        job.attempts > 0
        and isinstance(retry, dict)
        and retry.get("on_exhaustion") == ("dead_letter")
    )


class Prepared:
    """A validated PUSH, checked against existing jobs, not yet submitted. (Its own
    `__init__`: mypyc leaves a dataclass's generated one interpreted.)"""

    def __init__(
        self,
        req: PushRequest,
        policy: UniquePolicy | None = None,
        unique_key: str | None = None,
        existing: Job | None = None,
    ) -> None:
        self.req = req
        self.policy = policy
        self.unique_key = unique_key
        self.existing = existing  # the job a unique conflict found (ignore / replace)


class OJSService:
    """The OJS binding's state that is not the engine's, and the aiohttp application."""

    def __init__(self, runtime: Runtime, options: OJSOptions | None = None) -> None:
        from jobwire.server.ojs.operations import JobOperations
        from jobwire.server.ojs.workflows import Workflows

        self.runtime = runtime
        self.engine: Engine = runtime.engine
        self.options = options or OJSOptions()
        self.started = time.time()
        self.workers: dict[str, WorkerSession] = {}
        #: The OJS edges middleware (`Edges`), made once: the app's middleware list and
        #: the direct dispatch (`direct.py`) know it by identity.
        self._edges = Edges(self)
        engine = self.engine
        kv = self._kv = key_value_store(runtime.store)
        self.events = EventLog(self.options.event_log_size, clock=engine.clock)
        self.dead_letter = DeadLetter(engine, wants=wants_dead_letter, kv=kv)
        self.liveness = WorkerLiveness(engine, self.options.heartbeat_timeout)
        self.rate_limits = QueueRateLimits()
        # Rate limits being written for the other nodes of a cluster, by queue.
        self._rate_shares: dict[str, asyncio.Task[None]] = {}
        self.keyed_limits = KeyedLimits()
        #: Queue depth bounds (backpressure extension), set by `PUT /admin/queues/{name}/config`.
        self.backpressure: dict[str, Backpressure] = {}
        self.uniques = UniqueIndex()
        self.cron = CronScheduler(
            engine,
            self._cron_trigger,
            kv=kv,
            events=self.events,
            catch_up=self.options.cron_catch_up,
        )
        self.workflows = Workflows(self, kv)
        #: Operations on one job, run where the job is (another node of a cluster, maybe).
        self.operations = JobOperations(self)
        engine.event_log = self.events
        from jobwire.server.ojs.observability import make_registry

        self.metrics_registry, self.metrics = make_registry(self)
        engine.finish_observers.append(self._job_finished)
        self._recover()

    def _job_finished(self, event: str, job: Job) -> None:
        if job.ext is None:  # no OJS options (a Gearman job, say): neither keeps it
            return
        self.dead_letter.observe(event, job)
        self.workflows.observe(event, job)

    def _recover(self) -> None:
        """After a replay: expiry timers and unique locks of restored jobs; cron; workflows."""
        from jobwire.server.ojs.workflows import NAMESPACE as FLOW_NAMESPACE
        from jobwire.server.ojs.workflows import STEP_NAMESPACE

        for job in list(self.engine.jobs.values()):
            ext = job.ext
            if ext is None or not ext.get("ojs"):
                continue
            if ext.get("expires_at") is not None:
                self.arm_expiry(job)
            if ext.get("unique_key"):
                self.uniques.add(ext["unique_key"], job, ext.get("unique_until"))
        restored = self.cron.load()
        if self.runtime.cluster is not None:  # one registry, each tick fired once
            self.runtime.cluster.attach_cron(self.cron)
            self.runtime.cluster.attach_rate_limits(self.rate_limits.set)
            self.keyed_limits.share(self.runtime.cluster, self.engine.observers)
            self.runtime.cluster.watch_claims(self._claimed)
            self.runtime.cluster.watch_adopted_records(self._records_adopted)
            self.runtime.cluster.watch_addressed_records(
                STEP_NAMESPACE, FLOW_NAMESPACE, self.workflows.step_ends_found
            )
        if restored:
            log.info("restored %d cron registrations", restored)
        restored = self.dead_letter.load()
        if restored:
            log.info("restored %d dead letter entries", restored)
        self.workflows.load()
        self._events_keeper: EventKeeper | None = None
        if self._kv is not None:
            self._events_keeper = EventKeeper(self.events, self._kv)
            self._events_keeper.load()
            now = self.engine.clock()
            self.engine.timers.add(now + SAVE_EVERY, self._save_events, None)

    def _save_events(self, _owner: object = None, _when: float = 0.0) -> None:
        """Keep the event log in the store (`eventkeeper`): at shutdown, and every
        `SAVE_EVERY` seconds while it changes (so a crash loses at most that much); the job
        transitions themselves never wait for it."""
        if self._events_keeper is not None:
            try:
                self._events_keeper.save()
            except (TypeError, ValueError):
                log.exception("the event log cannot be saved")
        if _when:  # from the timer: again later
            self.engine.timers.add(_when + SAVE_EVERY, self._save_events, None)

    def close(self) -> None:
        """At shutdown, before the store closes: keep the event log for the next start."""
        self._save_events()

    # ------------------------------------------------------------------ plumbing

    def app(self) -> web.Application:
        from jobwire.server.ojs import (
            admin,
            admin_api,
            cron,
            deadletter,
            events,
            jobs,
            observability,
            progress,
            queues,
            workers,
        )
        from jobwire.server.ojs import workflows as workflow_routes
        from jobwire.server.ojs.openapi import openapi_document

        middlewares: list[Any] = []
        if self.options.cors_origins:  # the CORS layer sits between the read and the edges
            self._edges.note_read = False
            middlewares += [NoteRead(self), Cors(self.options.cors_origins).middleware]
        middlewares.append(self._edges)
        app = web.Application(middlewares=middlewares, client_max_size=self.options.max_body)
        r = app.router
        r.add_get("/ojs/manifest", self.manifest)
        r.add_get(BASE + "/health", self.health)
        document = openapi_document()
        r.add_get(BASE + "/openapi.json", lambda request: _static(document))
        for module in (
            jobs,
            progress,
            workers,
            queues,
            deadletter,
            events,
            cron,
            workflow_routes,
            admin,
            admin_api,
            observability,
        ):
            module.add_routes(r, self)
        return app

    def _read(self) -> web.Response | None:
        """Note a request read; the 503 of a passive server, None when it may be served."""
        runtime = self.runtime
        runtime.note_read()
        if runtime.gate is None or runtime.admit():
            return None
        error = OJSError(
            "backend_error",
            "this server is not the active one of its pair",
            status=503,
            details={"binary_star": runtime.role()},
        )
        refused = reply(error_body(error, f"req_{uuid7()}"), 503, {"Retry-After": "1"})
        refused.headers["OJS-Version"] = SPEC_VERSION
        return refused

    @property
    def edges_middleware(self) -> Edges:
        """The middleware that makes failures OJS error bodies (others go inside it)."""
        return self._edges

    def job(self, job_id: str) -> Job:
        job = self.engine.jobs.get(job_id) or self.dead_letter.get(job_id)
        if job is None:
            raise OJSError("not_found", f"job {job_id} not found")
        return job

    def worker(self, worker_id: str | None) -> WorkerSession:
        """The session of `worker_id`, created on first use (fetch needs no registration)."""
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

    # ------------------------------------------------------------------ submission

    def prepare(self, req: PushRequest) -> Prepared:
        """Check a PUSH against existing jobs without changing anything; raises OJSError."""
        engine = self.engine
        if req.id is not None and req.id in engine.jobs:
            raise OJSError("duplicate", f"a job with id {req.id} already exists")
        plan = Prepared(req)
        policy = req.unique_policy
        if policy is not None:
            key = policy.fingerprint(req.type, req.queue, req.args, req.meta)
            plan.policy, plan.unique_key = policy, key
            existing = self.uniques.conflict(key, policy, engine.clock(), engine.jobs)
            if existing is not None and policy.on_conflict == "reject":
                raise OJSError(
                    "duplicate",
                    f"a job with the same unique key exists: {existing.id}",
                    details={"existing_job_id": existing.id, "unique_key": key},
                )
            plan.existing = existing
        return plan

    def commit(
        self,
        plan: Prepared,
        extra_ext: dict[str, Any] | None = None,
        origin: int = ORIGIN_OJS,
        share_unique: bool = True,
    ) -> tuple[Job, bool]:
        """Submit a prepared PUSH: the new job and True, or the existing one for `ignore`.
        `origin`: how it came (the HTTP binding unless cron or a workflow made it).
        `share_unique`: its unique key may be kept cluster-wide (not for a batch, whose
        reply does not wait for each key to be settled)."""
        req, engine = plan.req, self.engine
        existing = plan.existing
        if existing is not None and plan.policy is not None:
            if plan.policy.on_conflict == "ignore":
                return existing, False
            if not existing.state.terminal:  # replace
                engine.cancel(existing)
        now = engine.clock()
        ext: dict[str, Any] = {
            "ojs": True,
            "args": req.args,
            "meta": req.meta,
            "tags": req.tags,
            "extra": req.extra,
            "options": req.options,
            "retry": req.retry_raw,
            "timeout": req.timeout,
            "enqueued_at": now,
        }
        held = False
        if plan.unique_key is not None and plan.policy is not None:
            ext["unique_key"] = plan.unique_key
            if plan.policy.period is not None:
                ext["unique_until"] = now + plan.policy.period
            if share_unique and shares_unique_key(plan.policy):
                ext[OJS_SHARED] = True
                cluster = self.runtime.cluster
                held = not req.pending and req.run_at is None
                held = held and cluster is not None and cluster.wants_hold()
        if req.expires_at is not None:
            ext["expires_at"] = req.expires_at
            raw = req.options.get("expires_at")
            if isinstance(raw, str) and not raw.startswith("+"):
                ext["expires_at_text"] = raw  # echo the caller's own spelling
        if req.keyed_limit is not None:
            ext["rate_limit"] = req.keyed_limit
        if extra_ext:
            ext.update(extra_ext)
        if self.backpressure:  # bounds set on some queue
            self._check_depth(req.queue)
        job_id = req.id or uuid7()
        if extra_ext or req.options or req.extra or req.run_at is not None:
            payload = self._render_once(req, job_id, now, ext)
        else:
            payload = self._render_plain(req, job_id, now, ext)
        try:
            job, _ = engine.submit(
                req.type,
                payload,
                queue=req.queue,
                priority=req.priority,
                job_id=job_id,
                run_at=req.run_at,
                max_attempts=req.retry.max_attempts,
                lease_timeout=req.visibility_timeout,
                pending=req.pending or held,
                ext=ext,
                origin=origin,
            )
        except QueueFull as exc:
            raise OJSError("rate_limited", str(exc), retryable=True) from None
        if held and self.runtime.cluster is not None and not self.runtime.cluster.hold(job):
            engine.activate(job)  # the other nodes went meanwhile: nothing to settle
        if plan.unique_key is not None:
            self.uniques.add(plan.unique_key, job, ext.get("unique_until"))
        if req.expires_at is not None:
            self.arm_expiry(job)
        if req.rate_limit is not None and self.rate_limits.limit(req.queue) != req.rate_limit:
            self._limit_queue(req.queue, req.rate_limit)
        if req.keyed_limit is not None:
            self.keyed_limits.declare(req.keyed_limit)
        return job, True

    def _limit_queue(self, queue: str, per_second: int) -> None:
        """A push changed `queue`'s rate limit: here at once, on the other nodes of a
        cluster once the database has it (`rate_limit_shared`)."""
        self.rate_limits.set(queue, per_second)
        cluster = self.runtime.cluster
        if cluster is not None:
            share = self._share_rate_limit(cluster, queue, per_second)
            self._rate_shares[queue] = asyncio.get_running_loop().create_task(share)

    async def _share_rate_limit(self, cluster: ClusterView, queue: str, per_second: int) -> None:
        try:
            await cluster.share_rate_limit(queue, per_second)
        except Exception as exc:  # the limit holds here all the same
            log.warning("sharing the rate limit of queue %s failed: %s", queue, exc)

    async def rate_limit_shared(self, queue: str) -> None:
        """Wait for the sharing of `queue`'s new rate limit, if one is under way."""
        task = self._rate_shares.get(queue)
        if task is not None:
            await asyncio.shield(task)
            if self._rate_shares.get(queue) is task:
                del self._rate_shares[queue]

    def depth(self, queue: str) -> int:
        """Jobs ready in `queue` (what a fetch could take now): its lanes' counts."""
        info = self.engine.queues.get(queue)
        return info.available if info is not None else 0

    def _check_depth(self, queue: str) -> None:
        """The queue's depth bound (backpressure extension): refuse a job beyond it."""
        bound = self.backpressure.get(queue)
        if bound is None or bound.max_depth is None:
            return
        depth = self.depth(queue)
        if depth >= bound.max_depth:
            raise OJSError(
                "QUEUE_FULL",
                f"queue {queue} holds {depth} jobs, its bound is {bound.max_depth}",
                status=429,
                retryable=True,
                details={"queue": queue, "depth": depth, "max_depth": bound.max_depth},
                headers={
                    "Retry-After": "1",
                    "X-OJS-Queue-Depth": str(depth),
                    "X-OJS-Queue-Bound": str(bound.max_depth),
                },
            )

    def pressure_headers(self, queue: str) -> dict[str, str]:
        """X-OJS-Queue-Pressure (depth / bound) once a bounded queue passes its warning
        threshold; no headers otherwise."""
        bound = self.backpressure.get(queue)
        if bound is None or bound.max_depth is None or bound.warning_threshold is None:
            return {}
        pressure = self.depth(queue) / bound.max_depth
        if pressure < bound.warning_threshold:
            return {}
        return {
            "X-OJS-Queue-Pressure": f"{pressure:.3f}",
            "X-OJS-Queue-Depth": str(self.depth(queue)),
            "X-OJS-Queue-Bound": str(bound.max_depth),
        }

    @staticmethod
    def _render_once(req: PushRequest, job_id: str, now: float, ext: dict[str, Any]) -> bytes:
        """The job's payload, after rendering the job as every endpoint shows it and as the
        store writes it: a job that cannot be read back is refused before it exists."""
        try:
            payload = payload_for(req.args)
            preview = Job(job_id, req.type, payload, req.queue, None, req.priority, True, now)
            preview.max_attempts = req.retry.max_attempts
            preview.ext = ext
            if req.run_at is not None and req.run_at > now:
                preview.state = JobState.SCHEDULED
                preview.run_at = req.run_at
            orjson.dumps(job_json(preview))
            encode_ext(ext)
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            message = f"the job cannot be stored as sent: {exc}"
            raise OJSError("invalid_request", message, details={"field": "$"}) from None
        return payload

    @classmethod
    def _render_plain(cls, req: PushRequest, job_id: str, now: float, ext: dict[str, Any]) -> bytes:
        """`_render_once` for a PUSH without options, unknown attributes or a time: of what
        the job shows, only its args, meta and tags may fail to render (the rest are ids,
        names, small integers and the current time), and what orjson writes the standard
        library's encoder (the store's) writes too. Any failure takes the full render, so a
        refusal says the same as there."""
        try:
            payload = payload_for(req.args)
            if req.meta is not None or req.tags is not None:
                orjson.dumps((req.meta, req.tags))
        except (TypeError, ValueError, OverflowError, RecursionError):
            return cls._render_once(req, job_id, now, ext)
        return payload

    def submit(
        self, req: PushRequest, extra_ext: dict[str, Any] | None = None, origin: int = ORIGIN_OJS
    ) -> tuple[Job, bool]:
        return self.commit(self.prepare(req), extra_ext, origin)

    def _records_adopted(self, namespace: str, records: dict[str, bytes]) -> None:
        """A cluster node went: its workflows and dead letters are this node's now."""
        from jobwire.server.ojs import deadletter_queue, workflows

        if namespace == workflows.NAMESPACE:
            self.workflows.adopt(records)
        elif namespace == deadletter_queue.NAMESPACE:
            self.dead_letter.adopt(records)

    def _claimed(self, job: Job) -> None:
        """A job another node wrote, now this node's: its expiry holds here. One past its
        expiry is discarded at once, before a fetch can hand it out."""
        ext = job.ext
        if ext is None or not ext.get("ojs") or ext.get("expires_at") is None:
            return
        if float(ext["expires_at"]) <= self.engine.clock():
            if job.state is not JobState.ACTIVE and not job.state.terminal:
                self.engine.expire(job, "expired")
        else:
            self.arm_expiry(job)

    def arm_expiry(self, job: Job) -> None:
        assert job.ext is not None
        when = float(job.ext["expires_at"])
        self.engine.timers.add(max(when, self.engine.clock()), self._on_expiry, job)

    def _on_expiry(self, job: Job, when: float) -> None:
        if self.engine.jobs.get(job.id) is not job or job.state is JobState.ACTIVE:
            return  # gone, replaced, or already running (a running job finishes normally)
        if not job.state.terminal:
            self.engine.expire(job, "expired")

    def _cron_trigger(self, entry: CronEntry, when: float) -> Job:
        template = dict(entry.template)
        meta = dict(template.get("meta") or {})
        meta.update(cron_name=entry.name, cron_triggered_at=format_time(when))
        template["meta"] = meta
        job, _ = self.submit(parse_push(template), origin=ORIGIN_CRON)
        return job

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
                "backend": type(self.runtime.store).__name__,
                "capabilities": {
                    "batch_enqueue": True,
                    "cron": True,
                    "dead_letter": True,
                    "delayed_jobs": True,
                    "job_ttl": True,
                    "priority_queues": True,
                    "rate_limiting": True,
                    "schema_validation": False,
                    "unique_jobs": True,
                    "workflows": True,
                    "pause_resume": True,
                    "events": True,
                    "worker_registration": True,
                },
                "extensions": ["x-jobwire-worker-registration", "x-jobwire-worker-state"],
                "endpoints": {"base": BASE, "openapi": BASE + "/openapi.json"},
            }
        )

    async def health(self, request: web.Request) -> web.Response:
        return reply(
            {
                "status": "ok",
                "version": SPEC_VERSION,
                "uptime_seconds": int(time.time() - self.started),
                "backend": {"type": type(self.runtime.store).__name__, "status": "ok"},
            }
        )

    def reset(self) -> None:
        """Forget every job, worker, registration and record (`POST /ojs/v1/admin/reset`)."""
        engine = self.engine
        for session in list(self.workers.values()):
            if session.state is not WorkerState.TERMINATED:
                engine.remove_worker(session, "reset")
        self.workers.clear()
        engine.reset()
        self.events.clear()
        if self._events_keeper is not None:
            self._events_keeper.forget()
        self.dead_letter.clear()
        self.liveness.clear()
        self.rate_limits.clear()
        self.keyed_limits.clear()
        self.backpressure.clear()
        self.uniques.clear()
        self.cron.clear()
        self.workflows.clear()
        if self.runtime.cluster is not None:
            self.runtime.cluster.forget_interest()


class NoteRead:
    """A request read: the loop polls on a while for the next (`Runtime.note_read`). The
    passive server of a Binary Star pair answers 503 (`Runtime.admit`). Its own layer only
    when CORS sits between it and the edges; otherwise `Edges` does this.

    A middleware object rather than a function under `@web.middleware`, which marks the
    function with an attribute: a compiled (mypyc) function takes none, a class keeps it."""

    __middleware_version__: ClassVar[int] = 1  # what `@web.middleware` sets

    def __init__(self, service: OJSService) -> None:
        self.service = service

    async def __call__(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        refused = self.service._read()
        if refused is not None:
            return refused
        response: web.StreamResponse = await handler(request)
        return response


class Edges:
    """The OJS edges of every request, in one middleware: aiohttp wraps each middleware
    layer in a partial per request, so three layers (the error layer, the JSON check and
    the commit barrier) cost more than the three checks.

    In order: note the read and refuse it on a passive server (`OJSService._read`, here
    unless CORS is configured); refuse a non-JSON body (415); run the handler; the commit
    barrier: a reply that may acknowledge a change goes out once the change is durable (at
    once when nothing was written); and every failure, a failed commit's too, becomes an
    OJS error body, every reply gets the OJS headers. A middleware object, as `NoteRead`."""

    __middleware_version__: ClassVar[int] = 1  # what `@web.middleware` sets

    def __init__(self, service: OJSService) -> None:
        self.service = service
        #: Notes each read itself (`_read`), unless a CORS layer sits before it.
        self.note_read = True

    async def __call__(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        service = self.service
        if self.note_read:
            refused = service._read()
            if refused is not None:
                return refused
        method: str = request.method
        headers = request.headers
        request_id: str = headers.get("X-Request-Id") or f"req_{uuid7()}"
        request[REQUEST_ID] = request_id  # for the node holding a job, if another one
        try:
            if method in _BODY_METHODS:  # a JSON type seen before passes at once
                content_type = headers.get("Content-Type")
                if content_type is not None and _JSON_CONTENT_TYPES.get(content_type) is not True:
                    refuse_non_json(request)
            response: web.StreamResponse = await handler(request)
            # Nothing to wait for on a store that commits at once (no coroutine to run).
            if method not in _SAFE_METHODS and service.runtime.durable_store:
                await committed(service.runtime)
                if service.workflows.reporting:  # a step's end, told to its workflow's node
                    await service.workflows.reported()
        except Exception as exc:
            response = failure_reply(request, exc, request_id)
        return finish_reply(response, request_id)


async def _static(document: dict[str, Any]) -> web.Response:
    return reply(document)


def illegal(exc: IllegalTransition) -> OJSError:
    return OJSError("conflict", str(exc), status=409)


__all__ = ["OJSOptions", "OJSService"]
