"""Bytes -> Rota messages: decoded and validated in one step against `wire.py`.

`decode_worker_message` is the server's side (heartbeats); `decode_server_message` is the
worker's (welcome, assignment, revoke, specs, ack, error, state, beat). Both raise `RotaError`
with a code from `errors.ErrorCode`; the code says whether the connection can go on. Unknown
fields are ignored (a newer peer may send more); known fields of the wrong shape are refused,
and the refusal names the field's path (`status.progress[0].current: ...`).

A frame that fails the typed decode is read once more for its envelope (`v`, `type`, `seq`)
to give the code docs/rota.md promises: a wrong `v` is `unsupported_version`, an unknown
`type` is `unknown_type` (not fatal), anything else `invalid_message`.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
import orjson

from jobwire.protocols.json_depth import MAX_DEPTH, too_deep
from jobwire.protocols.rota import wire
from jobwire.protocols.rota.errors import ErrorCode, RotaError
from jobwire.protocols.rota.messages import (
    VERSION,
    Ack,
    Alert,
    Assignment,
    Beat,
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
    SetState,
    SpecRef,
    SpecsChanged,
    SpecVerdict,
    Status,
    Success,
    Welcome,
)

DEFAULT_MAX_MESSAGE = 1024 * 1024

_heartbeats = msgspec.json.Decoder(wire.Heartbeat)
_server_messages: msgspec.json.Decoder[wire.ServerMessage] = msgspec.json.Decoder(
    wire.ServerMessage
)
_envelopes = msgspec.json.Decoder(wire.Envelope)
_AT = re.compile(r"^(.*) - at `\$\.?(.*)`$", re.DOTALL)


def _load(data: bytes | str, max_size: int | None, decoder: msgspec.json.Decoder[Any]) -> Any:
    if max_size is not None and len(data) > max_size:
        raise RotaError(
            ErrorCode.MESSAGE_TOO_BIG, f"message of {len(data)} bytes; the limit is {max_size}"
        )
    # Counting the brackets is two scans in C; only a document with more of them than the
    # depth limit is parsed once more to measure its depth (protocols/json_depth).
    opening = (
        data.count(b"[") + data.count(b"{")
        if isinstance(data, bytes)
        else data.count("[") + data.count("{")
    )
    if opening > MAX_DEPTH:
        try:
            deep = too_deep(data, orjson.loads(data), MAX_DEPTH)
        except orjson.JSONDecodeError as exc:
            raise RotaError(ErrorCode.MALFORMED_JSON, f"not a JSON text: {exc}") from None
        if deep:
            raise RotaError(ErrorCode.INVALID_MESSAGE, f"nested deeper than {MAX_DEPTH} levels")
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise _refusal(data, exc, decoder is _server_messages) from None
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise RotaError(ErrorCode.MALFORMED_JSON, f"not a JSON text: {exc}") from None


def _refusal(data: bytes | str, exc: msgspec.ValidationError, from_server: bool) -> RotaError:
    """Why a JSON frame that failed the typed decode is refused, with the promised code."""
    try:
        envelope = _envelopes.decode(data)
    except msgspec.ValidationError:
        return RotaError(ErrorCode.INVALID_MESSAGE, "a message is a JSON object")
    seq = envelope.seq
    if type(seq) is not int or not 0 <= seq <= wire.MAX_SAFE_INT:
        seq = None
    version = envelope.v
    if type(version) is not int or version != VERSION:
        return RotaError(
            ErrorCode.UNSUPPORTED_VERSION,
            f"this server speaks version {VERSION}; the message has v={version!r}",
            seq=seq,
        )
    kind = envelope.type
    if not isinstance(kind, str):
        return RotaError(ErrorCode.INVALID_MESSAGE, "type must be a string", seq=seq)
    known = kind in wire.SERVER_TYPES if from_server else kind == "heartbeat"
    if not known:
        ignored = "" if from_server else "; ignored"
        return RotaError(
            ErrorCode.UNKNOWN_TYPE, f"unknown message type {kind[:64]!r}{ignored}", seq=seq
        )
    return RotaError(ErrorCode.INVALID_MESSAGE, _described(exc), seq=seq)


def _described(exc: msgspec.ValidationError) -> str:
    """msgspec's "Expected `int`, got `str` - at `$.status.progress[0].current`" as
    "status.progress[0].current: expected `int`, got `str`"."""
    text = str(exc)
    match = _AT.match(text)
    if match is None:
        return text
    what, path = match.groups()
    return f"{path or 'the message'}: {what[:1].lower()}{what[1:]}"


# ---------------------------------------------------------------- worker -> server


def decode_worker_message(
    data: bytes | str, *, max_size: int | None = DEFAULT_MAX_MESSAGE
) -> Heartbeat:
    """One text frame from a worker. Raises RotaError."""
    frame: wire.Heartbeat = _load(data, max_size, _heartbeats)
    seq = frame.seq
    reg = frame.register
    status = frame.status
    results = frame.results
    return Heartbeat(
        seq=seq,
        register=None if reg is None else _registration(reg),
        wants=frame.wants,
        status=None if status is None else _status(status),
        results=() if not results else tuple(_result(r, i, seq) for i, r in enumerate(results)),
    )


def _registration(reg: wire.Register) -> Registration:
    return Registration(
        hostname=reg.hostname or "",
        os=reg.os or "",
        pid=reg.pid,
        queues=reg.queues,
        specs=tuple(SpecRef(s.name, s.checksum) for s in reg.specs or ()),
        revision=reg.revision or 1,
    )


def _status(status: wire.Status) -> Status:
    return Status(
        cpu=status.cpu,
        ram=status.ram,
        progress=tuple(Progress(p.job, p.current, p.total) for p in status.progress or ()),
        logs=tuple(LogBatch(b.job, b.lines or ()) for b in status.logs or ()),
        alerts=tuple(Alert(a.level, a.message, a.job) for a in status.alerts or ()),
    )


def result_bytes(value: Any) -> bytes:
    """The engine's bytes for a JSON `data` value (the SDK's payload rule)."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if value is None:
        return b""
    return orjson.dumps(value)


