"""Gearman packet types, their argument counts, and encoding.

The argument counts are the ones gearmand's parser uses (libgearman/command.cc), which
differ from the PROTOCOL document for SUBMIT_REDUCE_JOB (an extra empty aggregator field).
An argument count N means N fields: N-1 NUL-terminated ones and a last one that runs to
the end of the body.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import Final

HEADER: Final = struct.Struct(">4sII")
HEADER_SIZE: Final = HEADER.size
REQ_MAGIC: Final = b"\0REQ"
RES_MAGIC: Final = b"\0RES"


class PacketType(IntEnum):
    CAN_DO = 1
    CANT_DO = 2
    RESET_ABILITIES = 3
    PRE_SLEEP = 4
    UNUSED = 5
    NOOP = 6
    SUBMIT_JOB = 7
    JOB_CREATED = 8
    GRAB_JOB = 9
    NO_JOB = 10
    JOB_ASSIGN = 11
    WORK_STATUS = 12
    WORK_COMPLETE = 13
    WORK_FAIL = 14
    GET_STATUS = 15
    ECHO_REQ = 16
    ECHO_RES = 17
    SUBMIT_JOB_BG = 18
    ERROR = 19
    STATUS_RES = 20
    SUBMIT_JOB_HIGH = 21
    SET_CLIENT_ID = 22
    CAN_DO_TIMEOUT = 23
    ALL_YOURS = 24
    WORK_EXCEPTION = 25
    OPTION_REQ = 26
    OPTION_RES = 27
    WORK_DATA = 28
    WORK_WARNING = 29
    GRAB_JOB_UNIQ = 30
    JOB_ASSIGN_UNIQ = 31
    SUBMIT_JOB_HIGH_BG = 32
    SUBMIT_JOB_LOW = 33
    SUBMIT_JOB_LOW_BG = 34
    SUBMIT_JOB_SCHED = 35
    SUBMIT_JOB_EPOCH = 36
    SUBMIT_REDUCE_JOB = 37
    SUBMIT_REDUCE_JOB_BACKGROUND = 38
    GRAB_JOB_ALL = 39
    JOB_ASSIGN_ALL = 40
    GET_STATUS_UNIQUE = 41
    STATUS_RES_UNIQUE = 42


T = PacketType

#: Packets a client or worker sends (magic \0REQ), with their field counts.
REQUEST_ARGC: Final[dict[int, int]] = {
    T.CAN_DO: 1,
    T.CANT_DO: 1,
    T.RESET_ABILITIES: 0,
    T.PRE_SLEEP: 0,
    T.SUBMIT_JOB: 3,
    T.GRAB_JOB: 0,
    T.WORK_STATUS: 3,
    T.WORK_COMPLETE: 2,
    T.WORK_FAIL: 1,
    T.GET_STATUS: 1,
    T.ECHO_REQ: 1,
    T.SUBMIT_JOB_BG: 3,
    T.SUBMIT_JOB_HIGH: 3,
    T.SET_CLIENT_ID: 1,
    T.CAN_DO_TIMEOUT: 2,
    T.ALL_YOURS: 0,
    T.WORK_EXCEPTION: 2,
    T.OPTION_REQ: 1,
    T.WORK_DATA: 2,
    T.WORK_WARNING: 2,
    T.GRAB_JOB_UNIQ: 0,
    T.SUBMIT_JOB_HIGH_BG: 3,
    T.SUBMIT_JOB_LOW: 3,
    T.SUBMIT_JOB_LOW_BG: 3,
    T.SUBMIT_JOB_SCHED: 8,
    T.SUBMIT_JOB_EPOCH: 4,
    T.SUBMIT_REDUCE_JOB: 5,
    T.SUBMIT_REDUCE_JOB_BACKGROUND: 5,
    T.GRAB_JOB_ALL: 0,
    T.GET_STATUS_UNIQUE: 1,
}

#: Packets the server sends (magic \0RES), with their field counts.
RESPONSE_ARGC: Final[dict[int, int]] = {
    T.NOOP: 0,
    T.JOB_CREATED: 1,
    T.NO_JOB: 0,
    T.JOB_ASSIGN: 3,
    T.WORK_STATUS: 3,
    T.WORK_COMPLETE: 2,
    T.WORK_FAIL: 1,
    T.ECHO_RES: 1,
    T.ERROR: 2,
    T.STATUS_RES: 5,
    T.WORK_EXCEPTION: 2,
    T.OPTION_RES: 1,
    T.WORK_DATA: 2,
    T.WORK_WARNING: 2,
    T.JOB_ASSIGN_UNIQ: 4,
    T.JOB_ASSIGN_ALL: 5,
    T.STATUS_RES_UNIQUE: 6,
}


class Packet:
    """One decoded binary packet: its type and its fields."""

    __slots__ = ("args", "type")

    def __init__(self, ptype: int, args: tuple[bytes, ...]) -> None:
        self.type = ptype
        self.args = args

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Packet) and (self.type, self.args) == (other.type, other.args)

    def __hash__(self) -> int:
        return hash((self.type, self.args))

    def __repr__(self) -> str:
        try:
            name = PacketType(self.type).name
        except ValueError:
            name = str(self.type)
        return f"Packet({name}, {self.args!r})"


_pack: Final = HEADER.pack
#: Server packet headers already built: per packet type, a list by body size, filled as
#: sizes come (b"": not yet). Replies repeat their sizes, and compiled, indexing a list
#: costs a fraction of the generic call to struct's `pack`.
_HEAD_SIZES: Final = 1024
_heads: Final[list[list[bytes]]] = [[] for _ in range(max(PacketType) + 1)]


def header(ptype: int, size: int) -> bytes:
    """The 12-byte header of a server packet of `ptype` with a body of `size` bytes."""
    if size >= _HEAD_SIZES or not 0 <= ptype < len(_heads):
        return _pack(RES_MAGIC, ptype, size)
    heads = _heads[ptype]
    if not heads:
        heads.extend([b""] * _HEAD_SIZES)
    head = heads[size]
    if not len(head):  # compiled, len() is native where the truth of bytes is a call
        head = heads[size] = _pack(RES_MAGIC, ptype, size)
    return head


def encode(ptype: int, *args: bytes) -> bytes:
    """A server packet (\\0RES) with NUL-separated fields."""
    # Most replies are a handle and data: compiled, two concatenations cost less than a join.
    body = args[0] + b"\0" + args[1] if len(args) == 2 else b"\0".join(args)
    return header(ptype, len(body)) + body


#: Client and worker packet headers already built, as `_heads` for the server's.
_request_heads: Final[list[list[bytes]]] = [[] for _ in range(max(PacketType) + 1)]


def encode_request(ptype: int, *args: bytes) -> bytes:
    """A client or worker packet (\\0REQ); used by the SDK and tests."""
    body = b"\0".join(args)
    size = len(body)
    if size >= _HEAD_SIZES or not 0 <= ptype < len(_request_heads):
        return _pack(REQ_MAGIC, ptype, size) + body
    heads = _request_heads[ptype]
    if not heads:
        heads.extend([b""] * _HEAD_SIZES)
    head = heads[size]
    if not len(head):
        head = heads[size] = _pack(REQ_MAGIC, ptype, size)
    return head + body


NOOP: Final = encode(T.NOOP)
NO_JOB: Final = encode(T.NO_JOB)
