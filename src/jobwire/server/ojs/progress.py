"""Job progress (the OJS progress extension): `PUT /ojs/v1/jobs/{id}/progress` while the job
runs, `GET` to read it back.

A progress is a fraction of the work done; values outside [0, 1] are clamped (the extension
says so), a value that is not a finite number is refused. It is kept with the job
(`ext["progress"]`), so it is written with the job's next change and read back wherever the
job is.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from jobwire.engine.job import JobState
from jobwire.protocols.ojs.errors import OJSError
from jobwire.protocols.ojs.messages import Progress, convert
from jobwire.protocols.ojs.times import format_time
from jobwire.server.ojs.http import BASE, decode_json, read_body, reply
from jobwire.server.ojs.ownership import check_holder

if TYPE_CHECKING:
    from jobwire.server.ojs.app import OJSService


def add_routes(router: web.UrlDispatcher, service: OJSService) -> None:
    def report_here(job_id: str, raw: str) -> web.Response:
        job = service.job(job_id)
        body = decode_json(raw.encode("utf-8", "surrogateescape"))
        if not isinstance(body, dict):
            raise OJSError("invalid_payload", "request body must be a JSON object")
        update = convert(body, Progress)
        if job.state is not JobState.ACTIVE:
            raise OJSError(
                "conflict",
                f"job {job.id} is {job.state.name.lower()}: progress is reported while it runs",
                status=409,
            )
        if update.worker_id is not None:
            check_holder(service, job, update.worker_id)
        record = {
            "progress": min(1.0, max(0.0, float(update.progress))),
            "message": update.message,
            "updated_at": format_time(time.time()),
        }
        if job.ext is None:
            job.ext = {}
        job.ext["progress"] = record
        return reply(_progress_json(job.id, record))

    def read_here(job_id: str, _arguments: Any) -> web.Response:
        job = service.job(job_id)
        record = (job.ext or {}).get("progress")
        if not isinstance(record, dict):
            record = {"progress": 0.0, "message": None, "updated_at": None}
        return reply(_progress_json(job.id, record))

    async def report(request: web.Request) -> web.Response:
        # The body goes as it came: the job is looked up before the body is read.
        raw = (await read_body(request)).decode("utf-8", "surrogateescape")
        return await service.operations.run(request, "progress", request.match_info["id"], raw)

    async def read(request: web.Request) -> web.Response:
        job_id = request.match_info["id"]
        return await service.operations.run(request, "progress.get", job_id, None)

    service.operations.add("progress", report_here)
    service.operations.add("progress.get", read_here)
    router.add_put(BASE + "/jobs/{id}/progress", report)
    router.add_get(BASE + "/jobs/{id}/progress", read)


def _progress_json(job_id: str, record: dict[str, Any]) -> dict[str, Any]:
    return {"job_id": job_id, **record}
