"""What the ZeroMQ clients and the worker share: frames, versions, and jobwire's error reply."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

from jobwire.protocols.zmq.mdp import Version
from jobwire.sdk.errors import ServiceError
from jobwire.sdk.payload import to_bytes

DEFAULT_ENDPOINT: Final = "tcp://127.0.0.1:5555"

#: The first frame of jobwire's error reply, [ERROR_MARK, status, text] (the broker's
#: `jobwire.server.zmq.majordomo.ERROR_MARK`; a test keeps the two equal).
ERROR_MARK: Final = b"\x00jobwire:error"


class Frames(tuple[bytes, ...]):
    """A multipart body: return one from a task to reply with several frames.

    Each part is encoded by the payload rule (bytes as they are, str as UTF-8, ...).
    """

    __slots__ = ()

    def __new__(cls, parts: Iterable[Any] = ()) -> Frames:
        return super().__new__(cls, (to_bytes(part) for part in parts))


def version_of(version: int | Version) -> Version:
    """1 or 2 (or a `Version`) as a `Version`; anything else is a ValueError."""
    try:
        return Version(version)
    except ValueError:
        raise ValueError(f"MDP version must be 1 or 2, not {version!r}") from None


def as_name(service: str | bytes) -> bytes:
    raw = service.encode() if isinstance(service, str) else bytes(service)
    if not raw:
        raise ValueError("a service name is not empty")
    return raw


def body_of(frames: Sequence[Any]) -> list[bytes]:
    """A request's body by the payload rule; MDP needs at least one frame."""
    return [to_bytes(frame) for frame in frames] or [b""]


def reply_frames(value: Any) -> list[bytes]:
    """A task's return value as reply frames: a `Frames` as its parts, else one frame."""
    if isinstance(value, Frames):
        return list(value) or [b""]
    return [to_bytes(value)]


def error_body(status: bytes, text: str) -> list[bytes]:
    """jobwire's error reply, as the broker sends it (a worker sends it for a failed task)."""
    return [ERROR_MARK, status, text.encode("utf-8", "replace")]


def raise_for_error(service: bytes, body: Sequence[bytes]) -> None:
    """Raise `ServiceError` if `body` is jobwire's error reply."""
    if len(body) >= 2 and body[0] == ERROR_MARK:
        raise ServiceError(
            service.decode("utf-8", "replace"),
            status_code(body[1]),
            body[2].decode("utf-8", "replace") if len(body) > 2 else "",
        )


def status_code(raw: bytes) -> int:
    """A 3-digit status frame ("200", or "200 text": RFC 9 lets text follow) as an int."""
    head = raw[:3]
    return int(head) if len(head) == 3 and head.isdigit() else 0
