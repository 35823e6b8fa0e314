"""Bytes -> Rota messages, with every field checked.

`decode_worker_message` is the server's side (heartbeats); `decode_server_message` is the
worker's (welcome, assignment, revoke, specs, error). Both raise `RotaError` with a code from
`errors.ErrorCode`; the code says whether the connection can go on. Unknown fields are ignored
(a newer peer may send more); known fields of the wrong shape are refused.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import orjson

from jobwire.protocols.json_depth import MAX_DEPTH, too_deep
from jobwire.protocols.rota.errors import ErrorCode, RotaError
from jobwire.protocols.rota.messages import (
    ALERT_LEVELS,
    VERSION,
    Ack,
    Alert,
    Assignment,
    ErrorMessage,
    Failure,
    Heartbeat,
    JobCopy,
    LogBatch,
    Progress,
    Registration,
    Result,
    Revoke,
    ServerMessage,
    SpecRef,
    SpecsChanged,
    SpecVerdict,
    Status,
    Success,
    Welcome,
)

MAX_NAME = 255  # spec, queue and host names
MAX_ID = 1024  # job ids (OJS UUIDs, Gearman handles)
MAX_TEXT = 64 * 1024  # messages, log lines
MAX_WANTS = 100_000
MAX_SAFE_INT = 2**53 - 1
DEFAULT_MAX_MESSAGE = 1024 * 1024


class _Fields:
    """Typed reads of one JSON object; every refusal names the field's path."""

    __slots__ = ("obj", "path", "seq")

    def __init__(self, obj: dict[str, Any], path: str, seq: int | None) -> None:
        self.obj = obj
        self.path = path
        self.seq = seq

    def fail(self, key: str, what: str) -> RotaError:
        where = f"{self.path}.{key}" if self.path else key
        return RotaError(ErrorCode.INVALID_MESSAGE, f"{where} must be {what}", seq=self.seq)

    def child(self, value: Any, key: str) -> _Fields:
        if not isinstance(value, dict):
            raise self.fail(key, "an object")
        return _Fields(value, f"{self.path}.{key}" if self.path else key, self.seq)

    def text(self, key: str, *, limit: int = MAX_NAME, empty: bool = False) -> str:
        value = self.obj.get(key)
        if not isinstance(value, str) or len(value) > limit or (not value and not empty):
            size = f"at most {limit} characters"
            raise self.fail(key, f"a {'' if empty else 'non-empty '}string of {size}")
        return value

    def opt_text(self, key: str, *, limit: int = MAX_NAME, empty: bool = False) -> str | None:
        return None if self.obj.get(key) is None else self.text(key, limit=limit, empty=empty)

    def integer(self, key: str, *, maximum: int = MAX_SAFE_INT) -> int:
        value = self.obj.get(key)
        if type(value) is not int or not 0 <= value <= maximum:
            raise self.fail(key, f"an integer in [0, {maximum}]")
        return value

    def opt_integer(self, key: str, *, maximum: int = MAX_SAFE_INT) -> int | None:
        return None if self.obj.get(key) is None else self.integer(key, maximum=maximum)

    def opt_number(self, key: str) -> float | None:
        value = self.obj.get(key)
        if value is None:
            return None
        if type(value) not in (int, float) or value < 0:
            raise self.fail(key, "a non-negative number")
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self.obj.get(key, default)
        if not isinstance(value, bool):
            raise self.fail(key, "true or false")
        return value

    def items(self, key: str) -> list[Any]:
        value = self.obj.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(key, "an array")
        return value

    def objects(self, key: str) -> list[_Fields]:
        return [self.child(item, f"{key}[{i}]") for i, item in enumerate(self.items(key))]

    def names(self, key: str, *, limit: int = MAX_NAME, empty: bool = False) -> tuple[str, ...]:
        out = []
        for item in self.items(key):
            if not isinstance(item, str) or len(item) > limit or (not item and not empty):
                kind = "strings" if empty else "non-empty strings"
                raise self.fail(key, f"an array of {kind} of at most {limit} characters")
            out.append(item)
        return tuple(out)


