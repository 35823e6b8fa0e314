"""The Paranoid Pirate Protocol (RFC 6), sans-IO, for a queue's two ROUTER sockets.

Backend (workers, DEALER): READY is one frame `0x01`, HEARTBEAT one frame `0x02`; a REPLY
is the request's address stack, an empty frame and at least one body frame. Frontend
(clients, REQ or DEALER): a request is an address stack (usually empty), an empty frame and
at least one body frame. The queue sends a worker [address..., empty, body...] and echoes
the address stack back to the client with the reply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

READY: Final = b"\x01"
HEARTBEAT: Final = b"\x02"


class PppError(ValueError):
    """Not a valid PPP message: dropped."""


@dataclass(frozen=True, slots=True)
class Ready:
    pass


@dataclass(frozen=True, slots=True)
class Heartbeat:
    pass


@dataclass(frozen=True, slots=True)
class Reply:
    address: tuple[bytes, ...]
    body: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class ClientRequest:
    address: tuple[bytes, ...]  # what the client's sockets put before the empty frame
    body: tuple[bytes, ...]


def decode_backend(frames: list[bytes]) -> Ready | Heartbeat | Reply:
    """A worker's message (frames after the ROUTER identity)."""
    if len(frames) == 1:
        if frames[0] == READY:
            return Ready()
        if frames[0] == HEARTBEAT:
            return Heartbeat()
        raise PppError(f"unknown one-frame command {frames[0][:4]!r}")
    address, body = _envelope(frames)
    if not address:
        raise PppError("a reply carries the request's address")
    return Reply(address, body)


def decode_frontend(frames: list[bytes]) -> ClientRequest:
    """A client's request (frames after the ROUTER identity)."""
    address, body = _envelope(frames)
    return ClientRequest(address, body)


def _envelope(frames: list[bytes]) -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
    try:
        empty = frames.index(b"")
    except ValueError:
        raise PppError("no empty frame between address and body") from None
    body = tuple(frames[empty + 1 :])
    if not body:
        raise PppError("a request or reply has at least one body frame")
    return tuple(frames[:empty]), body


def request(
    address: tuple[bytes, ...] | list[bytes], body: tuple[bytes, ...] | list[bytes]
) -> list[bytes]:
    """Queue -> worker (after the worker's identity), or queue -> client reply."""
    return [*address, b"", *body]
