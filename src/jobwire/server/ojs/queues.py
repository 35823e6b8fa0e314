"""Queue routes: list, per-state stats, pause and resume.

A paused queue still accepts jobs (the conformance suite expects 201) but hands none out to
fetches until it is resumed. Pausing is per OJS queue: Gearman workers, which take jobs by
function, are not held back by it.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from aiohttp import web

from jobwire.engine.engine import QueueInfo
from jobwire.engine.job import JobState
from jobwire.ports.cluster import ClusterView
from jobwire.protocols.ojs.envelope import check_queue
from jobwire.protocols.ojs.errors import OJSError
from jobwire.server.ojs.http import BASE, reply
from jobwire.server.ojs.operations import every_node
from jobwire.server.pauses import set_queue_paused

if TYPE_CHECKING:
    from jobwire.server.ojs.app import OJSService

STATES = (
    "scheduled",
    "pending",
    "available",
    "active",
    "retryable",
    "completed",
    "cancelled",
    "discarded",
)


def add_routes(router: web.UrlDispatcher, service: OJSService) -> None:
    routes = QueueRoutes(service)
    router.add_get(BASE + "/queues", routes.list_queues)
    router.add_get(BASE + "/queues/{name}/stats", routes.stats)
    router.add_post(BASE + "/queues/{name}/pause", routes.pause)
    router.add_post(BASE + "/queues/{name}/resume", routes.resume)
    router.add_get(BASE + "/rate-limits/{key}", routes.rate_limit)


class QueueRoutes:
    def __init__(self, service: OJSService) -> None:
        self.service = service
        self.engine = service.engine
        # On a cluster, each node counts what it holds of a queue for the others.
        service.operations.add("queue.counts", self._counts_for_another_node, every_node)

    def _queue(self, request: web.Request) -> QueueInfo:
        return self.engine.queue(check_queue(request.match_info["name"]))

    def _summary(self, info: QueueInfo) -> dict[str, Any]:
        return {
            "name": info.name,
            "status": "paused" if info.paused else "active",
            "paused": info.paused,
            "available": info.available,
            "rate_limit": self.service.rate_limits.limit(info.name),
        }

    async def list_queues(self, request: web.Request) -> web.Response:
        queues = [self._summary(info) for info in self.engine.queues.values()]
        cluster = self.service.runtime.cluster
        if cluster is not None:  # and the jobs of the cluster's other nodes, and nobody's
            await self._add_elsewhere(cluster, queues)
        return reply({"queues": queues, "count": len(queues)})

    async def _add_elsewhere(self, cluster: ClusterView, queues: list[dict[str, Any]]) -> None:
        by_name = {queue["name"]: queue for queue in queues}
        for (_function, name), (jobs, running) in (await cluster.elsewhere()).items():
            queue = by_name.get(name)
            if queue is None:
                queue = by_name[name] = self._summary(QueueInfo(name))
                queues.append(queue)
            queue["available"] += jobs - running

    async def stats(self, request: web.Request) -> web.Response:
        """Jobs of the queue by state; finished ones while they are retained. On a cluster,
        the other nodes count what they hold (finished jobs are known to the node that ran
        them), and the rows no live node holds are counted from the store.

        Counting walks the jobs the engine knows: an operator's query, not a hot path.
        """
        info = self._queue(request)
        counts = self._counts_here(info.name)
        available = info.available
        dead = len(self.service.dead_letter.jobs(info.name))
        remote, cluster = self.service.runtime.remote, self.service.runtime.cluster
        if remote is not None and cluster is not None:
            for theirs in await self.service.operations.from_every_node(
                "queue.counts", info.name, None
            ):
                counts.update(theirs["counts"])
                available += theirs["available"]
                dead += theirs["dead_letter"]
            for state, count in (await cluster.unheld_states(info.name)).items():
                counts[JobState(state).name.lower()] += count
                if state == JobState.AVAILABLE:
                    available += count
        out = self._summary(info)
        out.update({state: counts[state] for state in STATES})
        out["available"] = available
        out["dead_letter"] = dead
        out["queue"] = info.name
        out["depth"] = self.service.depth(info.name)  # backpressure extension
        bound = self.service.backpressure.get(info.name)
        out["max_depth"] = bound.max_depth if bound is not None else None
        out["total"] = sum(counts.values())
        return reply({"queue": out, "stats": out})

    def _counts_here(self, queue: str) -> Counter[str]:
        counts: Counter[str] = Counter()
        for job in self.engine.jobs.values():
            if job.queue == queue:
                counts[job.state.name.lower()] += 1
        return counts

    def _counts_for_another_node(self, queue: str, _arguments: Any) -> web.Response:
        """The operation `queue.counts`: what this node holds of `queue`."""
        info = self.engine.queues.get(queue)
        return reply(
            {
                "counts": self._counts_here(queue),
                "available": info.available if info is not None else 0,
                "dead_letter": len(self.service.dead_letter.jobs(queue)),
            }
        )

    async def rate_limit(self, request: web.Request) -> web.Response:
        """A rate-limit partition (rate-limiting extension): its limits and what it holds."""
        key = request.match_info["key"]
        part = self.service.keyed_limits.partition(key)
        if part is None:
            raise OJSError("not_found", f"no rate limit with key {key!r}")
        return reply(part.as_json(self.engine.clock()))

    async def pause(self, request: web.Request) -> web.Response:
        info = self._queue(request)
        await set_queue_paused(self.service.runtime, info.name, True)
        return reply({"queue": self._summary(info)})

    async def resume(self, request: web.Request) -> web.Response:
        info = self._queue(request)
        await set_queue_paused(self.service.runtime, info.name, False)
        return reply({"queue": self._summary(info)})
