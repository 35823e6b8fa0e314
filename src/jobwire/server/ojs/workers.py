"""Worker routes: FETCH, ACK, FAIL (nack), BEAT (heartbeat), and registration.

Registration (`POST /ojs/v1/workers/register`, `/deregister`) is a jobwire extension: the
HTTP binding defines none, the worker protocol describes one. A registered worker gets its
concurrency enforced by the server (a fetch never leaves it holding more), its declared
queues as the default for fetches, and dead-worker recovery: once it has registered or sent a
heartbeat, missing heartbeats for `heartbeat_timeout` seconds puts its jobs back in their
queues (the attempt counts). Workers that only fetch are never declared dead; their jobs
return through the visibility timeout.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from jobwire.engine.errors import EngineError, IllegalTransition
from jobwire.engine.job import Job, JobState
from jobwire.engine.worker import WorkerSession, WorkerState
from jobwire.protocols.ojs.envelope import check_queue
from jobwire.protocols.ojs.errors import OJSError, classify_error, invalid
from jobwire.protocols.ojs.ids import uuid7
from jobwire.protocols.ojs.messages import (
    Ack,
    Deregister,
    Fetch,
    Heartbeat,
    Nack,
    Register,
    convert,
)
from jobwire.protocols.ojs.times import format_time
from jobwire.server.ojs.app import MAX_FETCH, retry_policy
from jobwire.server.ojs.http import (
    BASE,
    is_int,
    optional_str,
    positive_int,
    read_object,
    reply,
    str_field,
)
from jobwire.server.ojs.operations import every_node
from jobwire.server.ojs.ownership import check_holder
from jobwire.server.ojs.render import job_json
from jobwire.server.ojs.workerlist import every_worker, worker_json, workers_here

if TYPE_CHECKING:
    from jobwire.ports.cluster import ClusterView
    from jobwire.server.ojs.app import OJSService

DEFAULT_CONCURRENCY = 10
_DIRECTIVES = [WorkerState.RUNNING, WorkerState.QUIET, WorkerState.TERMINATE]


def add_routes(router: web.UrlDispatcher, service: OJSService) -> None:
    routes = WorkerRoutes(service)
    router.add_post(BASE + "/workers/fetch", routes.fetch)
    router.add_post(BASE + "/workers/ack", routes.ack)
    router.add_post(BASE + "/workers/nack", routes.nack)
    router.add_post(BASE + "/workers/heartbeat", routes.heartbeat)
    router.add_post(BASE + "/workers/beat", routes.heartbeat)  # the extensions' name
    router.add_get(BASE + "/workers/{worker_id}/health", routes.health)
    router.add_post(BASE + "/workers/register", routes.register)
    router.add_post(BASE + "/workers/deregister", routes.deregister)
    router.add_get(BASE + "/workers", routes.list_workers)
    # The worker protocol's own paths (the OJS seed's), aliases of the routes above.
    router.add_post(BASE + "/jobs/fetch", routes.fetch)
    router.add_post(BASE + "/jobs/{id}/ack", routes.ack)
    router.add_post(BASE + "/jobs/{id}/nack", routes.nack)


#: Set in a worker's info while an operator holds it quiet (`admin.set_state`).
OPERATOR_QUIET = "operator_quiet"
#: Set in a worker's info once it said it drains (graceful-shutdown extension).
DRAINING = "draining"


def rank(state: Any) -> int:
    """Rank of a worker state; the server only ever moves a worker forward."""
    for position, candidate in enumerate(_DIRECTIVES):
        if state == candidate.value:
            return position
    return 0


def _test_directive(job: Job) -> Any:
    """The conformance suite's hook: `options.metadata.test_directive` names a worker state."""
    options = (job.ext or {}).get("options") or {}
    metadata = options.get("metadata")
    return metadata.get("test_directive") if isinstance(metadata, dict) else None


async def _job_body(request: web.Request) -> dict[str, Any]:
    """An ack or nack body; on `/jobs/{id}/ack|nack` the job id comes from the path (and the
    body may be empty)."""
    path_id = request.match_info.get("id")
    if path_id is None:
        return await read_object(request)
    body = await read_object(request, required=False)
    if body.get("job_id", path_id) != path_id:
        raise invalid("job_id in the body differs from the job in the path")
    body["job_id"] = path_id
    return body


