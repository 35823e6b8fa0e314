"""`GET /ojs/v1/events?types=&queues=&limit=&after=`: the event log as OJS event envelopes.

Without `after`, the newest `limit` matching events; with it (a `sequence` from an earlier
reply), the ones that followed, oldest first, so a poller can page forward without loss
(as long as it keeps up with the log's capacity).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from jobwire.engine.events import Event
from jobwire.protocols.ojs.envelope import SPEC_VERSION
from jobwire.protocols.ojs.times import format_time
from jobwire.server.ojs.http import BASE, query_int, query_list, reply

if TYPE_CHECKING:
    from jobwire.server.ojs.app import OJSService

SOURCE = "ojs://jobwire/engine"


def add_routes(router: web.UrlDispatcher, service: OJSService) -> None:
    async def list_events(request: web.Request) -> web.Response:
        events = service.events.query(
            types=set(query_list(request, "types")),
            queues=set(query_list(request, "queues")),
            after=query_int(request, "after", 0, low=0, high=2**62),
            limit=query_int(request, "limit", 100, low=1, high=10_000),
        )
        rendered = [envelope(e) for e in events]
        last = events[-1].seq if events else None
        return reply({"events": rendered, "count": len(rendered), "next_after": last})

    router.add_get(BASE + "/events", list_events)


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
