"""Per-(queue, function) FIFO lanes with priority levels, and per-function bookkeeping.

A lane holds the available jobs of one function in one queue. Gearman looks jobs up by
function, OJS by queue; a lane is the intersection, so both look-ups touch only the lanes
they need. Removal from the middle (cancel) is lazy: the job's state changes and the stale
entry is dropped when it reaches the head, keeping every operation O(1).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Final

from jobwire.engine.job import PRIORITY_HIGH, PRIORITY_LOW, Job, JobState

if TYPE_CHECKING:
    from jobwire.engine.worker import WorkerSession

_AVAILABLE: Final = JobState.AVAILABLE
#: Taken entries a level's list keeps at its front before it is cut down (`Level.take`).
_TRIM_AFTER: Final = 1024


class Level:
    """The queued jobs of one priority in a lane, oldest first (by `seq`).

    A list and the index of its oldest entry, not a deque: compiled, appending to a list
    and indexing it are native operations, while each call of a deque's methods is a
    generic one (about 230 instructions, and a job is appended and taken once each).
    Taken entries are cleared at once, so a finished job is not kept alive here; the list
    is cut down when it runs empty, or when its taken half is large.
    """

    __slots__ = ("_entries", "_first", "priority")

    def __init__(self, priority: int) -> None:
        self.priority = priority
        self._entries: list[Job | None] = []
        self._first = 0  # the index of the oldest entry; those before it were taken

    @property
    def jobs(self) -> list[Job]:
        """The queued entries, oldest first (a copy)."""
        return [job for job in self._entries[self._first :] if job is not None]

    def entries(self) -> Iterator[Job]:
        """The queued entries, oldest first, without copying them (readers that stop early)."""
        entries = self._entries
        for index in range(self._first, len(entries)):
            job = entries[index]
            if job is not None:
                yield job

    def append(self, job: Job) -> None:
        self._entries.append(job)

    def put_back(self, job: Job) -> None:
        """Queue a requeued job ahead of the entries queued after it (by `seq`).

        Only other requeued jobs can be older, so its place is at or near the front: the
        older entries move down one into the free slot before the oldest, as a deque's
        insert near its head would, and no deeper entry moves. Without a free slot, room
        for this and later requeues is made first, once per 1,024 of them.
        """
        entries = self._entries
        first = self._first
        if first == len(entries):  # empty: nothing to keep it behind or ahead of
            entries.append(job)
            return
        if not first:
            entries[:0] = [None] * _TRIM_AFTER
            first = _TRIM_AFTER
        index = first
        end = len(entries)
        while index < end:
            queued = entries[index]
            if queued is not None and queued.seq > job.seq:
                break
            index += 1
        entries[first - 1 : index - 1] = entries[first:index]
        entries[index - 1] = job
        self._first = first - 1

    def withdraw(self, job: Job) -> bool:
        """Remove a queued job, looking from the newest entry back: the jobs withdrawn are
        the newest (`Engine.release`), so this is about as cheap as an append."""
        entries = self._entries
        index = len(entries) - 1
        while index >= self._first:
            if entries[index] is job:
                del entries[index]
                return True
            index -= 1
        return False

    def replace(self, jobs: list[Job]) -> None:
        """Queue these jobs instead of the present entries."""
        self._entries = list(jobs)
        self._first = 0

    def oldest(self) -> Job | None:
        entries = self._entries
        first = self._first
        return entries[first] if first < len(entries) else None

    def take(self) -> None:
        """Remove the oldest entry (there is one)."""
        entries = self._entries
        first = self._first
        entries[first] = None
        first += 1
        if first == len(entries):
            entries.clear()
            first = 0
        elif first >= _TRIM_AFTER and first * 2 >= len(entries):
            del entries[:first]
            first = 0
        self._first = first


class Lane:
    __slots__ = ("count", "function", "levels", "queue", "stale")

    def __init__(self, queue: str, function: FunctionInfo) -> None:
        self.queue = queue
        self.function = function
        # One per priority present, highest first. A lane rarely has more than one or two:
        # a scan finds a level sooner than a dict lookup, and `head` walks them in order.
        self.levels: list[Level] = []
        self.count = 0  # live available jobs
        self.stale = 0  # entries of jobs that left without being popped

    def oldest(self) -> Job | None:
        """The live job that waited longest, whatever its priority (dashboards; not a hot
        path: it skips the stale entries at each level's front)."""
        best: Job | None = None
        for level in self.levels:
            for job in level.entries():
                if job.state is _AVAILABLE:
                    if best is None or job.created_at < best.created_at:
                        best = job
                    break
        return best

    def push(self, job: Job, front: bool = False) -> None:
        """Queue a job; `front` puts a job back (a requeue) ahead of younger ones.

        Each level stays in `seq` order: requeued jobs line up by when they were first
        queued, whatever order they come back in.
        """
        if self.stale > self.count:
            self._compact()
        level = self._level(job.priority)
        if front:
            level.put_back(job)
        else:
            level.append(job)
        self.count += 1

    def _level(self, priority: int) -> Level:
        """The level of `priority`, made in its place if there is none yet."""
        levels = self.levels
        index = 0
        for level in levels:
            if level.priority == priority:
                return level
            if level.priority < priority:
                break
            index += 1
        level = Level(priority)
        levels.insert(index, level)
        return level

    def _compact(self) -> None:
        """Drop stale entries once they outnumber live ones (amortized O(1) per discard)."""
        for level in self.levels:
            level.replace([job for job in level.jobs if job.state is _AVAILABLE])
        self.stale = 0

    def _head_level(self) -> Level | None:
        """The level whose first job goes next; stale entries met on the way are dropped."""
        if not self.count:
            return None
        for level in self.levels:
            job = level.oldest()
            while job is not None:
                if job.state is _AVAILABLE:
                    return level
                level.take()  # stale: cancelled or moved while queued
                self.stale -= 1
                job = level.oldest()
        return None

    def head(self) -> Job | None:
        """The job `pop` would return, without removing it."""
        level = self._head_level()
        return None if level is None else level.oldest()

    def pop(self) -> Job | None:
        level = self._head_level()
        if level is None:
            return None
        self.count -= 1
        job = level.oldest()
        level.take()
        return job

    def discard(self) -> None:
        """Account for a queued job that left without being popped (it stays as a stale entry)."""
        self.count -= 1
        self.stale += 1

    def withdraw(self, job: Job) -> bool:
        """Take a queued job out of the lane (`Level.withdraw`); False if it is not in it."""
        for level in self.levels:
            if level.priority == job.priority:
                if level.withdraw(job):
                    self.count -= 1
                    return True
                return False
        return False

    def clear(self) -> None:
        """Forget every queued job (an admin reset)."""
        self.levels.clear()
        self.count = self.stale = 0

    def count_by_level(self) -> tuple[int, int, int]:
        """Live jobs in Gearman's HIGH, NORMAL and LOW bands."""
        high = normal = low = 0
        for level in self.levels:
            live = sum(1 for job in level.jobs if job.state is _AVAILABLE)
            if level.priority >= PRIORITY_HIGH:
                high += live
            elif level.priority <= PRIORITY_LOW:
                low += live
            else:
                normal += live
        return high, normal, low


class FunctionInfo:
    """A function (Gearman function, OJS type, MDP service): its lanes, workers and limits."""

    __slots__ = (
        "fallback_armed",
        "lanes",
        "name",
        "queue_limits",
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
        self.queue_limits: tuple[int, int, int] | None = None
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
