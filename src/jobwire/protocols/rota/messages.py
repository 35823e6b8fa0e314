"""Rota messages as small immutable classes (docs/rota.md is the wire reference).

Worker -> server: `Heartbeat` only. Its parts decide its role: `register` (the first heartbeat),
`status` (machine load, job progress, logs, alerts), `results`, and `wants`.
Server -> worker: `Welcome`, `Assignment`, `Revoke`, `SpecsChanged`, `Ack`, `ErrorMessage`, and
(revision 2) `SetState` and `Beat`. These are what the code works with; the wire shapes, with
their limits, are declared in `wire.py`. They are msgspec Structs too, because building them
is most of what decoding a heartbeat costs (a fifth of the price of a frozen dataclass).
"""

from __future__ import annotations

from typing import Any

from msgspec import Struct, field

from jobwire.protocols.rota.wire import VERSION as VERSION  # it lives with the wire shapes


class SpecRef(Struct, frozen=True):
    """A job spec a worker implements: its name and the checksum of its canonical form."""

    name: str
    checksum: str


class Registration(Struct, frozen=True):
    hostname: str
    os: str
    pid: int | None
    #: Queues to take work from; None takes every queue its specs' jobs are in.
    queues: tuple[str, ...] | None
    specs: tuple[SpecRef, ...]
    #: The schema revision the worker speaks (wire.REVISION); 2 and later get `beat`s.
    revision: int = 1


class Progress(Struct, frozen=True):
    job: str
    current: int
    total: int


class LogBatch(Struct, frozen=True):
    job: str
    lines: tuple[str, ...]


ALERT_LEVELS = ("info", "warning", "error", "critical")


class Alert(Struct, frozen=True):
    level: str
    message: str
    job: str | None = None


class Status(Struct, frozen=True):
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


class Success(Struct, frozen=True):
    job: str
    #: The result as the engine keeps it (bytes): str -> UTF-8, null -> empty, base64 -> decoded,
    #: any other JSON value -> its compact JSON.
    result: bytes
    #: The JSON value sent as `data` (NO_VALUE when the worker sent `data_base64`).
    value: Any = NO_VALUE


class Failure(Struct, frozen=True):
    job: str
    code: str
    message: str
    #: Run the job again (within its attempts); by default a failure is final.
    retryable: bool = False
    details: Any = None


Result = Success | Failure


class Heartbeat(Struct, frozen=True):
    seq: int | None = None
    register: Registration | None = None
    #: How many jobs the worker wants to hold at once, counting those it holds; None: unchanged.
    wants: int | None = None
    status: Status | None = None
    results: tuple[Result, ...] = ()


# ---------------------------------------------------------------- server -> worker


class SpecVerdict(Struct, frozen=True):
    name: str
    checksum: str
    accepted: bool
    reason: str | None = None  # "checksum_mismatch" | "not_registered"


class Welcome(Struct, frozen=True):
    worker: str
    heartbeat_timeout: float
    max_message: int
    specs: tuple[SpecVerdict, ...] = ()
    #: Revision 2: the server's revision, and how often at least it sends something (a
    #: `beat` when it has nothing else to say); None: the server does not beat.
    revision: int = 1
    beat_interval: float | None = None


class JobCopy(Struct, frozen=True):
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


class Assignment(Struct, frozen=True):
    job: JobCopy
    logs: bool = False


class Revoke(Struct, frozen=True):
    """A job the worker held was taken back (cancelled, or its lease expired): stop it."""

    job: str
    reason: str


class SpecsChanged(Struct, frozen=True):
    """The registered specs changed: the worker's verdicts now."""

    specs: tuple[SpecVerdict, ...]


class ErrorMessage(Struct, frozen=True):
    code: str
    message: str
    fatal: bool = False
    job: str | None = None
    seq: int | None = None


class Ack(Struct, frozen=True):
    """The results of the worker's heartbeat `seq` are durable: a server that restarts now
    will not run those jobs again."""

    seq: int


WORKER_STATES = ("running", "quiet", "terminate")


class SetState(Struct, frozen=True):
    """Revision 2: an operator directs the worker (one of WORKER_STATES). `quiet`: finish the
    held jobs, take no new ones; `running`: take jobs again; `terminate`: finish and exit."""

    state: str


class Beat(Struct, frozen=True):
    """Revision 2: the server is alive; sent when it had nothing else to say for a while."""


ServerMessage = Welcome | Assignment | Revoke | SpecsChanged | Ack | ErrorMessage | SetState | Beat
