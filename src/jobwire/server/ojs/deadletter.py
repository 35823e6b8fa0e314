"""Dead letter routes: list, retry (back to its queue, attempts from zero), delete.

On a cluster each node keeps the dead letters of the jobs that failed there: a list gathers
every node's (oldest first, by when each job was discarded), and a retry or a delete runs on
the node that keeps the entry (`JobOperations`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from jobwire.engine.errors import IllegalTransition, UnknownJob
from jobwire.protocols.ojs.envelope import check_queue
from jobwire.protocols.ojs.errors import OJSError
from jobwire.server.ojs.app import illegal
from jobwire.server.ojs.http import BASE, query_int, reply
from jobwire.server.ojs.operations import every_node
from jobwire.server.ojs.render import job_json

if TYPE_CHECKING:
    from jobwire.server.ojs.app import OJSService


def add_routes(router: web.UrlDispatcher, service: OJSService) -> None:
    routes = DeadLetterRoutes(service)
    router.add_get(BASE + "/dead-letter", routes.list_jobs)
    router.add_post(BASE + "/dead-letter/{id}/retry", routes.retry)
    router.add_delete(BASE + "/dead-letter/{id}", routes.delete)


class DeadLetterRoutes:
    def __init__(self, service: OJSService) -> None:
        self.service = service
        operations = service.operations
        operations.add("dead_letter.list", self._list_for_another_node, every_node)
        operations.add("dead_letter.retry", self._retry)
        operations.add("dead_letter.delete", self._delete)

    async def list_jobs(self, request: web.Request) -> web.Response:
        queue = request.query.get("queue")
        if queue is not None:
            check_queue(queue)
        limit = query_int(request, "limit", 100, low=1, high=10_000)
        offset = query_int(request, "offset", 0, low=0, high=10**9)
        here = self.service.dead_letter.jobs(queue)
        jobs = [job_json(job) for job in here[: offset + limit]]
        total = len(here)
        if self.service.runtime.remote is not None:
            asked = {"first": offset + limit}
            theirs = await self.service.operations.from_every_node(
                "dead_letter.list", queue or "", asked
            )
            for part in theirs:
                jobs.extend(part["jobs"])
                total += part["total"]
            jobs = _oldest_first(jobs)
        page = jobs[offset : offset + limit]
        return reply({"jobs": page, "count": len(page), "total": total})

    def _list_for_another_node(self, queue: str, arguments: Any) -> web.Response:
        """The operation `dead_letter.list`: the first entries this node keeps (of a queue)."""
        first = arguments.get("first", 100) if isinstance(arguments, dict) else 100
        jobs = self.service.dead_letter.jobs(queue or None)
        return reply({"jobs": [job_json(job) for job in jobs[: int(first)]], "total": len(jobs)})

    async def retry(self, request: web.Request) -> web.Response:
        job_id = request.match_info["id"]
        return await self.service.operations.run(request, "dead_letter.retry", job_id, None)

    async def delete(self, request: web.Request) -> web.Response:
        job_id = request.match_info["id"]
        return await self.service.operations.run(request, "dead_letter.delete", job_id, None)

    def _retry(self, job_id: str, _arguments: Any) -> web.Response:
        try:
            job = self.service.dead_letter.retry(job_id)
        except UnknownJob as exc:
            raise OJSError("not_found", str(exc)) from None
        except IllegalTransition as exc:
            raise illegal(exc) from None
        return reply({"job": job_json(job)})

    def _delete(self, job_id: str, _arguments: Any) -> web.Response:
        try:
            self.service.dead_letter.delete(job_id)
        except UnknownJob as exc:
            raise OJSError("not_found", str(exc)) from None
        return reply({"deleted": True, "job_id": job_id})


def _oldest_first(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Entries of several nodes in one list, each once, by when their jobs were discarded."""
    unique = {job["id"]: job for job in jobs}
    return sorted(unique.values(), key=lambda job: (job.get("discarded_at") or "", job["id"]))
