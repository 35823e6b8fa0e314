"""The server's replies, encoded: JOB_CREATED, JOB_ASSIGN*, WORK_*, STATUS_RES*, ERROR.

The per-job replies are built here without `encode`'s tuple of fields: compiled, a few
concatenations cost less than a join of so few parts. Fields are bytes as they go on the
wire; nothing here knows the engine's types.
"""

from __future__ import annotations

from typing import Final

from jobwire.protocols.gearman.packets import HEADER_SIZE, encode, header
from jobwire.protocols.gearman.packets import PacketType as T

_NUL: Final = b"\0"
# Enum member lookups cost ~0.1 us each in Python 3.11; the per-job paths use these.
_ERROR: Final = int(T.ERROR)
_JOB_CREATED: Final = int(T.JOB_CREATED)
_JOB_ASSIGN: Final = int(T.JOB_ASSIGN)
_JOB_ASSIGN_UNIQ: Final = int(T.JOB_ASSIGN_UNIQ)
_JOB_ASSIGN_ALL: Final = int(T.JOB_ASSIGN_ALL)
_WORK_FAIL: Final = int(T.WORK_FAIL)
_WORK_STATUS: Final = int(T.WORK_STATUS)
_STATUS_RES: Final = int(T.STATUS_RES)
_STATUS_RES_UNIQUE: Final = int(T.STATUS_RES_UNIQUE)
_ECHO_RES: Final = int(T.ECHO_RES)
_OPTION_RES: Final = int(T.OPTION_RES)

#: JOB_CREATED headers by handle length, for handles up to 63 bytes (all of ours).
_JOB_CREATED_HEADS: Final = [encode(_JOB_CREATED, bytes(size))[:HEADER_SIZE] for size in range(64)]
#: b"000" to b"999": the last three digits of a handle the engine numbered.
_LAST_DIGITS: Final = [b"%03d" % low for low in range(1000)]


def error(code: str, text: str) -> bytes:
    return encode(_ERROR, code.encode(), text.encode())


#: Replaces the JOB_CREATED of a background job whose store commit failed.
NOT_STORED: Final = error("QUEUE_ERROR", "Job could not be stored")


def job_created(handle: bytes) -> bytes:
    return encode(_JOB_CREATED, handle)


def created_handle(reply: bytes) -> bytes:
    """The handle a JOB_CREATED reply announces."""
    return reply[HEADER_SIZE:]


class CreatedReplies:
    """JOB_CREATED replies of the jobs the engine numbers, `PREFIX:N` (one per listener).

    The handles of a block of a thousand numbers from 1000 on differ only in their last three
    digits, and so do their replies: the common start is made once per block. Encoding each
    handle and joining it to its header cost twice as many instructions.
    """

    def __init__(self) -> None:
        self._block = 0  # the block of the start kept, and the start
        self._start = b""

    def reply(self, number: int, job_id: str) -> bytes:
        """JOB_CREATED for the job `job_id`, numbered `number` (0: not numbered)."""
        if number >= 1000 and number // 1000 == self._block:
            return self._start + _LAST_DIGITS[number % 1000]
        handle = job_id.encode()
        size = len(handle)
        if size >= len(_JOB_CREATED_HEADS):
            return encode(_JOB_CREATED, handle)
        if number >= 1000:  # the first of its block: keep the start for the others
            self._block = number // 1000
            self._start = _JOB_CREATED_HEADS[size] + handle[:-3]
        return _JOB_CREATED_HEADS[size] + handle


def job_assign(handle: bytes, function: bytes, payload: bytes) -> bytes:
    size = len(handle) + len(function) + len(payload) + 2
    return header(_JOB_ASSIGN, size) + handle + _NUL + function + _NUL + payload


def job_assign_uniq(handle: bytes, function: bytes, unique: bytes, payload: bytes) -> bytes:
    return encode(_JOB_ASSIGN_UNIQ, handle, function, unique, payload)


def job_assign_all(
    handle: bytes, function: bytes, unique: bytes, reducer: bytes, payload: bytes
) -> bytes:
    return encode(_JOB_ASSIGN_ALL, handle, function, unique, reducer, payload)


def work_result(ptype: int, handle: bytes, data: bytes) -> bytes:
    """A packet of a handle and data: WORK_COMPLETE, _DATA, _WARNING, _EXCEPTION."""
    return header(ptype, len(handle) + 1 + len(data)) + handle + _NUL + data


def work_status(handle: bytes, numerator: bytes, denominator: bytes) -> bytes:
    return encode(_WORK_STATUS, handle, numerator, denominator)


def work_fail(handle: bytes) -> bytes:
    return encode(_WORK_FAIL, handle)


def status_res(
    handle: bytes, known: bytes, running: bytes, numerator: bytes, denominator: bytes
) -> bytes:
    return encode(_STATUS_RES, handle, known, running, numerator, denominator)


def status_res_unique(
    unique: bytes,
    known: bytes,
    running: bytes,
    numerator: bytes,
    denominator: bytes,
    clients: bytes,
) -> bytes:
    return encode(_STATUS_RES_UNIQUE, unique, known, running, numerator, denominator, clients)


def echo_res(data: bytes) -> bytes:
    return encode(_ECHO_RES, data)


def option_res(name: bytes) -> bytes:
    return encode(_OPTION_RES, name)