def _result(result: wire.Success | wire.Failure, index: int, seq: int | None) -> Result:
    if isinstance(result, wire.Success):
        raw = result.data_base64
        data = result.data
        if raw is not msgspec.UNSET:
            if data is not msgspec.UNSET:
                raise _field(index, "data", "absent when data_base64 is given", seq)
            return Success(result.job, raw)
        value = None if data is msgspec.UNSET else data
        try:
            return Success(result.job, result_bytes(value), value)
        except TypeError:  # orjson writes 64-bit integers; the job's result must be writable
            raise _field(index, "data", "JSON whose integers fit in 64 bits", seq) from None
    error = result.error or _NO_ERROR
    details = error.details
    if details is not None and not isinstance(details, str | bool | float):
        try:
            orjson.dumps(details)
        except TypeError:
            raise _field(
                index, "error.details", "JSON whose integers fit in 64 bits", seq
            ) from None
    return Failure(result.job, error.code or "error", error.message or "", error.retryable, details)


_NO_ERROR = wire.ResultError()


def _field(index: int, name: str, what: str, seq: int | None) -> RotaError:
    return RotaError(ErrorCode.INVALID_MESSAGE, f"results[{index}].{name} must be {what}", seq=seq)


# ---------------------------------------------------------------- server -> worker


def decode_server_message(data: bytes | str) -> ServerMessage:
    """One text frame from the server (the SDK's side). Raises RotaError."""
    frame: wire.ServerMessage = _load(data, None, _server_messages)
    if isinstance(frame, wire.Assignment):
        return Assignment(_job_copy(frame.job), frame.logs)
    if isinstance(frame, wire.Ack):
        return Ack(frame.seq)
    if isinstance(frame, wire.Beat):
        return Beat()
    if isinstance(frame, wire.Revoke):
        return Revoke(frame.job, frame.reason)
    if isinstance(frame, wire.SetState):
        return SetState(frame.state)
    if isinstance(frame, wire.Welcome):
        return Welcome(
            frame.worker,
            frame.heartbeat_timeout,
            frame.max_message,
            _verdicts(frame.specs),
            frame.revision or 1,
            frame.beat_interval,
        )
    if isinstance(frame, wire.Specs):
        return SpecsChanged(_verdicts(frame.specs))
    return ErrorMessage(frame.code, frame.message, frame.fatal, frame.job, frame.seq)


def _verdicts(verdicts: tuple[wire.SpecVerdict, ...]) -> tuple[SpecVerdict, ...]:
    return tuple(SpecVerdict(v.name, v.checksum, v.accepted, v.reason) for v in verdicts)


def _job_copy(job: wire.JobCopy) -> JobCopy:
    if job.payload_base64 is not msgspec.UNSET:
        payload = job.payload_base64
    elif job.payload is not msgspec.UNSET:
        payload = job.payload.encode("utf-8")
    else:
        payload = b""
    return JobCopy(
        id=job.id,
        spec=job.spec,
        queue=job.queue,
        payload=payload,
        args=job.args,
        priority=job.priority,
        attempt=job.attempt or 1,
        max_attempts=job.max_attempts,
        created_at=job.created_at,
        meta=job.meta,
    )