class WorkerRoutes:
    def __init__(self, service: OJSService) -> None:
        self.service = service
        self.engine = service.engine
        service.operations.add("ack", self._ack)
        service.operations.add("nack", self._nack)
        service.operations.add("heartbeat", self._heartbeat)
        # On a cluster, each node lists the workers connected to it for the others.
        service.operations.add("workers.list", self._list_for_another_node, every_node)

    # ------------------------------------------------------------------ registration

    async def register(self, request: web.Request) -> web.Response:
        body = await read_object(request)
        convert(body, Register)  # types and limits (messages.Register)
        worker_id = optional_str(body, "worker_id") or uuid7()
        queues = body.get("queues")
        if queues is not None and (not isinstance(queues, list) or not queues):
            raise invalid("queues must be a non-empty array of queue names")
        names = [check_queue(q) for q in queues] if queues is not None else None
        concurrency = positive_int(body, "concurrency", DEFAULT_CONCURRENCY)
        labels = body.get("labels")
        if labels is not None and (
            not isinstance(labels, list) or not all(isinstance(x, str) for x in labels)
        ):
            raise invalid("labels must be an array of strings")
        hostname = optional_str(body, "hostname")
        pid = body.get("pid")
        if pid is not None and not is_int(pid):
            raise invalid("pid must be an integer")
        session = self.service.worker(worker_id)
        session.capacity = concurrency
        session.queues = frozenset(names) if names is not None else None
        session.info.update(registered=True, hostname=hostname, pid=pid, labels=labels or [])
        self.service.liveness.beat(session)
        options = self.service.options
        return reply(
            {
                "ok": True,
                "worker_id": worker_id,
                "state": session.state.value,
                "server_time": format_time(time.time()),
                "heartbeat_interval": options.heartbeat_interval,
                "heartbeat_timeout": options.heartbeat_timeout,
                "visibility_timeout_default": options.visibility_timeout,
                "worker": worker_json(session),
            }
        )

    async def deregister(self, request: web.Request) -> web.Response:
        body = await read_object(request)
        convert(body, Deregister)  # types and limits (messages.Deregister)
        worker_id = str_field(body, "worker_id")
        session = self.service.workers.get(worker_id)
        if session is None or session.state is WorkerState.TERMINATED:
            raise OJSError("not_found", f"worker {worker_id} is not registered")
        requeued = sorted(session.jobs)
        self.service.liveness.forget(session)
        self.engine.remove_worker(session, "worker deregistered")
        return reply(
            {
                "ok": True,
                "worker_id": worker_id,
                "state": WorkerState.TERMINATED.value,
                "jobs_requeued": requeued,
            }
        )

    async def list_workers(self, request: web.Request) -> web.Response:
        """Every worker the server knows, of every protocol (the engine's registry; OJS
        workers also after they terminated); `?protocol=` keeps one protocol's. On a
        cluster, every node's, each with the `nodes` it is connected to."""
        workers = await every_worker(self.service, request.query.get("protocol") or None)
        return reply({"workers": workers, "count": len(workers)})

    def _list_for_another_node(self, _key: str, arguments: Any) -> web.Response:
        """The operation `workers.list`: this node's workers, for another node."""
        asked = arguments if isinstance(arguments, dict) else {}
        protocol = asked.get("protocol")
        workers = workers_here(self.service, protocol if isinstance(protocol, str) else None)
        return reply({"workers": workers})

    # ------------------------------------------------------------------ fetch

    async def fetch(self, request: web.Request) -> web.Response:
        body = await read_object(request)
        convert(body, Fetch)  # types and limits (messages.Fetch)
        worker_id = optional_str(body, "worker_id")
        session = self.service.worker(worker_id)
        queues = body.get("queues")
        if queues is None:
            queues = sorted(session.queues) if session.queues else ["default"]
        if not isinstance(queues, list) or not queues:
            raise invalid("queues must be a non-empty array of queue names")
        names = [check_queue(q) for q in queues]
        count = body.get("count", 1)
        if not is_int(count) or not 1 <= count <= MAX_FETCH:
            raise invalid(f"count must be an integer in [1, {MAX_FETCH}]")
        lease = positive_int(body, "visibility_timeout_ms")
        if session.state is not WorkerState.RUNNING:
            return reply({"jobs": []})
        seconds = lease / 1000 if lease else None
        jobs = await self._lease(names, count, session, seconds)
        # A cluster node: jobs pushed on other nodes wait in the shared queue; claim what is
        # missing now, so that this fetch (not the next one) gets them.
        claim = self.engine.claim_for_fetch
        if (
            claim is not None
            and len(jobs) < count
            and session.has_room
            and await claim(names, count - len(jobs))
        ):
            jobs += await self._lease(names, count - len(jobs), session, seconds)
        rendered = [job_json(job) for job in jobs]
        out: dict[str, Any] = {"jobs": rendered}
        if rendered:
            out["job"] = rendered[0]
        return reply(out)

    async def _lease(
        self, queues: list[str], count: int, session: WorkerSession, lease: float | None
    ) -> list[Job]:
        """Up to `count` jobs, queues in order, within each queue's rate limit (on a cluster,
        within the budget the nodes share: `jobwire.store.pgrates`)."""
        engine, limits = self.engine, self.service.rate_limits
        keyed = self.service.keyed_limits
        cluster = self.service.runtime.cluster
        now = engine.clock()
        jobs: list[Job] = []
        held: list[Job] = []  # over their key's limit: back to their queues after the fetch
        for name in queues:
            wanted = count - len(jobs)
            if wanted <= 0:
                break
            allowance = limits.allowance(name, now)
            budget = None  # taken from the cluster's budget for this queue
            if allowance is not None:
                wanted = min(wanted, allowance)
                if cluster is not None:
                    wanted = budget = await self._budget(cluster, name, wanted)
                    now = engine.clock()
                    if session.state is not WorkerState.RUNNING:
                        wanted = 0  # it went meanwhile: the budget goes back
            handed = 0
            while wanted > 0 and len(held) < MAX_FETCH:
                got = engine.fetch([name], wanted, worker=session, lease_timeout=lease)
                if not got:
                    break
                taken = [job for job in got if keyed.take(job, now)]
                if cluster is not None:  # and the keys' limits the nodes share
                    taken = await keyed.take_shared(taken)
                    got = [job for job in got if job.state is JobState.ACTIVE]  # not cancelled
                    taken = [job for job in taken if job.state is JobState.ACTIVE]
                held += [job for job in got if job not in taken]
                limits.taken(name, len(taken), now)
                jobs.extend(taken)
                wanted -= len(taken)
                handed += len(taken)
            if cluster is not None and budget is not None and budget > handed:
                cluster.give_back_rate(name, budget - handed)
        for job in reversed(held):
            engine.unlease(job)
        default = self.service.options.visibility_timeout
        for job in jobs:
            if lease is None and job.lease_timeout is None:
                job.lease_timeout = _kept_visibility(job)  # and for its next attempts
            fallback = job.lease_timeout or default
            lease_for = job.lease_deadline - now if job.lease_deadline else fallback
            timeout = (job.ext or {}).get("timeout")
            if timeout:  # an execution timeout also ends the lease
                lease_for = min(lease_for, timeout)
            engine.extend_lease(job, lease_for)
        return jobs

    async def _budget(self, cluster: ClusterView, queue: str, wanted: int) -> int:
        """How many jobs of rate-limited `queue` this node may hand out now: its share of
        the cluster's budget, asked for the jobs it could hand out (none: no round trip)."""
        info = self.engine.queues.get(queue)
        if info is None or info.paused:
            return 0
        wanted = min(wanted, self.service.depth(queue))
        return await cluster.take_rate(queue, wanted) if wanted > 0 else 0

    # ------------------------------------------------------------------ ack / nack

    def _active_job(self, body: dict[str, Any]) -> Job:
        """The job an ack or nack names. With a `worker_id` (the SDK always sends one) the
        job must be leased to that worker: otherwise 409 naming where the job is (another
        worker's lease, back in its queue, finished), never the other worker's id."""
        job = self.service.job(str_field(body, "job_id"))
        worker_id = optional_str(body, "worker_id")
        if worker_id is not None:
            check_holder(self.service, job, worker_id)
        elif job.state is not JobState.ACTIVE:
            raise OJSError(
                "conflict", f"job {job.id} is {job.state.name.lower()}, not active", status=409
            )
        return job

    async def ack(self, request: web.Request) -> web.Response:
        body = await _job_body(request)
        convert(body, Ack)  # types and limits (messages.Ack)
        job_id = str_field(body, "job_id")
        return await self.service.operations.run(request, "ack", job_id, body)

    def _ack(self, _job_id: str, body: dict[str, Any]) -> web.Response:
        job = self._active_job(body)
        result = body.get("result")
        if job.ext is None:
            job.ext = {}
        if result is not None:
            job.ext["result"] = result  # before completing: observers (workflows) read it
        try:
            self.engine.complete(job, orjson.dumps(result) if result is not None else b"")
        except EngineError as exc:
            raise OJSError("conflict", str(exc), status=409) from None
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
        body = await _job_body(request)
        convert(body, Nack)  # types and limits (messages.Nack)
        job_id = str_field(body, "job_id")
        return await self.service.operations.run(request, "nack", job_id, body)

    def _nack(self, _job_id: str, body: dict[str, Any]) -> web.Response:
        job = self._active_job(body)
        error, retryable = self._error(job, body)
        requeue = body.get("requeue", False)
        if not isinstance(requeue, bool):
            raise invalid("requeue must be a boolean")
        ext = job.ext if job.ext is not None else {}
        job.ext = ext
        ext.setdefault("errors", []).append(error)
        # A requeue (a worker releasing the job, e.g. on terminate) goes back at once; a
        # retry waits as the job's retry policy says.
        policy = None if requeue else retry_policy(job)
        delay = policy.delay(job.attempts) if policy is not None else 0.0
        try:
            self.engine.fail(
                job,
                error,
                detail=error["message"].encode(),
                retry=retryable or requeue,
                retry_after=delay,
            )
        except IllegalTransition as exc:
            raise OJSError("conflict", str(exc), status=409) from None
        if policy is not None and not job.state.terminal:
            ext["retry_delay"] = delay
        job.error = error
        return reply(_nack_reply(job))

    def _error(self, job: Job, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """The error entry for the job's history, and whether it may be retried."""
        raw = body.get("error", {})
        if not isinstance(raw, dict):
            raise invalid("error must be an object {code, message, retryable?, details?}")
        code = raw.get("code", "handler_error")
        message = raw.get("message", "")
        kind = raw.get("type")
        if not isinstance(code, str) or not isinstance(message, str):
            raise invalid("error.code and error.message must be strings")
        if kind is not None and not isinstance(kind, str):
            raise invalid("error.type must be a string")
        retryable = raw.get("retryable", True)
        if not isinstance(retryable, bool):
            raise invalid("error.retryable must be a boolean")
        details = raw.get("details")
        error_class = details.get("error_class") if isinstance(details, dict) else None
        if not isinstance(error_class, str):
            error_class = None
        policy = retry_policy(job)
        if policy is not None and (
            policy.is_non_retryable(code) or policy.is_non_retryable(error_class)
        ):
            retryable = False
        error: dict[str, Any] = {
            "type": kind or error_class or classify_error(message),
            "code": code,
            "message": message or code,
            "retryable": retryable,
            "attempt": job.attempts,
            "occurred_at": format_time(time.time()),
        }
        if details is not None:
            error["details"] = details
        return error, retryable

    # ------------------------------------------------------------------ heartbeat

    async def heartbeat(self, request: web.Request) -> web.Response:
        body = await read_object(request)
        convert(body, Heartbeat)  # types and limits (messages.Heartbeat)
        str_field(body, "worker_id")
        ids = _active_ids(body)
        positive_int(body, "visibility_timeout_ms")
        # A heartbeat for jobs another node holds goes to that node (its worker fetched
        # them there); for jobs held here, or none, it stays here.
        elsewhere = [job_id for job_id in ids if not self.service.operations.knows(job_id)]
        if elsewhere and len(elsewhere) == len(ids):
            return await self.service.operations.run(request, "heartbeat", elsewhere[0], body)
        return self._heartbeat("", body)

    def _heartbeat(self, _job_id: str, body: dict[str, Any]) -> web.Response:
        worker_id = str_field(body, "worker_id")
        session = self.service.worker(worker_id)
        ids = _active_ids(body)
        visibility = positive_int(body, "visibility_timeout_ms")
        self.service.liveness.beat(session)
        session.info["active_job_ids"] = ids
        extended = []
        draining = body.get("state") == "drain" or body.get("shutdown") is True
        if draining:
            # Graceful shutdown: the worker finishes what it holds and takes nothing new.
            session.info[DRAINING] = True
        directive = max(rank(body.get("state")), rank("quiet") if draining else 0)
        default = self.service.options.visibility_timeout
        not_held: list[dict[str, str]] = []
        for job_id in ids:
            job = self.engine.jobs.get(job_id)
            if job is not None and job.worker is not None and job.worker is not session:
                # Another worker's lease: not extended (the heartbeat's other jobs are).
                not_held.append({"job_id": job_id, "state": "leased to another worker"})
                continue
            if job is not None and job.state is JobState.ACTIVE:
                timeout = visibility / 1000 if visibility else job.lease_timeout or default
                self.engine.extend_lease(job, timeout)
                extended.append(job_id)
                directive = max(directive, rank(_test_directive(job)))
        if directive > rank(session.state.value):
            self.engine.set_worker_state(session, _DIRECTIVES[directive])
        elif (
            body.get("state") == WorkerState.RUNNING.value
            and session.state is WorkerState.QUIET
            and not session.info.get(OPERATOR_QUIET)
            and directive == 0
        ):
            # The worker resumed itself (its SIGCONT after a SIGTSTP): the seed says the
            # worker adopts the state the server returns, so the server follows it, unless
            # an operator quieted it.
            self.engine.set_worker_state(session, WorkerState.RUNNING)
            session.info[DRAINING] = False
        return reply(
            {
                "acknowledged": True,
                "state": session.state.value,
                "draining": bool(session.info.get(DRAINING)),
                "jobs_extended": extended,
                "jobs_not_held": not_held,
                "server_time": format_time(time.time()),
                "heartbeat_interval_ms": int(self.service.options.heartbeat_interval * 1000),
                "visibility_timeout": int(visibility / 1000 if visibility else default),
            }
        )

    async def health(self, request: web.Request) -> web.Response:
        """A worker's health (graceful-shutdown extension): 503 while it drains or
        terminates, with its state ("draining" once it said so)."""
        worker_id = request.match_info["worker_id"]
        session = self.service.workers.get(worker_id)
        if session is None:
            raise OJSError("not_found", f"no worker {worker_id!r}")
        state = session.state
        draining = bool(session.info.get(DRAINING)) and state is not WorkerState.TERMINATED
        healthy = state is WorkerState.RUNNING and not draining
        body = worker_json(session)
        body["state"] = "draining" if draining else state.value
        body["status"] = "ok" if healthy else ("draining" if draining else "unavailable")
        return reply(body, 200 if healthy else 503)


def _kept_visibility(job: Job) -> float | None:
    """The visibility timeout a job was pushed with, from its options: a job read back from
    its row (claimed from a cluster's shared queue, or replayed at start) has it only there."""
    options = (job.ext or {}).get("options")
    value = options.get("visibility_timeout_ms") if isinstance(options, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value / 1000
    return None


def _active_ids(body: dict[str, Any]) -> list[str]:
    """The ids of the jobs a heartbeat says its worker runs."""
    ids: list[Any] = []
    for name in ("active_jobs", "active_job_ids"):
        value = body.get(name)
        if isinstance(value, list):
            ids.extend(value)
        elif value is not None and not is_int(value):
            raise invalid(f"{name} must be an array of job ids")
    if not all(isinstance(job_id, str) for job_id in ids):
        raise invalid("active job ids must be strings")
    return ids


def _nack_reply(job: Job) -> dict[str, Any]:
    rendered = job_json(job)
    out: dict[str, Any] = {
        "id": job.id,
        "job_id": job.id,
        "state": rendered["state"],
        "attempt": job.attempts,
        "max_attempts": rendered["max_attempts"],
    }
    if job.state is JobState.RETRYABLE and job.run_at is not None:
        out["next_attempt_at"] = format_time(job.run_at)
    if job.state is JobState.AVAILABLE:
        out["next_attempt_at"] = format_time(time.time())
    ext = job.ext or {}
    if ext.get("retry_delay") is not None and not job.state.terminal:
        out["retry_delay_ms"] = int(ext["retry_delay"] * 1000)
    if job.state is JobState.DISCARDED and job.finished_at is not None:
        out["discarded_at"] = out["completed_at"] = format_time(job.finished_at)
    out["job"] = rendered
    return out
