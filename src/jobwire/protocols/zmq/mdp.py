"""Majordomo 0.1 (RFC 7) and 0.2 (RFC 18), sans-IO: frames in, typed messages out, and back.

Frames are the multipart message after the ROUTER identity (the broker side) or as a DEALER
sees it (the client and worker side). Both versions are told apart by their first frames:
0.1 starts with an empty frame and then the header (`MDPC01`/`MDPW01`), 0.2 starts with the
header itself (`MDPC02`/`MDPW02`), so one ROUTER socket serves both.

A message that breaks its layout (a wrong header, an unknown command byte, too few or too
many frames) raises `MdpError`: the RFCs say the broker drops it and treats the sender as
invalid. The command bytes differ between versions (HEARTBEAT is 0x04 in 0.1 and 0x05 in
0.2), so each version has its own table.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Final

CLIENT_V1: Final = b"MDPC01"
WORKER_V1: Final = b"MDPW01"
CLIENT_V2: Final = b"MDPC02"
WORKER_V2: Final = b"MDPW02"


class MdpError(ValueError):
    """A message that is not valid Majordomo: drop it (RFC 7: treat the sender as invalid)."""


class Version(IntEnum):
    V1 = 1  # RFC 7, MDP/0.1
    V2 = 2  # RFC 18, MDP/0.2


# Command bytes, per version.
_V1_READY, _V1_REQUEST, _V1_REPLY, _V1_HEARTBEAT, _V1_DISCONNECT = b"\1", b"\2", b"\3", b"\4", b"\5"
_V2_CLIENT_REQUEST, _V2_CLIENT_PARTIAL, _V2_CLIENT_FINAL = b"\1", b"\2", b"\3"
_V2_READY, _V2_REQUEST, _V2_PARTIAL, _V2_FINAL = b"\1", b"\2", b"\3", b"\4"
_V2_HEARTBEAT, _V2_DISCONNECT = b"\5", b"\6"


# ---------------------------------------------------------------- client <-> broker

# The messages are slotted dataclasses, not frozen ones, and the ones made per request write
# their own `__init__`: this module is compiled with mypyc (src/jobwire/native.py), which
# makes these native classes but leaves the dataclass's generated `__init__` to run
# interpreted (3-4x the instructions per message; 6x for a frozen one). `__eq__` and
# `__repr__` stay the dataclass's.


@dataclass(slots=True, init=False)
class Request:
    """A client's REQUEST for `service`."""

    version: Version
    service: bytes
    body: tuple[bytes, ...]

    def __init__(self, version: Version, service: bytes, body: tuple[bytes, ...]) -> None:
        self.version = version
        self.service = service
        self.body = body


@dataclass(slots=True)
class Reply:
    """The broker's answer to a client: 0.1 REPLY (always final), 0.2 PARTIAL or FINAL."""

    version: Version
    service: bytes
    body: tuple[bytes, ...]
    final: bool = True


# ---------------------------------------------------------------- worker <-> broker


@dataclass(slots=True)
class Ready:
    version: Version
    service: bytes


@dataclass(slots=True)
class WorkerRequest:
    """The broker hands a request to a worker; `client` is the address to answer to."""

    version: Version
    client: bytes
    body: tuple[bytes, ...]


@dataclass(slots=True, init=False)
class WorkerReply:
    """A worker's answer: 0.1 REPLY (final), 0.2 PARTIAL or FINAL."""

    version: Version
    client: bytes
    body: tuple[bytes, ...]
    final: bool

    def __init__(
        self, version: Version, client: bytes, body: tuple[bytes, ...], final: bool = True
    ) -> None:
        self.version = version
        self.client = client
        self.body = body
        self.final = final


@dataclass(slots=True)
class Heartbeat:
    version: Version


@dataclass(slots=True)
class Disconnect:
    version: Version


ClientMessage = Request
WorkerMessage = Ready | WorkerReply | Heartbeat | Disconnect
BrokerToWorker = WorkerRequest | Heartbeat | Disconnect


