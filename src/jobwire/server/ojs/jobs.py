"""Job routes: PUSH (one, or a batch all-or-nothing), INFO, CANCEL, ACTIVATE."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from jobwire.engine.errors import IllegalTransition
from jobwire.engine.job import JobState
from jobwire.ports.cluster import HolderUnavailable
from jobwire.protocols.ojs.envelope import PushRequest, parse_plain_push, parse_push
from jobwire.protocols.ojs.errors import OJSError, invalid
from jobwire.protocols.ojs.limits import MAX_BATCH
from jobwire.server.ojs.app import Prepared, illegal
from jobwire.server.ojs.batchkeys import BatchKeys
from jobwire.server.ojs.http import (
    BASE,
    committed,
    decode_json,
    plain_json,
    read_body,
    read_object,
    reply,
)
from jobwire.server.ojs.render import job_json
from jobwire.server.ojs.unique import conflicts_with

if TYPE_CHECKING:
    from jobwire.engine.job import Job
    from jobwire.server.ojs.app import OJSService


#: Times a push with `on_conflict: replace` cancels a holder on another node and tries again
#: (another push may take the freed key first).
REPLACE_TRIES = 3


def add_routes(router: web.UrlDispatcher, service: OJSService) -> None:
    routes = JobRoutes(service)
    router.add_post(BASE + "/jobs", routes.push)
    router.add_post(BASE + "/jobs/batch", routes.push_batch)
    router.add_get(BASE + "/jobs/{id}", routes.get)
    router.add_delete(BASE + "/jobs/{id}", routes.cancel)
    router.add_post(BASE + "/jobs/{id}/activate", routes.activate)


class JobRoutes:
    def __init__(self, service: OJSService) -> None:
        self.service = service
        service.operations.add("get", self._get)
        service.operations.add("cancel", self._cancel)
        service.operations.add("activate", self._activate)

    async def push(self, request: web.Request) -> web.Response:
        raw = await read_body(request)
        req = parse_plain_push(raw) if plain_json(raw) else None
        if req is None:
            req = parse_push(decode_json(raw))
        if req.id is None or self.service.runtime.cluster is None:
            return await self._push(req)
        job_id = req.id

        async def push_new(taken: set[str]) -> web.Response:
            if taken:
                raise OJSError("duplicate", f"a job with id {job_id} already exists")
            await self._check_id_elsewhere(job_id)
            return await self._push(req)

        return await self._with_ids([job_id], push_new)

    async def _with_ids(
        self, ids: list[str], push: Callable[[set[str]], Awaitable[web.Response]]
    ) -> web.Response:
        """`push` with client-chosen `ids` held in the whole cluster until it is committed
        (`ClusterView.hold_ids`); it is given those a job has already (its row, or this
        engine's job that ended)."""
        cluster = self.service.runtime.cluster
        assert cluster is not None
        try:
            async with cluster.hold_ids(ids) as taken:
                jobs = self.service.engine.jobs
                return await self._committed(
                    await push(taken | {job_id for job_id in ids if job_id in jobs})
                )
        except HolderUnavailable as exc:
            raise OJSError(
                "backend_error", str(exc), status=503, retryable=True, headers={"Retry-After": "1"}
            ) from None

    async def _committed(self, response: web.Response) -> web.Response:
        """`response` once what it acknowledges is committed: the ids' locks go only then,
        so the next push of one finds the job's row."""
        if response.status < 300 and self.service.runtime.durable_store:
            await committed(self.service.runtime)
        return response

    async def _push(self, req: PushRequest) -> web.Response:
        job, created = self.service.submit(req)
        cluster = self.service.runtime.cluster
        replaced = 0
        while created and cluster is not None and job.state is JobState.PENDING:
            if req.pending:
                break
            holder = await cluster.settled(job)  # held until the cluster settles its key
            if holder is None:
                break
            existing = await self._holder(holder)
            policy = req.unique_policy
            if policy is not None and not conflicts_with(
                policy, existing, self.service.engine.clock()
            ):
                # The holder's state or its lock's period is outside this policy: no conflict.
                # The job is made after all, its key kept on this node only (the index holds
                # one job per key while that job lives).
                job, created = self.service.commit(self.service.prepare(req), share_unique=False)
                break
            if policy is None or policy.on_conflict != "replace" or replaced >= REPLACE_TRIES:
                return await self._coalesced(req, holder, existing)
            # Replace: the holder is cancelled on its node, which frees the key once
            # committed; then the push takes it as a new one.
            await self._cancel_holder(holder)
            replaced += 1
            job, created = self.service.submit(req)
        if not created:  # unique conflict with on_conflict=ignore: the existing job
            return reply({"job": job_json(job), "duplicate": True})
        headers = {"Location": f"{BASE}/jobs/{job.id}"}
        if self.service.backpressure:  # bounds set on some queue
            headers.update(self.service.pressure_headers(job.queue))
        if req.rate_limit is not None or req.keyed_limit is not None:
            headers.update(_rate_limit_headers(req.rate_limit, req.keyed_limit))
        if req.rate_limit is not None:  # a new limit holds on every node once answered
            await self.service.rate_limit_shared(req.queue)
        return reply({"job": job_json(job)}, 201, headers)

    async def _check_id_elsewhere(self, job_id: str) -> None:
        """A job id the client chose must be new in the whole cluster, not only here: a job
        that ended on another node has no row, but that node still knows it (and answers)."""
        try:
            found = await self.service.operations.run_by_id("get", job_id, None, None)
        except OJSError as exc:
            if exc.status == 404:
                return
            raise
        if found.status == 200:
            raise OJSError("duplicate", f"a job with id {job_id} already exists")

    async def _cancel_holder(self, holder: str) -> None:
        with contextlib.suppress(OJSError):  # it ended meanwhile: its key is free as well
            await self.service.operations.run_by_id("cancel", holder, None, None)

    async def _holder(self, holder: str) -> Job | None:
        """The job with id `holder`, on this node or another; None if it finished."""
        existing = self.service.engine.jobs.get(holder)
        cluster = self.service.runtime.cluster
        if existing is None and cluster is not None:
            existing = await cluster.find_job(holder)
        return existing

    async def _coalesced(self, req: PushRequest, holder: str, existing: Job | None) -> web.Response:
        """A job whose unique key a job on another node holds: the push conflicts with
        that job, as with one on this node (`OJSService.prepare`)."""
        policy = req.unique_policy
        key = policy.fingerprint(req.type, req.queue, req.args, req.meta) if policy else None
        if policy is None or policy.on_conflict == "reject":
            raise OJSError(
                "duplicate",
                f"a job with the same unique key exists: {holder}",
                details={"existing_job_id": holder, "unique_key": key},
            )
        if existing is None:  # it finished meanwhile: its id is all there is to tell
            return reply({"job": {"id": holder}, "duplicate": True})
        return reply({"job": job_json(existing), "duplicate": True})

    async def push_batch(self, request: web.Request) -> web.Response:
        """Every job is validated and checked before any is created: all or nothing."""
        body = await read_object(request)
        raw_jobs = body.get("jobs")
        if not isinstance(raw_jobs, list) or not raw_jobs:
            raise invalid("jobs must be a non-empty array of jobs")
        if len(raw_jobs) > MAX_BATCH:
            raise invalid(f"a batch holds at most {MAX_BATCH} jobs")
        plans: list[Prepared] = []
        ids: set[str] = set()
        keys: set[str] = set()
        for index, raw in enumerate(raw_jobs):
            try:
                plan = self.service.prepare(parse_push(raw, f"$.jobs[{index}]"))
                _check_within_batch(plan, ids, keys)
            except OJSError as exc:
                raise OJSError(
                    exc.code,
                    f"jobs[{index}]: {exc.message}; no job of the batch was created",
                    status=exc.status,
                    details={"index": index, **(exc.details or {})},
                ) from None
            plans.append(plan)
        chosen = [plan.req.id for plan in plans if plan.req.id is not None]
        if not chosen or self.service.runtime.cluster is None:
            return await self._push_plans(plans)

        async def push_new(taken: set[str]) -> web.Response:
            for index, plan in enumerate(plans):
                if plan.req.id in taken:
                    raise OJSError(
                        "duplicate",
                        f"jobs[{index}]: a job with id {plan.req.id} already exists;"
                        " no job of the batch was created",
                        details={"index": index},
                    )
            return await self._push_plans(plans)

        return await self._with_ids(chosen, push_new)

    async def _push_plans(self, plans: list[Prepared]) -> web.Response:
        cluster = self.service.runtime.cluster
        shared = BatchKeys(self.service, cluster, plans) if cluster is not None else None
        if shared is not None:
            await shared.check()  # the keys jobs on other nodes hold, before any is made
        created: dict[int, tuple[Job, bool]] = {}
        try:
            for index, plan in enumerate(plans):
                if shared is None or index not in shared.answered:
                    share = shared is not None and shared.shares(index)
                    created[index] = self.service.commit(plan, share_unique=share)
        except OJSError:
            self._undo(list(created.values()))  # so the batch stays all or nothing
            raise
        made = {index: job for index, (job, _) in created.items()}
        if shared is not None:
            new = {index: job for index, (job, is_new) in created.items() if is_new}
            try:
                kept = await shared.settle(new)  # each held until its key is settled
            except OJSError:
                self._undo(list(created.values()))
                raise
            for index in new:
                if index in kept:
                    made[index] = kept[index]
                else:
                    del made[index]  # answered by the job on another node that took its key
        for queue in {plan.req.queue for plan in plans if plan.req.rate_limit is not None}:
            await self.service.rate_limit_shared(queue)
        jobs = [
            shared.answered[index]
            if shared is not None and index in shared.answered
            else job_json(made[index])
            for index in range(len(plans))
        ]
        return reply({"jobs": jobs, "count": len(jobs)}, 201)

    def _undo(self, created: list[tuple[Job, bool]]) -> None:
        """A job of the batch was refused after others were created: drop those."""
        engine = self.service.engine
        for job, is_new in created:
            if is_new and not job.state.terminal and engine.jobs.get(job.id) is job:
                engine.cancel(job)
                engine.forget(job)

    async def get(self, request: web.Request) -> web.Response:
        return await self.service.operations.run(request, "get", request.match_info["id"], None)

    async def cancel(self, request: web.Request) -> web.Response:
        job_id = request.match_info["id"]
        return await self.service.operations.run(request, "cancel", job_id, None)

    async def activate(self, request: web.Request) -> web.Response:
        job_id = request.match_info["id"]
        return await self.service.operations.run(request, "activate", job_id, None)

    # The operations, run on the node that holds the job (`operations.JobOperations`).

    def _get(self, job_id: str, _arguments: Any) -> web.Response:
        return reply({"job": job_json(self.service.job(job_id))})

    def _cancel(self, job_id: str, _arguments: Any) -> web.Response:
        job = self.service.job(job_id)
        try:
            self.service.engine.cancel(job)
        except IllegalTransition as exc:
            raise illegal(exc) from None
        return reply({"job": job_json(job)})

    def _activate(self, job_id: str, _arguments: Any) -> web.Response:
        job = self.service.job(job_id)
        try:
            self.service.engine.activate(job)
        except IllegalTransition as exc:
            raise illegal(exc) from None
        return reply({"job": job_json(job)})


def _rate_limit_headers(per_second: int | None, keyed: dict[str, Any] | None) -> dict[str, str]:
    """The limit a rate-limited job runs under (rate-limiting extension): X-RateLimit-Limit
    (jobs per period, or at once for a concurrency limit) and its policy."""
    if keyed is not None:
        if keyed.get("rate") is not None:
            limit, policy = keyed["rate"], f"{keyed['rate']};period={keyed['period']}"
        else:
            limit, policy = keyed["concurrency"], f"{keyed['concurrency']};concurrency"
        return {"X-RateLimit-Limit": str(limit), "X-RateLimit-Policy": policy}
    if per_second is not None:
        return {"X-RateLimit-Limit": str(per_second), "X-RateLimit-Policy": f"{per_second};w=1"}
    return {}


def _check_within_batch(plan: Prepared, ids: set[str], keys: set[str]) -> None:
    """Two jobs of one batch must not collide with each other either."""
    job_id = plan.req.id
    if job_id is not None:
        if job_id in ids:
            raise OJSError("duplicate", f"the id {job_id} appears twice in the batch")
        ids.add(job_id)
    key = plan.unique_key
    if key is not None and plan.policy is not None and plan.existing is None:
        if key in keys and plan.policy.on_conflict == "reject":
            raise OJSError("duplicate", "two jobs of the batch have the same unique key")
        keys.add(key)


__all__: list[Any] = ["add_routes"]
