"""The services a Majordomo broker answers itself: MMI (RFC 8) and Titanic (RFC 9).

MMI: `mmi.service` with a service name as body answers `200` while at least one worker
serves it, `404` otherwise; `mmi.services` (our documented extension) answers `200` and one
frame per service that has workers; any other `mmi.*` name answers `501`. Workers may not
register a name in the `mmi.` namespace.

Titanic: `titanic.request` [service, body...] -> [status, uuid]; `titanic.reply` [uuid] ->
[status, body...]; `titanic.close` [uuid] -> [status]. Status is `200` OK, `300` pending,
`400` unknown, `500` error. A uuid is 32 lower-case hex characters.
"""

from __future__ import annotations

import re
from typing import Final

MMI_PREFIX: Final = b"mmi."
MMI_SERVICE: Final = b"mmi.service"
MMI_SERVICES: Final = b"mmi.services"

TITANIC_REQUEST: Final = b"titanic.request"
TITANIC_REPLY: Final = b"titanic.reply"
TITANIC_CLOSE: Final = b"titanic.close"
TITANIC_SERVICES: Final = (TITANIC_REQUEST, TITANIC_REPLY, TITANIC_CLOSE)

OK: Final = b"200"
PENDING: Final = b"300"
UNKNOWN: Final = b"400"
NOT_FOUND: Final = b"404"
ERROR: Final = b"500"
NOT_IMPLEMENTED: Final = b"501"

_UUID = re.compile(rb"[0-9a-f]{32}")


def is_internal(service: bytes) -> bool:
    """A name the broker answers itself: workers may not register it."""
    return service.startswith(MMI_PREFIX) or service in TITANIC_SERVICES


def is_uuid(raw: bytes) -> bool:
    return _UUID.fullmatch(raw) is not None