def _load(data: bytes | str, max_size: int | None) -> dict[str, Any]:
    if max_size is not None and len(data) > max_size:
        raise RotaError(
            ErrorCode.MESSAGE_TOO_BIG, f"message of {len(data)} bytes; the limit is {max_size}"
        )
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise RotaError(ErrorCode.MALFORMED_JSON, f"not a JSON text: {exc}") from None
    if too_deep(data, obj):
        raise RotaError(ErrorCode.INVALID_MESSAGE, f"nested deeper than {MAX_DEPTH} levels")
    if not isinstance(obj, dict):
        raise RotaError(ErrorCode.INVALID_MESSAGE, "a message is a JSON object")
    return obj


def _envelope(obj: dict[str, Any]) -> tuple[str, int | None]:
    """Check `v`, read `seq` (echoed in errors) and return the message type."""
    seq = obj.get("seq")
    if type(seq) is not int or not 0 <= seq <= MAX_SAFE_INT:
        seq = None
    version = obj.get("v")
    if type(version) is not int or version != VERSION:
        raise RotaError(
            ErrorCode.UNSUPPORTED_VERSION,
            f"this server speaks version {VERSION}; the message has v={version!r}",
            seq=seq,
        )
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise RotaError(ErrorCode.INVALID_MESSAGE, "type must be a string", seq=seq)
    return kind, seq


# ---------------------------------------------------------------- worker -> server


def decode_worker_message(
    data: bytes | str, *, max_size: int | None = DEFAULT_MAX_MESSAGE
) -> Heartbeat:
    """One text frame from a worker. Raises RotaError."""
    obj = _load(data, max_size)
    kind, seq = _envelope(obj)
    if kind != "heartbeat":
        raise RotaError(
            ErrorCode.UNKNOWN_TYPE, f"unknown message type {kind[:64]!r}; ignored", seq=seq
        )
    fields = _Fields(obj, "", seq)
    if "seq" in obj and obj["seq"] is not None and seq is None:
        raise fields.fail("seq", f"an integer in [0, {MAX_SAFE_INT}]")
    register = obj.get("register")
    status = obj.get("status")
    return Heartbeat(
        seq=seq,
        register=None if register is None else _registration(fields.child(register, "register")),
        wants=fields.opt_integer("wants", maximum=MAX_WANTS),
        status=None if status is None else _status(fields.child(status, "status")),
        results=tuple(_result(item) for item in fields.objects("results")),
    )


def _registration(f: _Fields) -> Registration:
    pid = f.opt_integer("pid")
    queues = f.obj.get("queues")
    specs = []
    for spec in f.objects("specs"):
        specs.append(SpecRef(spec.text("name"), spec.text("checksum", limit=128)))
    return Registration(
        hostname=f.opt_text("hostname", empty=True) or "",
        os=f.opt_text("os", empty=True) or "",
        pid=pid,
        queues=None if queues is None else f.names("queues"),
        specs=tuple(specs),
    )


def _status(f: _Fields) -> Status:
    progress = tuple(
        Progress(p.text("job", limit=MAX_ID), p.integer("current"), p.integer("total"))
        for p in f.objects("progress")
    )
    logs = tuple(
        LogBatch(entry.text("job", limit=MAX_ID), entry.names("lines", limit=MAX_TEXT, empty=True))
        for entry in f.objects("logs")
    )
    alerts = []
    for a in f.objects("alerts"):
        level = a.obj.get("level", "warning")
        if level not in ALERT_LEVELS:
            raise a.fail("level", "one of " + ", ".join(ALERT_LEVELS))
        alerts.append(
            Alert(level, a.text("message", limit=MAX_TEXT), a.opt_text("job", limit=MAX_ID))
        )
    return Status(
        cpu=f.opt_number("cpu"),
        ram=f.opt_integer("ram"),
        progress=progress,
        logs=logs,
        alerts=tuple(alerts),
    )


