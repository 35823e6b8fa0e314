"""Operator routes: a worker's lifecycle state, and the test runners' reset.

`POST /ojs/v1/admin/workers/{worker_id}/state {"state": "quiet" | "terminate" | "running"}`
sets what the worker's next heartbeat reply tells it (and a quiet or terminating worker's
fetches get no jobs); `jobwire worker-state ID STATE` calls it. A terminated worker cannot be
brought back; `running` undoes only `quiet`. A Rota worker (`rota:N`) is directed over its
`/work` socket (`_other_protocol`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from jobwire.engine.worker import WorkerState
from jobwire.protocols.ojs.errors import OJSError, invalid
from jobwire.server.ojs.http import BASE, read_object, reply
from jobwire.server.ojs.workerlist import worker_json
from jobwire.server.ojs.workers import OPERATOR_QUIET

if TYPE_CHECKING:
    from jobwire.server.ojs.app import OJSService

OPERATOR_STATES = ("running", "quiet", "terminate")


def direct_worker(
    service: OJSService, app: web.Application, worker_id: str, state: str
) -> dict[str, Any]:
    """Set a worker's operator state (`running`, `quiet`, `terminate`), whatever its
    protocol: the admin route and the dashboard both call this. Raises OJSError."""
    if state not in OPERATOR_STATES:
        raise invalid(f"state must be one of {', '.join(OPERATOR_STATES)}")
    other = _other_protocol(app, worker_id, state) or _direct_engine_worker(
        service, worker_id, state
    )
    if other is not None:
        return other
    return _direct_ojs_session(service, worker_id, state)


def _direct_ojs_session(service: OJSService, worker_id: str, state: str) -> dict[str, Any]:
    if state not in OPERATOR_STATES:
        raise invalid(f"state must be one of {', '.join(OPERATOR_STATES)}")
    session = service.workers.get(worker_id)
    if session is None or session.state is WorkerState.TERMINATED:
        raise OJSError("not_found", f"no live worker {worker_id!r}")
    if session.state is WorkerState.TERMINATE and state != "terminate":
        raise OJSError("conflict", "a terminating worker cannot be resumed", status=409)
    session.info[OPERATOR_QUIET] = state == "quiet"
    service.engine.set_worker_state(session, WorkerState(state))
    return worker_json(session)


async def direct_everywhere(
    service: OJSService, app: web.Application, worker_id: str, state: str
) -> dict[str, Any]:
    """`direct_worker`, and on a cluster for an OJS worker also on every other node that
    keeps a session of it (a worker may fetch, ack and beat on several nodes; each keeps
    its own session, and its next heartbeat on any of them must carry the directive). The
    other protocols' workers are connections to one node, named by that node: this one's.
    Raises OJSError: 404 when no node knows the worker."""
    try:
        here: dict[str, Any] | None = direct_worker(service, app, worker_id, state)
    except OJSError as exc:
        if exc.status != 404 or service.runtime.remote is None:
            raise
        here = None
    if service.runtime.remote is None or (here is not None and here["protocol"] != "ojs"):
        assert here is not None
        return here
    directed = [here] if here is not None else []
    for answer in await service.operations.from_every_node(
        "worker.direct", worker_id, {"state": state}
    ):
        error = answer.get("error")
        if error is None:
            directed.append(answer["worker"])
        elif error.get("code") != "not_found":  # not its session any more: none to direct
            raise OJSError(error.get("code", "conflict"), error.get("message", ""), status=409)
    if not directed:
        raise OJSError("not_found", f"no live worker {worker_id!r}")
    return directed[0]


def _direct_for_another_node(service: OJSService) -> Any:
    """The operation `worker.direct`: this node's session of an OJS worker, directed."""

    def direct(worker_id: str, arguments: Any) -> web.Response:
        state = arguments.get("state", "") if isinstance(arguments, dict) else ""
        return reply({"worker": _direct_ojs_session(service, worker_id, str(state))})

    return direct


def _has_session(service: OJSService) -> Any:
    def has(worker_id: str) -> bool:
        session = service.workers.get(worker_id)
        return session is not None and session.state is not WorkerState.TERMINATED

    return has


def add_routes(router: web.UrlDispatcher, service: OJSService) -> None:
    service.operations.add(
        "worker.direct", _direct_for_another_node(service), _has_session(service)
    )

    async def set_state(request: web.Request) -> web.Response:
        body = await read_object(request)
        worker_id, state = request.match_info["worker_id"], body.get("state", "")
        return reply({"worker": await direct_everywhere(service, request.app, worker_id, state)})

    async def reset(request: web.Request) -> web.Response:
        service.reset()
        cluster = service.runtime.cluster
        if cluster is not None:  # the queues' rate limits hold on every node: lift them all
            await cluster.forget_rate_limits()
        return reply({"ok": True})

    router.add_post(BASE + "/admin/workers/{worker_id}/state", set_state)
    if service.options.allow_reset:
        router.add_post(BASE + "/admin/reset", reset)


def _other_protocol(app: web.Application, worker_id: str, state: str) -> dict[str, Any] | None:
    """A live worker of another protocol on this HTTP server, directed by its own service:
    `rota:N` by the Rota service. None: not one of theirs (an OJS worker, or nobody)."""
    if worker_id.startswith("rota:"):
        from jobwire.server.rota import ROTA_SERVICE

        rota = app.get(ROTA_SERVICE)
        if rota is not None:
            return rota.direct(worker_id, state)
    return None


def _direct_engine_worker(service: OJSService, worker_id: str, state: str) -> dict[str, Any] | None:
    """A worker of a protocol without lifecycle messages (Gearman `gearman:N`, Majordomo
    `mdp:…`, Pirate `ppp:…`, WMP), as `GET /ojs/v1/workers` lists it, is directed server-side:
    quiet and terminate give it no job and no wake-up, running resumes; a Gearman worker's
    connection also closes once the jobs it holds are done (`terminate_when_idle`)."""
    session = service.engine.workers.get(worker_id)
    if session is None or session.protocol in ("ojs", "rota"):
        return None
    if session.state is WorkerState.TERMINATE and state != "terminate":
        raise OJSError("conflict", "a terminating worker cannot be resumed", status=409)
    service.engine.set_worker_state(session, WorkerState(state))
    finish = getattr(session.handler, "terminate_when_idle", None)
    if state == "terminate" and finish is not None:
        finish()
    return worker_json(session)
