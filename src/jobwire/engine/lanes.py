"""Per-(queue, function) FIFO lanes with priority levels, and per-function bookkeeping.

A lane holds the available jobs of one function in one queue. Gearman looks jobs up by
function, OJS by queue; a lane is the intersection, so both look-ups touch only the lanes
they need. Removal from the middle (cancel) is lazy: the job's state changes and the stale
entry is dropped when it reaches the head, keeping every operation O(1).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Final

from jobwire.engine.job import PRIORITY_HIGH, PRIORITY_LOW, Job, JobState

if TYPE_CHECKING:
    from jobwire.engine.worker import WorkerSession

_AVAILABLE: Final = JobState.AVAILABLE


class Lane:
    __slots__ = ("count", "function", "levels", "order", "queue", "stale")

    def __init__(self, queue: str, function: FunctionInfo) -> None:
        self.queue = queue
        self.function = function
        self.levels: dict[int, deque[Job]] = {}
        self.order: list[int] = []  # priority levels present, highest first
        self.count = 0  # live available jobs
        self.stale = 0  # entries of jobs that left without being popped

    def push(self, job: Job, front: bool = False) -> None:
        """Queue a job; `front` puts a job back (a requeue) ahead of younger ones.

        Each level stays in `seq` order: requeued jobs line up by when they were first
        queued, whatever order they come back in.
        """
        if self.stale > self.count:
            self._compact()
        level = self.levels.get(job.priority)
        if level is None:
            level = self.levels[job.priority] = deque()
            self.order.append(job.priority)
            self.order.sort(reverse=True)
        if front:
            # Only other requeued jobs can be older, so this scan stays near the head.
            index = 0
            for queued in level:
                if queued.seq > job.seq:
                    break
                index += 1
            level.insert(index, job)
        else:
            level.append(job)
        self.count += 1

    def _compact(self) -> None:
        """Drop stale entries once they outnumber live ones (amortized O(1) per discard)."""
        for priority, level in self.levels.items():
            self.levels[priority] = deque(job for job in level if job.state is _AVAILABLE)
        self.stale = 0

    def head(self) -> Job | None:
        """The job `pop` would return, without removing it."""
        if not self.count:
            return None
        for priority in self.order:
            level = self.levels[priority]
            while level:
                job = level[0]
                if job.state is _AVAILABLE:
                    return job
                level.popleft()  # stale: cancelled or moved while queued
                self.stale -= 1
        return None

    def pop(self) -> Job | None:
        job = self.head()
        if job is not None:
            self.levels[job.priority].popleft()
            self.count -= 1
        return job

    def discard(self) -> None:
        """Account for a queued job that left without being popped (it stays as a stale entry)."""
        self.count -= 1
        self.stale += 1

    def count_by_level(self) -> tuple[int, int, int]:
        """Live jobs in Gearman's HIGH, NORMAL and LOW bands."""
        high = normal = low = 0
        for priority, level in self.levels.items():
            live = sum(1 for job in level if job.state is _AVAILABLE)
            if priority >= PRIORITY_HIGH:
                high += live
            elif priority <= PRIORITY_LOW:
                low += live
            else:
                normal += live
        return high, normal, low


class FunctionInfo:
    """A function (Gearman function, OJS type, MDP service): its lanes, workers and limits."""

    __slots__ = (
        "fallback_armed",
        "lanes",
        "max_queue",
        "name",
        "running",
        "scheduled",
        "waiters",
        "workers",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.lanes: dict[str, Lane] = {}  # queue name -> lane
        self.running = 0
        self.scheduled = 0  # jobs waiting for run_at or a retry time
        self.workers: dict[WorkerSession, None] = {}  # sessions able to run it, in arrival order
        # Sessions asleep or with push credit, waiting to be told about work, in wake order.
        self.waiters: dict[WorkerSession, None] = {}
        # Gearman maxqueue per band (high, normal, low); 0 or less means unlimited.
        self.max_queue: tuple[int, int, int] | None = None
        # A timer will check that woken workers took the work (see Engine._on_wake_fallback).
        self.fallback_armed = False

    def lane(self, queue: str) -> Lane:
        lane = self.lanes.get(queue)
        if lane is None:
            lane = self.lanes[queue] = Lane(queue, self)
        return lane

    @property
    def available(self) -> int:
        return sum(lane.count for lane in self.lanes.values())

    @property
    def total(self) -> int:
        """Queued, scheduled and running: what Gearman's `status` calls TOTAL."""
        return self.available + self.scheduled + self.running