def result_bytes(value: Any) -> bytes:
    """The engine's bytes for a JSON `data` value (the SDK's payload rule)."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if value is None:
        return b""
    return orjson.dumps(value)


def _result(f: _Fields) -> Result:
    job = f.text("job", limit=MAX_ID)
    outcome = f.obj.get("outcome")
    if outcome == "success":
        if "data_base64" in f.obj:
            if "data" in f.obj:
                raise f.fail("data", "absent when data_base64 is given")
            raw = f.text("data_base64", limit=2**62, empty=True)
            try:
                return Success(job, base64.b64decode(raw, validate=True))
            except (binascii.Error, ValueError):
                raise f.fail("data_base64", "standard base64") from None
        value = f.obj.get("data")
        return Success(job, result_bytes(value), value)
    if outcome == "failure":
        raw_error = f.obj.get("error")
        error = f.child({} if raw_error is None else raw_error, "error")
        return Failure(
            job,
            error.opt_text("code", limit=MAX_NAME) or "error",
            error.opt_text("message", limit=MAX_TEXT, empty=True) or "",
            error.flag("retryable", False),
            error.obj.get("details"),
        )
    raise f.fail("outcome", '"success" or "failure"')


# ---------------------------------------------------------------- server -> worker


def decode_server_message(data: bytes | str) -> ServerMessage:
    """One text frame from the server (the SDK's side). Raises RotaError."""
    obj = _load(data, None)
    kind, seq = _envelope(obj)
    f = _Fields(obj, "", seq)
    if kind == "assignment":
        return Assignment(_job_copy(f.child(obj.get("job"), "job")), f.flag("logs", False))
    if kind == "welcome":
        timeout = f.opt_number("heartbeat_timeout")
        return Welcome(
            f.text("worker", limit=MAX_ID),
            5.0 if timeout is None else timeout,
            f.opt_integer("max_message") or DEFAULT_MAX_MESSAGE,
            _verdicts(f),
        )
    if kind == "revoke":
        return Revoke(f.text("job", limit=MAX_ID), f.opt_text("reason", limit=MAX_TEXT) or "")
    if kind == "specs":
        return SpecsChanged(_verdicts(f))
    if kind == "ack" and seq is not None:
        return Ack(seq)
    if kind == "error":
        return ErrorMessage(
            f.text("code"),
            f.opt_text("message", limit=MAX_TEXT, empty=True) or "",
            f.flag("fatal", False),
            f.opt_text("job", limit=MAX_ID),
            seq,
        )
    raise RotaError(ErrorCode.UNKNOWN_TYPE, f"unknown message type {kind[:64]!r}", seq=seq)


def _verdicts(f: _Fields) -> tuple[SpecVerdict, ...]:
    return tuple(
        SpecVerdict(
            v.text("name"),
            v.text("checksum", limit=128),
            v.flag("accepted", False),
            v.opt_text("reason"),
        )
        for v in f.objects("specs")
    )


def _job_copy(f: _Fields) -> JobCopy:
    if "payload_base64" in f.obj:
        try:
            payload = base64.b64decode(f.text("payload_base64", limit=2**62, empty=True))
        except (binascii.Error, ValueError):
            raise f.fail("payload_base64", "standard base64") from None
    else:
        payload = f.text("payload", limit=2**62, empty=True).encode("utf-8")
    args = f.obj.get("args", [])
    if not isinstance(args, list):
        raise f.fail("args", "an array")
    max_attempts = f.obj.get("max_attempts")
    return JobCopy(
        id=f.text("id", limit=MAX_ID),
        spec=f.text("spec"),
        queue=f.text("queue"),
        payload=payload,
        args=args,
        priority=f.obj.get("priority", 0) if type(f.obj.get("priority", 0)) is int else 0,
        attempt=f.opt_integer("attempt") or 1,
        max_attempts=max_attempts if type(max_attempts) is int else None,
        created_at=f.opt_text("created_at", limit=64),
        meta=f.obj.get("meta"),
    )
