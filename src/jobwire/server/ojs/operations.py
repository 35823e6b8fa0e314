"""OJS operations on one job, wherever in the cluster the job is.

The job routes (ack, nack, cancel, activate, progress, heartbeat, reads) parse and check
their request, then call `JobOperations.run` with the operation's name, the job's id and
what the operation needs of the request (JSON). A job this node's engine knows, or any job
without a cluster (memory and SQLite stores): the operation runs here at once. Workflows'
operations (`workflows.py`) go the same way, by the workflow's id: the node that made a
workflow keeps it and runs them. Otherwise the
runtime's `RemoteJobs` port has the node holding the job run it (`serve` runs it here for
the others), and its reply is this node's: the same status, body and headers. A job no live
node holds is answered from its row (a cancel or an activation takes it into this engine
first, and runs here).
"""

from __future__ import annotations

import contextlib
import inspect
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from jobwire.engine.errors import StoreUnavailable
from jobwire.engine.job import Job
from jobwire.ports.cluster import HolderAnswer, HolderUnavailable
from jobwire.protocols.ojs.errors import OJSError
from jobwire.protocols.ojs.ids import uuid7
from jobwire.server.ojs.http import CONTENT_TYPE, REQUEST_ID, committed, error_reply, reply
from jobwire.server.ojs.render import job_json

if TYPE_CHECKING:
    from jobwire.server.ojs.app import OJSService

#: An operation: (job id, its arguments) -> the reply (or a coroutine of it, for one that
#: must wait on other nodes); raises OJSError to refuse.
Operation = Callable[[str, Any], web.Response | Awaitable[web.Response]]
#: Whether this node holds the thing an operation names (by default: a job, `knows`).
Holds = Callable[[str], bool]

#: Operations that change the job: on a job in the shared queue, this node takes it first.
_TAKING = frozenset({"cancel", "activate"})
#: Operations that change nothing: their replies do not wait for a commit.
_READS = frozenset(
    {
        "get",
        "progress.get",
        "workflow.get",
        "queue.counts",
        "dead_letter.list",
        "events.query",
        "admin.counts",
        "dashboard.jobs",
    }
)
#: Operations a job must be running for: refused for a job no live node holds.
_WHILE_RUNNING = frozenset({"ack", "nack", "progress"})
#: Headers of a reply that its transport sets, not the operation.
_TRANSPORT_HEADERS = frozenset({"content-type", "content-length"})


