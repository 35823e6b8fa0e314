"""Rota messages -> bytes (one compact JSON object per WebSocket text frame).

Each message is built as its `wire.py` Struct and written by msgspec, so what goes out has
the shape the decoder and the published schema describe.
"""

from __future__ import annotations

from typing import Any

import msgspec

from jobwire.protocols.rota import wire
from jobwire.protocols.rota.messages import (
    NO_VALUE,
    VERSION,
    Ack,
    Assignment,
    Beat,
    ErrorMessage,
    Failure,
    Heartbeat,
    JobCopy,
    Result,
    Revoke,
    ServerMessage,
    SetState,
    SpecsChanged,
    SpecVerdict,
    Status,
    Welcome,
)

_encoder = msgspec.json.Encoder()
_BEAT = _encoder.encode(wire.Beat(v=VERSION))


def encode(message: Heartbeat | ServerMessage) -> bytes:
    if isinstance(message, Beat):
        return _BEAT
    return _encoder.encode(to_wire(message))


def to_json(message: Heartbeat | ServerMessage) -> dict[str, Any]:
    """The message as the JSON object that goes on the wire."""
    value: dict[str, Any] = msgspec.to_builtins(to_wire(message))
    return value


def to_wire(message: Heartbeat | ServerMessage) -> wire.Heartbeat | wire.ServerMessage:
    """The message as its wire Struct."""
    if isinstance(message, Heartbeat):
        return _heartbeat(message)
    if isinstance(message, Assignment):
        return wire.Assignment(v=VERSION, job=_job_copy(message.job), logs=message.logs)
    if isinstance(message, Ack):
        return wire.Ack(v=VERSION, seq=message.seq)
    if isinstance(message, Welcome):
        return wire.Welcome(
            v=VERSION,
            worker=message.worker,
            heartbeat_timeout=message.heartbeat_timeout,
            max_message=message.max_message,
            specs=_verdicts(message.specs),
            revision=message.revision if message.revision > 1 else None,
            beat_interval=message.beat_interval,
        )
    if isinstance(message, Revoke):
        return wire.Revoke(v=VERSION, job=message.job, reason=message.reason)
    if isinstance(message, SpecsChanged):
        return wire.Specs(v=VERSION, specs=_verdicts(message.specs))
    if isinstance(message, SetState):
        return wire.SetState(v=VERSION, state=message.state)  # type: ignore[arg-type]
    if isinstance(message, Beat):
        return wire.Beat(v=VERSION)
    return _error(message)


def _error(message: ErrorMessage) -> wire.Error:
    return wire.Error(
        v=VERSION,
        code=message.code,
        message=message.message,
        fatal=message.fatal,
        job=message.job,
        seq=message.seq,
    )


def _verdicts(verdicts: tuple[SpecVerdict, ...]) -> tuple[wire.SpecVerdict, ...]:
    return tuple(
        wire.SpecVerdict(
            name=v.name,
            checksum=v.checksum,
            accepted=v.accepted,
            reason=v.reason,
        )
        for v in verdicts
    )


def _job_copy(job: JobCopy) -> wire.JobCopy:
    try:
        text: str | msgspec.UnsetType = job.payload.decode("utf-8")
        raw: bytes | msgspec.UnsetType = msgspec.UNSET
    except UnicodeDecodeError:
        text, raw = msgspec.UNSET, job.payload
    return wire.JobCopy(
        id=job.id,
        spec=job.spec,
        queue=job.queue,
        args=job.args,
        priority=job.priority,
        attempt=job.attempt,
        max_attempts=job.max_attempts,
        created_at=job.created_at,
        payload=text,
        payload_base64=raw,
        meta=job.meta,
    )


def job_copy_json(job: JobCopy) -> dict[str, Any]:
    value: dict[str, Any] = msgspec.to_builtins(_job_copy(job))
    return value


def _heartbeat(hb: Heartbeat) -> wire.Heartbeat:
    register = None
    if hb.register is not None:
        reg = hb.register
        register = wire.Register(
            hostname=reg.hostname,
            os=reg.os,
            pid=reg.pid,
            queues=reg.queues,
            specs=tuple(wire.SpecRef(name=s.name, checksum=s.checksum) for s in reg.specs),
            revision=reg.revision if reg.revision > 1 else None,
        )
    return wire.Heartbeat(
        v=VERSION,
        type="heartbeat",
        seq=hb.seq,
        register=register,
        wants=hb.wants,
        status=None if hb.status is None else _status(hb.status),
        results=tuple(_result(r) for r in hb.results) if hb.results else None,
    )


def _status(status: Status) -> wire.Status:
    return wire.Status(
        cpu=status.cpu,
        ram=status.ram,
        progress=tuple(
            wire.Progress(job=p.job, current=p.current, total=p.total) for p in status.progress
        )
        or None,
        logs=tuple(wire.LogBatch(job=b.job, lines=b.lines) for b in status.logs) or None,
        alerts=tuple(
            wire.Alert(level=a.level, message=a.message, job=a.job)  # type: ignore[arg-type]
            for a in status.alerts
        )
        or None,
    )


def _result(result: Result) -> wire.Success | wire.Failure:
    if isinstance(result, Failure):
        return wire.Failure(
            job=result.job,
            error=wire.ResultError(
                code=result.code,
                message=result.message,
                retryable=result.retryable,
                details=result.details,
            ),
        )
    if result.value is NO_VALUE:
        return wire.Success(job=result.job, data_base64=result.result)
    return wire.Success(job=result.job, data=result.value)
