"""Rota messages -> bytes (one compact JSON object per WebSocket text frame)."""

from __future__ import annotations

import base64
from typing import Any

import orjson

from jobwire.protocols.rota.messages import (
    NO_VALUE,
    VERSION,
    Ack,
    Assignment,
    ErrorMessage,
    Failure,
    Heartbeat,
    JobCopy,
    Result,
    Revoke,
    ServerMessage,
    SpecsChanged,
    SpecVerdict,
    Status,
    Welcome,
)


def encode(message: Heartbeat | ServerMessage) -> bytes:
    return orjson.dumps(to_json(message))


def to_json(message: Heartbeat | ServerMessage) -> dict[str, Any]:
    """The message as the JSON object that goes on the wire."""
    out: dict[str, Any]
    if isinstance(message, Heartbeat):
        out = _heartbeat(message)
    elif isinstance(message, Assignment):
        out = {"type": "assignment", "job": job_copy_json(message.job), "logs": message.logs}
    elif isinstance(message, Welcome):
        out = {
            "type": "welcome",
            "worker": message.worker,
            "heartbeat_timeout": message.heartbeat_timeout,
            "max_message": message.max_message,
            "specs": [_verdict(v) for v in message.specs],
        }
    elif isinstance(message, Revoke):
        out = {"type": "revoke", "job": message.job, "reason": message.reason}
    elif isinstance(message, SpecsChanged):
        out = {"type": "specs", "specs": [_verdict(v) for v in message.specs]}
    elif isinstance(message, Ack):
        out = {"type": "ack", "seq": message.seq}
    else:
        out = _error(message)
    return {"v": VERSION, **out}


def _error(message: ErrorMessage) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": "error",
        "code": message.code,
        "message": message.message,
        "fatal": message.fatal,
    }
    if message.job is not None:
        out["job"] = message.job
    if message.seq is not None:
        out["seq"] = message.seq
    return out


def _verdict(verdict: SpecVerdict) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": verdict.name,
        "checksum": verdict.checksum,
        "accepted": verdict.accepted,
    }
    if verdict.reason is not None:
        out["reason"] = verdict.reason
    return out


def job_copy_json(job: JobCopy) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": job.id,
        "spec": job.spec,
        "queue": job.queue,
        "args": job.args,
        "priority": job.priority,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "created_at": job.created_at,
    }
    try:
        out["payload"] = job.payload.decode("utf-8")
    except UnicodeDecodeError:
        out["payload_base64"] = base64.b64encode(job.payload).decode("ascii")
    if job.meta is not None:
        out["meta"] = job.meta
    return out


def _heartbeat(hb: Heartbeat) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "heartbeat"}
    if hb.seq is not None:
        out["seq"] = hb.seq
    if hb.register is not None:
        reg = hb.register
        register: dict[str, Any] = {
            "hostname": reg.hostname,
            "os": reg.os,
            "specs": [{"name": s.name, "checksum": s.checksum} for s in reg.specs],
        }
        if reg.pid is not None:
            register["pid"] = reg.pid
        if reg.queues is not None:
            register["queues"] = list(reg.queues)
        out["register"] = register
    if hb.wants is not None:
        out["wants"] = hb.wants
    if hb.status is not None:
        out["status"] = _status(hb.status)
    if hb.results:
        out["results"] = [_result(r) for r in hb.results]
    return out


def _status(status: Status) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if status.cpu is not None:
        out["cpu"] = status.cpu
    if status.ram is not None:
        out["ram"] = status.ram
    if status.progress:
        out["progress"] = [
            {"job": p.job, "current": p.current, "total": p.total} for p in status.progress
        ]
    if status.logs:
        out["logs"] = [{"job": batch.job, "lines": list(batch.lines)} for batch in status.logs]
    if status.alerts:
        alerts = []
        for alert in status.alerts:
            item: dict[str, Any] = {"level": alert.level, "message": alert.message}
            if alert.job is not None:
                item["job"] = alert.job
            alerts.append(item)
        out["alerts"] = alerts
    return out


def _result(result: Result) -> dict[str, Any]:
    if isinstance(result, Failure):
        error: dict[str, Any] = {
            "code": result.code,
            "message": result.message,
            "retryable": result.retryable,
        }
        if result.details is not None:
            error["details"] = result.details
        return {"job": result.job, "outcome": "failure", "error": error}
    if result.value is NO_VALUE:
        data = base64.b64encode(result.result).decode("ascii")
        return {"job": result.job, "outcome": "success", "data_base64": data}
    return {"job": result.job, "outcome": "success", "data": result.value}