class JobOperations:
    """The operations by name, and the one place that decides where each runs."""

    def __init__(self, service: OJSService) -> None:
        self.service = service
        self.table: dict[str, Operation] = {}
        self._holds: dict[str, Holds] = {}
        remote = service.runtime.remote
        if remote is not None:
            remote.serve(self._for_another_node)

    def add(self, name: str, operation: Operation, holds: Holds | None = None) -> None:
        """`holds`: for an operation on something other than a job (a workflow)."""
        self.table[name] = operation
        if holds is not None:
            self._holds[name] = holds

    def _held_here(self, name: str, key: str) -> bool:
        holds = self._holds.get(name)
        return holds(key) if holds is not None else self.knows(key)

    def knows(self, job_id: str) -> bool:
        """This node holds the job (or keeps it among its dead letters)."""
        service = self.service
        return job_id in service.engine.jobs or service.dead_letter.get(job_id) is not None

    async def run(
        self, request: web.Request, name: str, job_id: str, arguments: Any
    ) -> web.Response:
        return await self.run_by_id(name, job_id, arguments, request.get(REQUEST_ID))

    async def from_every_node(self, name: str, key: str, arguments: Any) -> list[Any]:
        """Every other live node's answer to the operation (a part of its own, to add to
        this node's): their bodies, decoded; none without a cluster. 503 when a node does
        not answer in time."""
        remote = self.service.runtime.remote
        if remote is None:
            return []
        try:
            answers = await remote.from_every_node(name, key, {"arguments": arguments})
        except HolderUnavailable as exc:
            raise OJSError(
                "backend_error", str(exc), status=503, retryable=True, headers={"Retry-After": "1"}
            ) from None
        return [json.loads(answer.body) for answer in answers]

    async def run_by_id(
        self, name: str, job_id: str, arguments: Any, request_id: str | None
    ) -> web.Response:
        """`run` for a caller without a request of its own (a workflow cancelling its jobs)."""
        operation = self.table[name]
        remote = self.service.runtime.remote
        if remote is None or self._held_here(name, job_id):
            return await _answer(operation(job_id, arguments))
        asked = {"arguments": arguments, "request_id": request_id}
        try:
            where = await remote.at_holder(name, job_id, asked, adopt=name in _TAKING)
        except HolderUnavailable as exc:
            raise OJSError(
                "backend_error", str(exc), status=503, retryable=True, headers={"Retry-After": "1"}
            ) from None
        if where is None:  # known nowhere else (404 here), or taken into this engine now
            return await _answer(operation(job_id, arguments))
        if isinstance(where, HolderAnswer):
            return web.Response(
                body=where.body,
                status=where.status,
                content_type=CONTENT_TYPE,
                headers=where.headers,
            )
        return await self._unheld(name, where, job_id, arguments)

    async def _unheld(self, name: str, job: Job, job_id: str, arguments: Any) -> web.Response:
        """A job that no live node holds (waiting in the shared queue, or its node died and
        it waits to run again), answered from its row."""
        if name == "get":
            return reply({"job": job_json(job)})
        if name == "progress.get":
            record = (job.ext or {}).get("progress")
            return reply({"job_id": job.id, **(record or _NO_PROGRESS)})
        if name in _WHILE_RUNNING:
            state = job.state.name.lower()
            worker_id = arguments.get("worker_id") if isinstance(arguments, dict) else None
            if name == "progress":
                why = f"job {job.id} is {state}: progress is reported while it runs"
            elif isinstance(worker_id, str):
                why = f"job {job.id} is {state}, not held by worker {worker_id}"
            else:
                why = f"job {job.id} is {state}, not active"
            raise OJSError("conflict", why, status=409)
        # A heartbeat: as for a job not held here.
        return await _answer(self.table[name](job_id, arguments))

    async def _for_another_node(
        self, name: str, job_id: str, asked: dict[str, Any]
    ) -> HolderAnswer | None:
        """Run an operation another node was asked for, on a job this node holds, as if it
        had been asked here: its reply, once what it changed is durable. None: this node
        does not know the job (it moved on, or the asking node asked every node)."""
        operation = self.table.get(name)
        if operation is None:
            return None
        if not self._held_here(name, job_id):
            # It may have just let the job go (to the shared queue, or ended it): answer once
            # that is committed, so the asking node's next look at the row finds it moved.
            with contextlib.suppress(StoreUnavailable):
                await self.service.runtime.durable()
            return None
        request_id = asked.get("request_id") or f"req_{uuid7()}"
        try:
            response = await _answer(operation(job_id, asked.get("arguments")))
            if name not in _READS:
                await committed(self.service.runtime)
                await self.service.workflows.reported()
        except Exception as exc:
            response = error_reply(exc, request_id, f"{name} of job {job_id} for another node")
        headers = {
            key: value
            for key, value in response.headers.items()
            if key.lower() not in _TRANSPORT_HEADERS
        }
        body = response.body
        assert isinstance(body, bytes)
        return HolderAnswer(response.status, body, headers)


def every_node(_key: str) -> bool:
    """`Holds` of an operation every node answers for its own part of (a queue's counts)."""
    return True


async def _answer(reply: web.Response | Awaitable[web.Response]) -> web.Response:
    return await reply if inspect.isawaitable(reply) else reply


_NO_PROGRESS: dict[str, Any] = {"progress": 0.0, "message": None, "updated_at": None}