def decode(frames: list[bytes]) -> ClientMessage | WorkerMessage:
    """A message a client or worker sent the broker (frames after the ROUTER identity)."""
    if not frames:
        raise MdpError("an empty message")
    first = frames[0]
    if first == b"":
        if len(frames) < 2:
            raise MdpError("an empty frame and nothing after it")
        header = frames[1]
        if header == CLIENT_V1:
            return _client_v1(frames)
        if header == WORKER_V1:
            return _worker_v1(frames)
        raise MdpError(f"unknown protocol header {header[:16]!r}")
    if first == CLIENT_V2:
        return _client_v2(frames)
    if first == WORKER_V2:
        return _worker_v2(frames)
    raise MdpError(f"unknown protocol header {first[:16]!r}")


def _client_v1(frames: list[bytes]) -> Request:
    # empty · MDPC01 · service · body (at least one frame)
    if len(frames) < 4:
        raise MdpError("an MDP/0.1 REQUEST has a service and a body")
    return Request(Version.V1, frames[2], tuple(frames[3:]))


def _client_v2(frames: list[bytes]) -> Request:
    # MDPC02 · 0x01 · service · body (at least one frame)
    if len(frames) < 2 or frames[1] != _V2_CLIENT_REQUEST:
        raise MdpError("an MDP/0.2 client sends REQUEST (0x01) only")
    if len(frames) < 4:
        raise MdpError("an MDP/0.2 REQUEST has a service and a body")
    return Request(Version.V2, frames[2], tuple(frames[3:]))


def _worker_v1(frames: list[bytes]) -> WorkerMessage:
    if len(frames) < 3:
        raise MdpError("an MDP/0.1 worker command has a command frame")
    command = frames[2]
    if command == _V1_READY:
        if len(frames) != 4:
            raise MdpError("READY carries exactly one service frame")
        return Ready(Version.V1, frames[3])
    if command == _V1_REPLY:
        client, body = _addressed(frames, 3, "REPLY")
        return WorkerReply(Version.V1, client, body, True)
    if command == _V1_HEARTBEAT:
        _exactly(frames, 3, "HEARTBEAT")
        return Heartbeat(Version.V1)
    if command == _V1_DISCONNECT:
        _exactly(frames, 3, "DISCONNECT")
        return Disconnect(Version.V1)
    raise MdpError(f"unknown MDP/0.1 worker command {command[:4]!r}")


def _worker_v2(frames: list[bytes]) -> WorkerMessage:
    if len(frames) < 2:
        raise MdpError("an MDP/0.2 worker command has a command frame")
    command = frames[1]
    if command == _V2_READY:
        if len(frames) != 3:
            raise MdpError("READY carries exactly one service frame")
        return Ready(Version.V2, frames[2])
    if command in (_V2_PARTIAL, _V2_FINAL):
        client, body = _addressed(frames, 2, "PARTIAL/FINAL")
        return WorkerReply(Version.V2, client, body, command == _V2_FINAL)
    if command == _V2_HEARTBEAT:
        _exactly(frames, 2, "HEARTBEAT")
        return Heartbeat(Version.V2)
    if command == _V2_DISCONNECT:
        _exactly(frames, 2, "DISCONNECT")
        return Disconnect(Version.V2)
    raise MdpError(f"unknown MDP/0.2 worker command {command[:4]!r}")


def _addressed(frames: list[bytes], at: int, what: str) -> tuple[bytes, tuple[bytes, ...]]:
    """client address · empty · body (at least one frame), from frames[at]."""
    if len(frames) < at + 3:
        raise MdpError(f"{what} carries a client address, an empty frame and a body")
    if frames[at + 1] != b"":
        raise MdpError(f"{what}: the client address is followed by an empty frame")
    return frames[at], tuple(frames[at + 2 :])


def _exactly(frames: list[bytes], count: int, what: str) -> None:
    if len(frames) != count:
        raise MdpError(f"{what} has exactly {count} frames")


# ---------------------------------------------------------------- encoding


def reply(
    version: Version, service: bytes, body: tuple[bytes, ...] | list[bytes], *, final: bool = True
) -> list[bytes]:
    """Broker -> client: 0.1 REPLY (`final` must be True) or 0.2 PARTIAL/FINAL."""
    if version is Version.V1:
        if not final:
            raise ValueError("MDP/0.1 has no partial replies")
        return [b"", CLIENT_V1, service, *body]
    return [CLIENT_V2, _V2_CLIENT_FINAL if final else _V2_CLIENT_PARTIAL, service, *body]


