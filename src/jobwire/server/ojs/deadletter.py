"""Dead letter routes: list, retry (back to its queue, attempts from zero), delete."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from jobwire.engine.errors import IllegalTransition, UnknownJob
from jobwire.protocols.ojs.envelope import check_queue
from jobwire.protocols.ojs.errors import OJSError
from jobwire.server.ojs.app import illegal
from jobwire.server.ojs.http import BASE, query_int, reply
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

    async def list_jobs(self, request: web.Request) -> web.Response:
        queue = request.query.get("queue")
        if queue is not None:
            check_queue(queue)
        limit = query_int(request, "limit", 100, low=1, high=10_000)
        offset = query_int(request, "offset", 0, low=0, high=10**9)
        jobs = self.service.dead_letter.jobs(queue)
        page = [job_json(job) for job in jobs[offset : offset + limit]]
        return reply({"jobs": page, "count": len(page), "total": len(jobs)})

    async def retry(self, request: web.Request) -> web.Response:
        job_id = request.match_info["id"]
        try:
            job = self.service.dead_letter.retry(job_id)
        except UnknownJob as exc:
            raise OJSError("not_found", str(exc)) from None
        except IllegalTransition as exc:
            raise illegal(exc) from None
        return reply({"job": job_json(job)})

    async def delete(self, request: web.Request) -> web.Response:
        job_id = request.match_info["id"]
        try:
            self.service.dead_letter.delete(job_id)
        except UnknownJob as exc:
            raise OJSError("not_found", str(exc)) from None
        return reply({"deleted": True, "job_id": job_id})
