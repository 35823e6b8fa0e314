"""Rota messages as small immutable classes (docs/rota.md is the wire reference).

Worker -> server: `Heartbeat` only. Its parts decide its role: `register` (the first heartbeat),
`status` (machine load, job progress, logs, alerts), `results`, and `wants`.
Server -> worker: `Welcome`, `Assignment`, `Revoke`, `SpecsChanged`, `ErrorMessage`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

VERSION = 1


@dataclass(frozen=True, slots=True)
class SpecRef:
    """A job spec a worker implements: its name and the checksum of its canonical form."""

    name: str
    checksum: str


@dataclass(frozen=True, slots=True)
class Registration:
    hostname: str
    os: str
    pid: int | None
    #: Queues to take work from; None takes every queue its specs' jobs are in.
    queues: tuple[str, ...] | None
    specs: tuple[SpecRef, ...]


@dataclass(frozen=True, slots=True)
class Progress:
    job: str
    current: int
    total: int


@dataclass(frozen=True, slots=True)
class LogBatch:
    job: str
    lines: tuple[str, ...]


ALERT_LEVELS = ("info", "warning", "error", "critical")


@dataclass(frozen=True, slots=True)
class Alert:
    level: str
    message: str
    job: str | None = None


@dataclass(frozen=True, slots=True)
class Status:
    cpu: float | None = None  # percent of one core (may exceed 100)
    ram: int | None = None  # resident bytes
    progress: tuple[Progress, ...] = ()
    logs: tuple[LogBatch, ...] = ()
    alerts: tuple[Alert, ...] = ()


class _NoValue:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NO_VALUE"


#: Marks a Success whose data came as `data_base64`: there is no JSON value to show.
NO_VALUE: Any = _NoValue()


@dataclass(frozen=True, slots=True)
class Success:
    job: str
    #: The result as the engine keeps it (bytes): str -> UTF-8, null -> empty, base64 -> decoded,
    #: any other JSON value -> its compact JSON.
    result: bytes
    #: The JSON value sent as `data` (NO_VALUE when the worker sent `data_base64`).
    value: Any = NO_VALUE


@dataclass(frozen=True, slots=True)
class Failure:
    job: str
    code: str
    message: str
    #: Run the job again (within its attempts); by default a failure is final.
    retryable: bool = False
    details: Any = None


Result = Success | Failure


@dataclass(frozen=True, slots=True)
class Heartbeat:
    seq: int | None = None
    register: Registration | None = None
    #: How many jobs the worker wants to hold at once, counting those it holds; None: unchanged.
    wants: int | None = None
    status: Status | None = None
    results: tuple[Result, ...] = ()


# ---------------------------------------------------------------- server -> worker


@dataclass(frozen=True, slots=True)
class SpecVerdict:
    name: str
    checksum: str
    accepted: bool
    reason: str | None = None  # "checksum_mismatch" | "not_registered"


@dataclass(frozen=True, slots=True)
class Welcome:
    worker: str
    heartbeat_timeout: float
    max_message: int
    specs: tuple[SpecVerdict, ...] = ()


@dataclass(frozen=True, slots=True)
class JobCopy:
    id: str
    spec: str
    queue: str
    payload: bytes
    args: list[Any] = field(default_factory=list)
    priority: int = 0
    attempt: int = 1
    max_attempts: int | None = None
    created_at: str | None = None
    meta: Any = None


@dataclass(frozen=True, slots=True)
class Assignment:
    job: JobCopy
    logs: bool = False


@dataclass(frozen=True, slots=True)
class Revoke:
    """A job the worker held was taken back (cancelled, or its lease expired): stop it."""

    job: str
    reason: str


@dataclass(frozen=True, slots=True)
class SpecsChanged:
    """The registered specs changed: the worker's verdicts now."""

    specs: tuple[SpecVerdict, ...]


@dataclass(frozen=True, slots=True)
class ErrorMessage:
    code: str
    message: str
    fatal: bool = False
    job: str | None = None
    seq: int | None = None


@dataclass(frozen=True, slots=True)
class Ack:
    """The results of the worker's heartbeat `seq` are durable: a server that restarts now
    will not run those jobs again."""

    seq: int


ServerMessage = Welcome | Assignment | Revoke | SpecsChanged | Ack | ErrorMessage
