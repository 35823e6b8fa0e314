"""`GET /ojs/v1/events?types=&queues=&limit=&after=`: the event log as OJS event envelopes.

Without `after`, the newest `limit` matching events; with it (a `sequence` from an earlier
reply), the ones that followed, oldest first, so a poller can page forward without loss
(as long as it keeps up with the log's capacity).

On a cluster each node keeps the events of what happened on it, and a request to any node
gathers every node's (the operation `events.query`, through `JobOperations`). A node's own
sequence numbers mean nothing to the others, so there an event's `sequence` is its time in
microseconds since the epoch (its `id` names its node too), `after` is such a time, and the
events are merged in time order: a poller pages forward as on one node, provided the
nodes' clocks agree (an event stamped by a lagging clock after the cursor passed its time
is not seen). The events of a node that is not alive (gone, or its lease ran out) are read
from its snapshots in the store (`eventkeeper`): all but the last `SAVE_EVERY` seconds of
them, until a starting node adopts them.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from jobwire.engine.events import Event, EventLog
from jobwire.protocols.ojs.envelope import SPEC_VERSION
from jobwire.protocols.ojs.errors import OJSError
from jobwire.protocols.ojs.times import format_time
from jobwire.server.ojs.eventkeeper import NAMESPACE, decode_chunks
from jobwire.server.ojs.http import BASE, query_int, query_list, reply
from jobwire.server.ojs.operations import every_node

if TYPE_CHECKING:
    from jobwire.ports.cluster import RemoteJobs
    from jobwire.server.ojs.app import OJSService

SOURCE = "ojs://jobwire/engine"


def add_routes(router: web.UrlDispatcher, service: OJSService) -> None:
    async def list_events(request: web.Request) -> web.Response:
        types = query_list(request, "types")
        queues = query_list(request, "queues")
        after = query_int(request, "after", 0, low=0, high=2**62)
        limit = query_int(request, "limit", 100, low=1, high=10_000)
        remote = service.runtime.remote
        if remote is not None:
            return await _list_cluster_events(service, remote, types, queues, after, limit)
        events = service.events.query(
            types=set(types), queues=set(queues), after=after, limit=limit
        )
        rendered = [envelope(e) for e in events]
        last = events[-1].seq if events else None
        return reply({"events": rendered, "count": len(rendered), "next_after": last})

    def query_here(_key: str, arguments: Any) -> web.Response:
        """The operation `events.query`: this node's matching events, for another node."""
        asked = arguments if isinstance(arguments, dict) else {}
        remote = service.runtime.remote
        assert remote is not None
        events = _node_events(
            service.events,
            remote.node,
            asked.get("types") or [],
            asked.get("queues") or [],
            int(asked.get("after") or 0),
            int(asked.get("limit") or 100),
        )
        return reply({"events": events})

    service.operations.add("events.query", query_here, every_node)
    router.add_get(BASE + "/events", list_events)


async def _list_cluster_events(
    service: OJSService,
    remote: RemoteJobs,
    types: list[str],
    queues: list[str],
    after: int,
    limit: int,
) -> web.Response:
    events = _node_events(service.events, remote.node, types, queues, after, limit)
    asked = {"types": types, "queues": queues, "after": after, "limit": limit}
    for theirs in await service.operations.from_every_node("events.query", "", asked):
        events.extend(theirs["events"])
    cluster = service.runtime.cluster
    if cluster is not None:
        try:
            gone = await cluster.gone_records(NAMESPACE)
        except Exception as exc:
            raise OJSError(
                "backend_error",
                f"the events of nodes gone cannot be read: {exc}",
                status=503,
                retryable=True,
                headers={"Retry-After": "1"},
            ) from None
        for node, records in gone.items():
            held, _ = decode_chunks(records)
            kept = EventLog(len(held), clock=time.time)
            kept.restore(held)
            events.extend(_node_events(kept, node, types, queues, after, limit))
    # A node whose lease ran out between the two looks: its events both ways, once each.
    events = list({event["id"]: event for event in events}.values())
    events.sort(key=lambda event: (event["sequence"], event["id"]))
    events = events[:limit] if after else events[-limit:]
    last = events[-1]["sequence"] if events else None
    return reply({"events": events, "count": len(events), "next_after": last})


def _node_events(
    log: EventLog, node: int, types: list[str], queues: list[str], after: int, limit: int
) -> list[dict[str, Any]]:
    """A node's matching events as a cluster shows them (sequence: microseconds), oldest
    first: those after the time `after` if given (at most `limit`), else the newest `limit`."""
    matching = log.query(types=set(types), queues=set(queues), limit=max(len(log), 1))
    picked = [event for event in matching if _micros(event) > after] if after else matching
    picked = picked[:limit] if after else picked[-limit:]
    out = []
    for event in picked:
        rendered = envelope(event)
        rendered["sequence"] = _micros(event)
        rendered["id"] = f"evt_{node}_{event.seq}"
        out.append(rendered)
    return out


def _micros(event: Event) -> int:
    return int(event.time * 1_000_000)


def envelope(event: Event) -> dict[str, Any]:
    data = dict(event.data)
    if isinstance(data.get("scheduled_at"), float):
        data["scheduled_at"] = format_time(data["scheduled_at"])
    return {
        "specversion": SPEC_VERSION,
        "id": f"evt_{event.seq}",
        "sequence": event.seq,
        "type": event.type,
        "source": SOURCE,
        "time": format_time(event.time),
        "subject": event.subject,
        "data": data,
    }
