"""Rota protocol errors: one exception type with a code, and the close code of fatal ones.

A non-fatal error is reported to the worker in an `error` message and the connection goes on
(the offending part is ignored). A fatal one means the worker can no longer be trusted (we may
have lost its results): the server sends the `error` message, then closes the WebSocket with the
code below, and requeues the jobs the worker held.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum


class CloseCode(IntEnum):
    """WebSocket close codes (RFC 6455 §7.4.1) the server uses."""

    NORMAL = 1000
    GOING_AWAY = 1001
    PROTOCOL_ERROR = 1002
    UNSUPPORTED_DATA = 1003
    INVALID_PAYLOAD = 1007
    POLICY_VIOLATION = 1008
    MESSAGE_TOO_BIG = 1009
    INTERNAL_ERROR = 1011


class ErrorCode(StrEnum):
    MALFORMED_JSON = "malformed_json"  # not UTF-8, or not JSON
    BINARY_MESSAGE = "binary_message"  # messages are text frames
    MESSAGE_TOO_BIG = "message_too_big"
    UNSUPPORTED_VERSION = "unsupported_version"  # `v` missing or not 1
    INVALID_MESSAGE = "invalid_message"  # a known message with a field of the wrong shape
    UNKNOWN_TYPE = "unknown_type"  # a `type` this version does not know: ignored
    NOT_REGISTERED = "not_registered"  # the first heartbeat must carry `register`
    ALREADY_REGISTERED = "already_registered"  # a second `register` part: ignored
    JOB_NOT_HELD = "job_not_held"  # progress/logs/result for a job the worker does not hold
    LOGS_NOT_REQUESTED = "logs_not_requested"  # logs for a job whose assignment said logs=false
    HEARTBEAT_TIMEOUT = "heartbeat_timeout"  # silent for longer than the server's timeout
    SLOW_READER = "slow_reader"  # the worker does not read what the server sends
    RATE_LIMITED = "rate_limited"  # more messages per second than the server allows
    STORE_UNAVAILABLE = "store_unavailable"  # results could not be made durable: not acked
    INTERNAL_ERROR = "internal_error"


#: Errors that end the connection, and how.
FATAL: dict[ErrorCode, CloseCode] = {
    ErrorCode.MALFORMED_JSON: CloseCode.INVALID_PAYLOAD,
    ErrorCode.BINARY_MESSAGE: CloseCode.UNSUPPORTED_DATA,
    ErrorCode.MESSAGE_TOO_BIG: CloseCode.MESSAGE_TOO_BIG,
    ErrorCode.UNSUPPORTED_VERSION: CloseCode.PROTOCOL_ERROR,
    ErrorCode.INVALID_MESSAGE: CloseCode.PROTOCOL_ERROR,
    ErrorCode.NOT_REGISTERED: CloseCode.POLICY_VIOLATION,
    ErrorCode.HEARTBEAT_TIMEOUT: CloseCode.POLICY_VIOLATION,
    ErrorCode.SLOW_READER: CloseCode.POLICY_VIOLATION,
    ErrorCode.RATE_LIMITED: CloseCode.POLICY_VIOLATION,
    ErrorCode.INTERNAL_ERROR: CloseCode.INTERNAL_ERROR,
}


class RotaError(Exception):
    """A message the server refuses, in whole (fatal) or in part."""

    def __init__(
        self, code: ErrorCode, message: str, *, job: str | None = None, seq: int | None = None
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.job = job  # the job the refused part named
        self.seq = seq  # the `seq` of the heartbeat that carried it

    @property
    def close_code(self) -> CloseCode | None:
        """The WebSocket close code when the error is fatal, else None."""
        return FATAL.get(self.code)

    @property
    def fatal(self) -> bool:
        return self.code in FATAL
