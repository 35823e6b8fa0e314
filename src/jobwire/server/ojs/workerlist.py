"""The workers a server knows, as OJS lists them (`GET /ojs/v1/workers`, the admin API and
the dashboard): this node's sessions of every protocol, and on a cluster every node's, one
entry per worker (the operation `workers.list`, served by `workers.WorkerRoutes`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jobwire.protocols.ojs.times import format_time

if TYPE_CHECKING:
    from jobwire.engine.worker import WorkerSession
    from jobwire.server.ojs.app import OJSService


def workers_here(service: OJSService, protocol: str | None) -> list[dict[str, Any]]:
    """This node's workers (OJS ones also after they terminated); on a cluster each with
    this node's id in its `nodes`."""
    sessions = list(service.workers.values())
    sessions += [s for s in service.engine.workers.values() if s.protocol != "ojs"]
    if protocol:
        sessions = [s for s in sessions if s.protocol == protocol]
    workers = [worker_json(s) for s in sessions]
    remote = service.runtime.remote
    if remote is not None:
        for row in workers:
            row["nodes"] = [remote.node]
    return workers


async def every_worker(service: OJSService, protocol: str | None) -> list[dict[str, Any]]:
    """The workers of every node of the cluster (of this node alone without one)."""
    workers = workers_here(service, protocol)
    if service.runtime.remote is None:
        return workers
    for theirs in await service.operations.from_every_node(
        "workers.list", "", {"protocol": protocol}
    ):
        workers.extend(theirs["workers"])
    return merge_sessions(workers)


def worker_json(session: WorkerSession) -> dict[str, Any]:
    info = session.info
    return {
        # An OJS worker is known by the id it chose; the others by their session id.
        "worker_id": session.name if session.protocol == "ojs" else session.id,
        "protocol": session.protocol,
        "name": session.name,
        "abilities": sorted(session.abilities),
        "state": session.state.value,
        "hostname": info.get("hostname"),
        "pid": info.get("pid"),
        "queues": sorted(session.queues) if session.queues is not None else None,
        "concurrency": session.capacity,
        "labels": info.get("labels") or [],
        "registered": bool(info.get("registered")),
        "active_jobs": sorted(session.jobs),
        "last_heartbeat_at": format_time(session.last_seen) if session.last_seen else None,
    }


def merge_sessions(workers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per worker. An OJS worker chooses its id and may fetch, ack and beat on
    several nodes, each of which keeps a session for it: those become one, holding every
    node's jobs, with its latest heartbeat and the state that node gave it. Other protocols'
    sessions are connections, one node's each (their ids are that node's)."""
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in workers:
        key = (
            ("ojs", row["worker_id"])
            if row["protocol"] == "ojs"
            else (
                row["nodes"][0],
                row["worker_id"],
            )
        )
        seen = merged.get(key)
        if seen is None:
            merged[key] = row
            continue
        seen["nodes"] = sorted({*seen["nodes"], *row["nodes"]})
        seen["active_jobs"] = sorted({*seen["active_jobs"], *row["active_jobs"]})
        seen["registered"] = seen["registered"] or row["registered"]
        if (row["last_heartbeat_at"] or "") > (seen["last_heartbeat_at"] or ""):
            seen["last_heartbeat_at"] = row["last_heartbeat_at"]
            seen["state"] = row["state"]  # what the node it beat on last told it
        for field in ("hostname", "pid", "queues", "concurrency"):
            if seen[field] is None:
                seen[field] = row[field]
    return list(merged.values())
