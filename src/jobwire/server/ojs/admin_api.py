"""The OJS admin-api extension's routes (`/ojs/v1/admin/...`): aggregate stats, queues with
their counts, workers with a summary, a job's detail, pause and resume, a queue's
backpressure bound, bulk retry of dead-lettered jobs, and the dead letter queue (the
dead-letter extension's paths). Lists are paginated (`?page=`, `?per_page=`).

Counting walks the jobs the engine knows (finished ones while they are retained): these are
an operator's queries, not a hot path.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from aiohttp import web

from jobwire.engine.errors import IllegalTransition, UnknownJob
from jobwire.engine.job import JobState
from jobwire.engine.worker import WorkerState
from jobwire.protocols.ojs.envelope import check_queue
from jobwire.protocols.ojs.errors import OJSError, invalid
from jobwire.protocols.ojs.messages import BulkRetry, QueueConfig, convert
from jobwire.server.ojs.app import illegal
from jobwire.server.ojs.http import BASE, query_int, read_object, reply
from jobwire.server.ojs.operations import every_node
from jobwire.server.ojs.queues import STATES
from jobwire.server.ojs.render import job_json
from jobwire.server.ojs.workerlist import every_worker
from jobwire.server.pauses import set_queue_paused

if TYPE_CHECKING:
    from aiohttp.web_response import Response

    from jobwire.server.ojs.app import OJSService

ADMIN = BASE + "/admin"
#: Seconds the throughput figures look back over.
MINUTE = 60.0


def add_routes(router: web.UrlDispatcher, service: OJSService) -> None:
    routes = AdminRoutes(service)
    router.add_get(ADMIN + "/stats", routes.stats)
    router.add_get(ADMIN + "/queues", routes.queues)
    router.add_post(ADMIN + "/queues/{name}/pause", routes.pause)
    router.add_post(ADMIN + "/queues/{name}/resume", routes.resume)
    router.add_put(ADMIN + "/queues/{name}/config", routes.configure)
    router.add_get(ADMIN + "/queues/{name}/config", routes.config)
    router.add_get(ADMIN + "/workers", routes.workers)
    router.add_post(ADMIN + "/jobs/bulk/retry", routes.bulk_retry)
    router.add_get(ADMIN + "/jobs/{id}", routes.job)
    router.add_get(ADMIN + "/dead-letter", routes.dead_letter)
    router.add_get(ADMIN + "/dead-letter/stats", routes.dead_letter_stats)
    router.add_post(ADMIN + "/dead-letter/{id}/retry", routes.dead_letter_retry)
    router.add_delete(ADMIN + "/dead-letter/{id}", routes.dead_letter_delete)


def _page(request: web.Request, items: list[Any]) -> dict[str, Any]:
    page = query_int(request, "page", 1, low=1, high=10**9)
    per_page = query_int(request, "per_page", 50, low=1, high=1000)
    start = (page - 1) * per_page
    return {
        "items": items[start : start + per_page],
        "pagination": {
            "page": page,
            "per_page": per_page,
            "total": len(items),
            "pages": (len(items) + per_page - 1) // per_page,
        },
    }


class AdminRoutes:
    def __init__(self, service: OJSService) -> None:
        self.service = service
        self.engine = service.engine
        # On a cluster, each node counts its own jobs for the others.
        service.operations.add("admin.counts", self._counts_for_another_node, every_node)

    def _counts(self) -> dict[str, Counter[str]]:
        """Jobs this node holds by queue and state, and the dead-lettered ones by queue."""
        by_queue: dict[str, Counter[str]] = {}
        for job in self.engine.jobs.values():
            counts = by_queue.setdefault(job.queue or "default", Counter())
            counts[job.state.name.lower()] += 1
        for job in self.service.dead_letter.jobs():
            by_queue.setdefault(job.queue or "default", Counter())["dead_letter"] += 1
        return by_queue

    def _finished_lately(self) -> Counter[str]:
        """Jobs this node completed and discarded within the last minute."""
        now = self.engine.clock()
        finished: Counter[str] = Counter()
        for job in self.engine.jobs.values():
            if job.finished_at is not None and job.finished_at >= now - MINUTE:
                if job.state is JobState.COMPLETED:
                    finished["processed"] += 1
                elif job.state is JobState.DISCARDED:
                    finished["failed"] += 1
        return finished

    def _counts_for_another_node(self, _key: str, _arguments: Any) -> Response:
        """The operation `admin.counts`: what `_counts` and `_finished_lately` say here."""
        return reply({"queues": self._counts(), "finished": self._finished_lately()})

    async def _cluster_counts(self) -> tuple[dict[str, Counter[str]], Counter[str]]:
        """`_counts` and `_finished_lately` of the whole cluster: every live node's (each
        counts what it holds, finished jobs while it retains them), and the rows no live
        node holds (the shared queue, a dead node's jobs not yet requeued)."""
        by_queue, finished = self._counts(), self._finished_lately()
        cluster = self.service.runtime.cluster
        if self.service.runtime.remote is None or cluster is None:
            return by_queue, finished
        for theirs in await self.service.operations.from_every_node("admin.counts", "", None):
            for queue, counts in theirs["queues"].items():
                by_queue.setdefault(queue, Counter()).update(counts)
            finished.update(theirs["finished"])
        for queue, states in (await cluster.unheld_by_queue()).items():
            counts = by_queue.setdefault(queue, Counter())
            for state, count in states.items():
                counts[JobState(state).name.lower()] += count
        return by_queue, finished

    async def stats(self, request: web.Request) -> Response:
        """Totals of the whole cluster on one."""
        by_queue, finished = await self._cluster_counts()
        totals: Counter[str] = Counter()
        for counts in by_queue.values():
            totals.update(counts)
        workers = await every_worker(self.service, None)
        live = [w for w in workers if w["state"] != WorkerState.TERMINATED.value]
        return reply(
            {
                "queues": len(set(self.engine.queues) | set(by_queue)),
                "workers": len(live),
                "jobs": {state: totals[state] for state in (*STATES, "dead_letter")},
                "throughput": {
                    "processed_per_minute": finished["processed"],
                    "failed_per_minute": finished["failed"],
                    "window_seconds": int(MINUTE),
                },
            }
        )

    def _queue_json(self, name: str, counts: Counter[str]) -> dict[str, Any]:
        info = self.engine.queues.get(name)
        bound = self.service.backpressure.get(name)
        return {
            "name": name,
            "paused": bool(info is not None and info.paused),
            "depth": self.service.depth(name),
            "counts": {state: counts[state] for state in (*STATES, "dead_letter")},
            "backpressure": _bound_json(bound),
            "rate_limit": self.service.rate_limits.limit(name),
        }

    async def queues(self, request: web.Request) -> Response:
        counts, _ = await self._cluster_counts()
        names = sorted(set(self.engine.queues) | set(counts))
        items = [self._queue_json(name, counts.get(name, Counter())) for name in names]
        return reply(_page(request, items))

    async def pause(self, request: web.Request) -> Response:
        return await self._set_paused(request, True)

    async def resume(self, request: web.Request) -> Response:
        return await self._set_paused(request, False)

    async def _set_paused(self, request: web.Request, paused: bool) -> Response:
        name = check_queue(request.match_info["name"])
        await set_queue_paused(self.service.runtime, name, paused)
        return reply({"queue": name, "paused": paused})

    async def configure(self, request: web.Request) -> Response:
        """A queue's backpressure bound; `{"backpressure": null}` lifts it."""
        name = check_queue(request.match_info["name"])
        config = convert(await read_object(request), QueueConfig)
        bound = config.backpressure
        if bound is None or bound.max_depth is None:
            self.service.backpressure.pop(name, None)
        else:
            self.service.backpressure[name] = bound
        return reply({"queue": name, "backpressure": _bound_json(bound)})

    async def config(self, request: web.Request) -> Response:
        name = check_queue(request.match_info["name"])
        return reply(
            {"queue": name, "backpressure": _bound_json(self.service.backpressure.get(name))}
        )

    async def workers(self, request: web.Request) -> Response:
        """Every worker, of every node on a cluster (each with its `nodes`)."""
        workers = await every_worker(self.service, None)
        body = _page(request, workers)
        body["summary"] = {
            "total": len(workers),
            "by_state": dict(Counter(w["state"] for w in workers)),
            "by_protocol": dict(Counter(w["protocol"] for w in workers)),
        }
        return reply(body)

    async def job(self, request: web.Request) -> Response:
        return reply(job_json(self.service.job(request.match_info["id"])))

    async def bulk_retry(self, request: web.Request) -> Response:
        """Every dead-lettered job the filter matches, back to its queue; `confirm: true`
        is required, so that a mistyped filter retries nothing."""
        bulk = convert(await read_object(request), BulkRetry)
        if not bulk.confirm:
            raise invalid("a bulk retry needs confirm: true")
        wanted = bulk.filter
        retried = []
        for job in self.service.dead_letter.jobs(wanted.queue):
            if wanted.type is not None and job.function != wanted.type:
                continue
            try:
                retried.append(self.service.dead_letter.retry(job.id).id)
            except (UnknownJob, IllegalTransition):
                continue
        return reply({"retried": len(retried), "job_ids": retried})

    async def dead_letter(self, request: web.Request) -> Response:
        queue = request.query.get("queue")
        if queue is not None:
            check_queue(queue)
        jobs = [job_json(job) for job in self.service.dead_letter.jobs(queue)]
        return reply(_page(request, jobs))

    async def dead_letter_stats(self, request: web.Request) -> Response:
        by_queue = Counter(job.queue or "default" for job in self.service.dead_letter.jobs())
        return reply({"total": sum(by_queue.values()), "by_queue": dict(by_queue)})

    async def dead_letter_retry(self, request: web.Request) -> Response:
        try:
            job = self.service.dead_letter.retry(request.match_info["id"])
        except UnknownJob as exc:
            raise OJSError("not_found", str(exc)) from None
        except IllegalTransition as exc:
            raise illegal(exc) from None
        return reply({"job": job_json(job)})

    async def dead_letter_delete(self, request: web.Request) -> web.StreamResponse:
        try:
            self.service.dead_letter.delete(request.match_info["id"])
        except UnknownJob as exc:
            raise OJSError("not_found", str(exc)) from None
        return web.Response(status=204)


def _bound_json(bound: Any) -> dict[str, Any] | None:
    if bound is None or bound.max_depth is None:
        return None
    return {
        "max_depth": bound.max_depth,
        "strategy": bound.strategy,
        "warning_threshold": bound.warning_threshold,
    }
