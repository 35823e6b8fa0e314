"""The Freelance protocol (RFC 10), sans-IO, for a server's ROUTER.

A ping is the one frame `PING`, answered `PONG`. A request is a client control frame (CCF,
e.g. a sequence number), then the body; the server answers the CCF unchanged and the reply.
jobwire's body is the service (an engine function) and its frames: [CCF, service, body...].
The ZeroMQ Guide's "shotgun" clients send through DEALER with a REP-style envelope (an
empty frame first); such requests are answered with the same envelope. So a control frame
is never empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

PING: Final = b"PING"
PONG: Final = b"PONG"


class FreelanceError(ValueError):
    """Not a valid Freelance message: dropped."""


@dataclass(frozen=True, slots=True)
class Ping:
    envelope: tuple[bytes, ...]  # () or (b"",): what to put back before the answer


@dataclass(frozen=True, slots=True)
class Request:
    envelope: tuple[bytes, ...]
    control: bytes
    service: bytes
    body: tuple[bytes, ...]


def decode(frames: list[bytes]) -> Ping | Request:
    """A client's message (frames after the ROUTER identity)."""
    envelope: tuple[bytes, ...] = ()
    if frames and frames[0] == b"":
        envelope, frames = (b"",), frames[1:]
    if frames == [PING]:
        return Ping(envelope)
    if len(frames) < 3:
        raise FreelanceError("a request is a control frame, a service and a body")
    if not frames[1]:
        raise FreelanceError("the service name is empty")
    return Request(envelope, frames[0], frames[1], tuple(frames[2:]))


def pong(ping: Ping) -> list[bytes]:
    return [*ping.envelope, PONG]


def reply(request: Request, body: list[bytes]) -> list[bytes]:
    return [*request.envelope, request.control, *body]
