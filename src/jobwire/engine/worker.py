"""Worker sessions: what a connected worker can do, holds, and wants."""

from __future__ import annotations

from enum import IntEnum, StrEnum
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from jobwire.engine.events import Count
    from jobwire.engine.job import Job
    from jobwire.engine.lanes import Lane


class Dispatch(IntEnum):
    """How work reaches a worker."""

    PULL = 1  # the worker asks (Gearman GRAB_JOB, OJS fetch); never notified
    WAKE = 2  # the worker sleeps and is woken to pull (Gearman PRE_SLEEP/NOOP, WMP)
    PUSH = 3  # the engine assigns jobs up to the worker's credit (Rota, Majordomo)


class WorkerState(StrEnum):
    """Lifecycle of the OJS worker protocol; the other protocols stay RUNNING."""

    RUNNING = "running"
    QUIET = "quiet"  # finish what you hold, take nothing new
    TERMINATE = "terminate"
    TERMINATED = "terminated"


class WorkerHandler(Protocol):
    """The adapter side of a session: how the engine reaches the worker's connection."""

    def wake(self) -> None:
        """WAKE dispatch: work is waiting for you (Gearman NOOP)."""

    def assign(self, job: Job) -> None:
        """PUSH dispatch: this job is now leased to you."""

    def revoke(self, job: Job, reason: str) -> None:
        """A job you held was taken back (lease expired, cancelled)."""


class WorkerSession:
    """One worker as the engine sees it, whatever protocol it speaks."""

    __slots__ = (
        "_queues",
        "abilities",
        "capacity",
        "credit",
        "dispatch",
        "handler",
        "id",
        "info",
        "jobs",
        "lanes",
        "lanes_version",
        "last_seen",
        "name",
        "protocol",
        "started",
        "state",
        "waiting",
    )

    def __init__(
        self,
        session_id: str,
        handler: WorkerHandler,
        *,
        protocol: str,
        dispatch: Dispatch = Dispatch.PULL,
        capacity: int | None = None,
    ) -> None:
        self.id = session_id
        self.handler = handler
        self.protocol = protocol
        self.dispatch = dispatch
        self.name = "-"  # Gearman client id, OJS hostname, ...
        #: The event log's counter of jobs started by workers of its protocol (metrics),
        #: found once per session.
        self.started: Count | None = None
        self.abilities: dict[str, float | None] = {}  # function -> lease timeout (s) or None
        self._queues: frozenset[str] | None = None  # restrict to these queues; None: any
        # The lanes it may take jobs from, as of the engine's `lanes_version` (the engine's
        # to keep: see `Engine._best_lane`); version 0: to be worked out again.
        self.lanes: list[Lane] = []
        self.lanes_version = 0
        self.jobs: dict[str, Job] = {}  # held jobs by id
        self.capacity = capacity  # most jobs held at once; None: unlimited
        self.credit = 0  # PUSH: jobs the worker asked for and has not yet been given
        self.state = WorkerState.RUNNING
        self.last_seen = 0.0
        # May be in its functions' waiter lists (the engine's to keep; False: surely not).
        self.waiting = False
        self.info: dict[str, Any] = {}  # registration metadata (host, pid, labels, ...)

    @property
    def queues(self) -> frozenset[str] | None:
        return self._queues

    @queues.setter
    def queues(self, queues: frozenset[str] | None) -> None:
        self._queues = queues
        self.lanes_version = 0

    @property
    def has_room(self) -> bool:
        return self.capacity is None or len(self.jobs) < self.capacity

    def accepts_queue(self, queue: str) -> bool:
        return self.queues is None or queue in self.queues

    def __repr__(self) -> str:
        return f"<WorkerSession {self.id} {self.protocol} {self.dispatch.name}>"
