"""The job record and its states.

Jobs are the most numerous objects in the server (millions may be queued), so `Job` is a
slotted class whose rarely used fields default to None instead of holding containers.
"""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING, Any, Final, Protocol

from mypy_extensions import mypyc_attr

if TYPE_CHECKING:
    from jobwire.engine.worker import WorkerSession


class JobState(IntEnum):
    """States follow the Open Job Spec, a superset of what the other protocols need."""

    SCHEDULED = 1  # waiting for run_at
    PENDING = 2  # staged until activated
    AVAILABLE = 3  # queued, may be handed out
    ACTIVE = 4  # leased to a worker
    RETRYABLE = 5  # failed, waiting for its retry time
    COMPLETED = 6
    CANCELLED = 7
    DISCARDED = 8  # failed for good (dead letter when the job asks for it)

    @property
    def terminal(self) -> bool:
        return self >= JobState.COMPLETED


# Enum member lookups cost ~0.1 us in Python 3.11; Job() runs once per submitted job.
_AVAILABLE: Final = JobState.AVAILABLE

TERMINAL_STATES = frozenset({JobState.COMPLETED, JobState.CANCELLED, JobState.DISCARDED})

# Engine priorities are integers, higher runs first (OJS). Gearman's three levels map here.
PRIORITY_HIGH: Final = 1
PRIORITY_NORMAL: Final = 0
PRIORITY_LOW: Final = -1


class JobEvent(IntEnum):
    """What a subscriber (a waiting foreground client) is told about its job."""

    DATA = 1
    WARNING = 2
    STATUS = 3
    COMPLETE = 4
    FAIL = 5
    EXCEPTION = 6


class Subscriber(Protocol):
    """A foreground client waiting on a job's progress and result."""

    def job_event(self, job: Job, event: JobEvent, data: bytes) -> None: ...


# Compiled, a Job is not tracked by the cyclic garbage collector (interpreted, this does
# nothing). Queued jobs are the most numerous objects in the server, and every young and
# middle collection walked each new one, some 10 % of a pipelined enqueue's CPU. A job is
# never part of a reference cycle that outlives it: the links back to it (its worker's
# `jobs`, its subscribers' waiting lists) are cut when it ends (`Engine._release`,
# `_finish`, `unsubscribe`), and `ext` and `error` hold decoded JSON, strings or bytes.
@mypyc_attr(acyclic=True)
class Job:
    """One unit of work. Every state change goes through the engine, never directly."""

    __slots__ = (
        "attempts",
        "background",
        "created_at",
        "error",
        "ext",
        "finished_at",
        "function",
        "id",
        "lease_deadline",
        "lease_timeout",
        "max_attempts",
        "number",
        "payload",
        "priority",
        "progress",
        "queue",
        "reducer",
        "result",
        "row",
        "run_at",
        "seq",
        "started_at",
        "state",
        "subscribers",
        "unique",
        "worker",
    )

    def __init__(
        self,
        job_id: str,
        function: str,
        payload: bytes,
        # Positional-or-keyword: the submit hot paths pass them positionally (cheaper).
        queue: str | None = None,
        unique: str | None = None,
        priority: int = PRIORITY_NORMAL,
        background: bool = True,
        created_at: float = 0.0,
    ) -> None:
        self.id = job_id
        self.function = function
        # Jobs submitted by function name (Gearman, MDP) live in the queue of that name.
        self.queue = function if queue is None else queue
        self.unique = unique
        self.payload = payload
        self.priority = priority
        self.state = _AVAILABLE
        self.seq = 0  # enqueue order; FIFO tie-break across lanes
        self.attempts = 0  # times handed to a worker
        self.max_attempts: int | None = None  # None: unlimited
        self.background = background
        self.run_at: float | None = None
        self.lease_deadline: float | None = None
        self.lease_timeout: float | None = None  # seconds a worker may hold it
        self.worker: WorkerSession | None = None
        self.subscribers: list[Subscriber] | None = None
        self.progress: tuple[bytes, bytes] | None = None  # numerator, denominator
        self.result: bytes | None = None
        self.error: Any = None
        self.created_at = created_at
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self.reducer: str | None = None
        # Protocol-specific attributes (an OJS envelope's extra fields, retry policy, ...).
        self.ext: dict[str, Any] | None = None
        self.row = 0  # the durable store's key for the job, given on first save; 0: none
        self.number = 0  # N of an id the engine made (PREFIX:N); 0: an id chosen by a client

    @property
    def retries(self) -> int:
        """How often the job went back to the queue after being handed out."""
        if self.state is JobState.ACTIVE or self.state.terminal:
            return max(0, self.attempts - 1)  # the current or last attempt did not go back
        return self.attempts

    def __repr__(self) -> str:
        return f"<Job {self.id} {self.function} {self.state.name} attempts={self.attempts}>"