def request(version: Version, service: bytes, body: tuple[bytes, ...] | list[bytes]) -> list[bytes]:
    """Client -> broker REQUEST (as a DEALER sends it; a REQ socket adds the empty frame of
    0.1 itself, so strip it: `request(...)[1:]`)."""
    if version is Version.V1:
        return [b"", CLIENT_V1, service, *body]
    return [CLIENT_V2, _V2_CLIENT_REQUEST, service, *body]


def worker_request(
    version: Version, client: bytes, body: tuple[bytes, ...] | list[bytes]
) -> list[bytes]:
    """Broker -> worker REQUEST."""
    if version is Version.V1:
        return [b"", WORKER_V1, _V1_REQUEST, client, b"", *body]
    return [WORKER_V2, _V2_REQUEST, client, b"", *body]


def ready(version: Version, service: bytes) -> list[bytes]:
    if version is Version.V1:
        return [b"", WORKER_V1, _V1_READY, service]
    return [WORKER_V2, _V2_READY, service]


def worker_reply(
    version: Version, client: bytes, body: tuple[bytes, ...] | list[bytes], *, final: bool = True
) -> list[bytes]:
    """Worker -> broker: 0.1 REPLY or 0.2 PARTIAL/FINAL."""
    if version is Version.V1:
        if not final:
            raise ValueError("MDP/0.1 has no partial replies")
        return [b"", WORKER_V1, _V1_REPLY, client, b"", *body]
    return [WORKER_V2, _V2_FINAL if final else _V2_PARTIAL, client, b"", *body]


def heartbeat(version: Version) -> list[bytes]:
    if version is Version.V1:
        return [b"", WORKER_V1, _V1_HEARTBEAT]
    return [WORKER_V2, _V2_HEARTBEAT]


def disconnect(version: Version) -> list[bytes]:
    if version is Version.V1:
        return [b"", WORKER_V1, _V1_DISCONNECT]
    return [WORKER_V2, _V2_DISCONNECT]


# ---------------------------------------------------------------- the other side (SDK)


def decode_reply(frames: list[bytes]) -> Reply:
    """Broker -> client, as a DEALER client sees it (a REQ client: prepend b"")."""
    if frames and frames[0] == b"":
        if len(frames) < 3 or frames[1] != CLIENT_V1:
            raise MdpError("not an MDP/0.1 REPLY")
        return Reply(Version.V1, frames[2], tuple(frames[3:]), True)
    if len(frames) < 3 or frames[0] != CLIENT_V2:
        raise MdpError("not an MDP client reply")
    if frames[1] not in (_V2_CLIENT_PARTIAL, _V2_CLIENT_FINAL):
        raise MdpError(f"unknown MDP/0.2 client command {frames[1][:4]!r}")
    return Reply(Version.V2, frames[2], tuple(frames[3:]), frames[1] == _V2_CLIENT_FINAL)


def decode_for_worker(frames: list[bytes]) -> BrokerToWorker:
    """Broker -> worker, as the worker's DEALER sees it."""
    if frames and frames[0] == b"":
        if len(frames) < 3 or frames[1] != WORKER_V1:
            raise MdpError("not an MDP/0.1 worker command")
        command = frames[2]
        if command == _V1_REQUEST:
            client, body = _addressed_or_empty(frames, 3)
            return WorkerRequest(Version.V1, client, body)
        if command == _V1_HEARTBEAT:
            return Heartbeat(Version.V1)
        if command == _V1_DISCONNECT:
            return Disconnect(Version.V1)
        raise MdpError(f"unknown MDP/0.1 broker command {command[:4]!r}")
    if len(frames) < 2 or frames[0] != WORKER_V2:
        raise MdpError("not an MDP worker command")
    command = frames[1]
    if command == _V2_REQUEST:
        client, body = _addressed_or_empty(frames, 2)
        return WorkerRequest(Version.V2, client, body)
    if command == _V2_HEARTBEAT:
        return Heartbeat(Version.V2)
    if command == _V2_DISCONNECT:
        return Disconnect(Version.V2)
    raise MdpError(f"unknown MDP/0.2 broker command {command[:4]!r}")


def _addressed_or_empty(frames: list[bytes], at: int) -> tuple[bytes, tuple[bytes, ...]]:
    if len(frames) < at + 2 or frames[at + 1] != b"":
        raise MdpError("REQUEST carries a client address and an empty frame")
    return frames[at], tuple(frames[at + 2 :])
