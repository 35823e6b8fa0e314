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


class Origin(IntEnum):
    """The listener a job was submitted through (`Job.origin`): an integer on the job, a
    name (`ORIGIN_NAMES`) only where one is shown. Stored with the job, so the numbers of
    existing members never change; 0 is a job whose store predates the field."""

    UNKNOWN = 0
    GEARMAN = 1
    OJS = 2  # the OJS HTTP binding
    MAJORDOMO = 3
    TITANIC = 4
    PIRATE = 5
    FREELANCE = 6
    CRON = 7  # fired by a cron entry
    WORKFLOW = 8  # a step or callback of a workflow


#: `Origin` member -> its label (metrics, the dashboard), indexed by the member's value.
ORIGIN_NAMES: Final = tuple(member.name.lower() for member in Origin)

# The values the submit paths pass (plain ints: no enum lookup per job).
ORIGIN_GEARMAN: Final = 1
ORIGIN_OJS: Final = 2
ORIGIN_MAJORDOMO: Final = 3
ORIGIN_TITANIC: Final = 4
ORIGIN_PIRATE: Final = 5
ORIGIN_FREELANCE: Final = 6
ORIGIN_CRON: Final = 7
ORIGIN_WORKFLOW: Final = 8


def origin_name(origin: int) -> str:
    """The label of `Job.origin` (an unknown number from a newer store: "unknown")."""
    return ORIGIN_NAMES[origin] if 0 <= origin < len(ORIGIN_NAMES) else "unknown"


class Output(IntEnum):
    """What kind of output a worker streams to a job's waiting clients before it ends."""

    DATA = 1  # a piece of the result (Gearman WORK_DATA, MDP 0.2 PARTIAL)
    WARNING = 2  # a warning the client may show (Gearman WORK_WARNING)


class Subscriber(Protocol):
    """A foreground client waiting on a job: told of its progress, output and end.

    Typed events, each adapter encodes them for its own wire.
    """

    def job_progress(self, job: Job, done: int, total: int) -> None:
        """The worker reports `done` of `total` steps (non-negative integers)."""

    def job_output(self, job: Job, kind: Output, data: bytes) -> None:
        """The worker streams output before the job ends."""

    def job_finished(
        self, job: Job, state: JobState, result: bytes | None, error: bytes | None
    ) -> None:
        """The job ended in `state` (COMPLETED, CANCELLED, DISCARDED). `result` is the
        completed job's; `error` is what the worker said about a failure, for the client
        (None when it said nothing: a plain failure, a cancel, attempts used up)."""


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
        "origin",
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
        origin: int = 0,
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
        self.progress: tuple[int, int] | None = None  # done, total
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
        self.origin = origin  # an `Origin`: the listener it was submitted through

    @property
    def retries(self) -> int:
        """How often the job went back to the queue after being handed out."""
        if self.state is JobState.ACTIVE or self.state.terminal:
            return max(0, self.attempts - 1)  # the current or last attempt did not go back
        return self.attempts

    def __repr__(self) -> str:
        return f"<Job {self.id} {self.function} {self.state.name} attempts={self.attempts}>"
