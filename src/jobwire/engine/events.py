"""The event log: a bounded, in-memory record of job lifecycle events, whatever the protocol.

The engine records every job transition in its `EventLog` (`Engine.event_log`, called
directly) and tells its other observers (`Engine.observers`). The log keeps the newest
`capacity` events in a ring, each with the job's fields as they were when the event happened
(the job keeps changing afterwards). Adapters read it (OJS `GET /ojs/v1/events`) by type,
queue and a sequence cursor. The log is not written on every event (that would cost the hot
path a store write per transition): its owner saves a snapshot at shutdown and restores it
at start (`snapshot`, `restore`), so a clean restart keeps it; a crash loses what came
after the last snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from typing import Any

from jobwire.engine.job import Job, JobState

#: Event names the engine emits for jobs; adapters may record others (cron.*, workflow.*).
JOB_EVENTS = (
    "job.enqueued",
    "job.scheduled",
    "job.started",
    "job.retrying",
    "job.completed",
    "job.discarded",
    "job.cancelled",
)


#: Upper bounds (seconds) of the wait and run time histograms' buckets; one more counts the
#: rest (`Histogram`).
TIME_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
)  # fmt: skip


class Histogram:
    """Observations counted per bucket (not cumulative: the exporter adds them up), and
    their sum. The bucket is found by a binary search over native floats (compiled: a few
    comparisons, no call), so an observation costs the hot path a handful of instructions."""

    __slots__ = ("_bounds", "bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...] | None = None) -> None:
        self.bounds: tuple[float, ...] = TIME_BUCKETS if bounds is None else bounds
        self._bounds: list[float] = list(self.bounds)
        self.counts: list[int] = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        bounds = self._bounds
        low = 0
        high = len(bounds)
        while low < high:  # the first bound >= value (bisect_left): its bucket holds it
            mid = (low + high) >> 1
            if bounds[mid] < value:
                low = mid + 1
            else:
                high = mid
        self.counts[low] += 1
        self.total += value


class TimeHistogram:
    """A `Histogram` over `TIME_BUCKETS` for the hot path (job wait and run times, several
    observations per job): one plain integer field per bucket, found by comparing the value
    with the bounds written out as constants. Compiled, an observation is a few float
    comparisons and one integer increment. (A list of counts, as `Histogram` keeps, boxes
    every count: an observation then costs a lookup, a generic add and an allocation,
    about 700 instructions against some 30 here.)"""

    __slots__ = (
        "_b0",
        "_b1",
        "_b2",
        "_b3",
        "_b4",
        "_b5",
        "_b6",
        "_b7",
        "_b8",
        "_b9",
        "_b10",
        "_b11",
        "_b12",
        "_b13",
        "_b14",
        "_b15",
        "_b16",
        "_b17",
        "_b18",
        "_b19",
        "bounds",
        "total",
    )

    def __init__(self) -> None:
        self.bounds = TIME_BUCKETS
        self._b0 = 0
        self._b1 = 0
        self._b2 = 0
        self._b3 = 0
        self._b4 = 0
        self._b5 = 0
        self._b6 = 0
        self._b7 = 0
        self._b8 = 0
        self._b9 = 0
        self._b10 = 0
        self._b11 = 0
        self._b12 = 0
        self._b13 = 0
        self._b14 = 0
        self._b15 = 0
        self._b16 = 0
        self._b17 = 0
        self._b18 = 0
        self._b19 = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.total += value
        # Most jobs wait and run briefly: the short bounds come first.
        if value <= 0.0005:
            self._b0 += 1
        elif value <= 0.001:
            self._b1 += 1
        elif value <= 0.0025:
            self._b2 += 1
        elif value <= 0.005:
            self._b3 += 1
        elif value <= 0.01:
            self._b4 += 1
        elif value <= 0.025:
            self._b5 += 1
        elif value <= 0.05:
            self._b6 += 1
        elif value <= 0.1:
            self._b7 += 1
        elif value <= 0.25:
            self._b8 += 1
        elif value <= 0.5:
            self._b9 += 1
        elif value <= 1.0:
            self._b10 += 1
        elif value <= 2.5:
            self._b11 += 1
        elif value <= 5.0:
            self._b12 += 1
        elif value <= 10.0:
            self._b13 += 1
        elif value <= 30.0:
            self._b14 += 1
        elif value <= 60.0:
            self._b15 += 1
        elif value <= 300.0:
            self._b16 += 1
        elif value <= 900.0:
            self._b17 += 1
        elif value <= 3600.0:
            self._b18 += 1
        else:
            self._b19 += 1

    @property
    def counts(self) -> list[int]:
        """Per bucket, as `Histogram.counts` (scrape time)."""
        return [
            self._b0,
            self._b1,
            self._b2,
            self._b3,
            self._b4,
            self._b5,
            self._b6,
            self._b7,
            self._b8,
            self._b9,
            self._b10,
            self._b11,
            self._b12,
            self._b13,
            self._b14,
            self._b15,
            self._b16,
            self._b17,
            self._b18,
            self._b19,
        ]


class Count:
    """One plain integer a hot path increments in place (compiled: a native field; a
    one-element list would box the count anew at every increment)."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


class Tally:
    """Job events of one queue, function and origin (`Job.origin`) since start: plain
    integers the hot path increments. The exporter turns them into labelled series when it
    is scraped (`EventLog.tallies`)."""

    def __init__(self, queue: str, function: str, origin: int) -> None:
        self.queue = queue
        self.function = function
        self.origin = origin
        self.enqueued = 0
        self.scheduled = 0
        self.started = 0
        self.retried = 0
        self.completed = 0
        self.failed = 0  # discarded after running
        self.expired = 0  # discarded before it ever ran
        self.cancelled = 0

    def by_event(self) -> dict[str, int]:
        """Event name -> count (`TALLY_EVENTS`); read at scrape time."""
        return {
            "job.enqueued": self.enqueued,
            "job.scheduled": self.scheduled,
            "job.started": self.started,
            "job.retrying": self.retried,
            "job.completed": self.completed,
            "job.discarded": self.failed,
            "job.expired": self.expired,
            "job.cancelled": self.cancelled,
        }


#: The job events a `Tally` counts (`Tally.by_event`): job.discarded after running, and
#: job.expired, a job discarded before it ever ran, apart.
TALLY_EVENTS = (*JOB_EVENTS, "job.expired")


def _state_names() -> tuple[str, ...]:
    names = [""] * (max(JobState) + 1)
    for state in JobState:
        names[state] = state.name.lower()
    return tuple(names)


#: Each job state's name as events show it, by its number (no enum lookup per event).
_STATE_NAMES = _state_names()


class Event:
    """One event as readers see it. A plain class with its own `__init__`: a snapshot makes
    one per event held, and mypyc leaves a dataclass's generated `__init__` interpreted (a
    frozen one sets each field through `object.__setattr__`), several times the cost."""

    def __init__(
        self,
        seq: int,
        type: str,
        time: float,
        subject: str,
        queue: str | None,
        data: dict[str, Any] | None = None,
    ) -> None:
        self.seq = seq  # grows by one per event: a cursor for readers
        self.type = type
        self.time = time
        self.subject = subject  # the job id, cron name, workflow id, ...
        self.queue = queue
        self.data: dict[str, Any] = {} if data is None else data

    def __repr__(self) -> str:
        return (
            f"Event(seq={self.seq!r}, type={self.type!r}, time={self.time!r},"
            f" subject={self.subject!r}, queue={self.queue!r}, data={self.data!r})"
        )


class EventLog:
    """The newest `capacity` events; `capacity` 0 records nothing.

    A ring of preallocated columns, one list per field: a job event (the engine emits
    several per job, on every protocol's hot path) is stored by overwriting slots, so
    recording one allocates no record and leaves nothing for the garbage collector to
    walk. Other events (`record`: cron, workflows) are kept whole in their own column.
    An event's sequence number follows from its slot: numbers grow by one per event.
    """

    def __init__(self, capacity: int = 10_000, *, clock: Callable[[], float]) -> None:
        self.capacity = capacity
        self.clock = clock
        size = max(1, capacity)
        self._size = size
        self._next = 0  # the slot the next event goes to
        self._held = 0  # events in the ring, at most `size`
        self._last_seq = 0  # the sequence number of the newest event
        self._types: list[str] = [""] * size
        self._times: list[float] = [0.0] * size
        # A job event keeps the job (its id, function, queue and priority never change) and
        # what changes: its state, attempts, worker (job.started) and run time (its end).
        self._jobs: list[Job | None] = [None] * size
        self._queues: list[str | None] = [None] * size
        self._attempts: list[int] = [0] * size
        self._states: list[JobState] = [JobState.AVAILABLE] * size
        self._durations: list[float | None] = [None] * size  # seconds it ran (its end)
        self._workers: list[str | None] = [None] * size
        self._records: list[Event | None] = [None] * size  # None: a job event
        #: Job events by queue, function and origin since start (metrics), each tally found
        #: once per run of events of one queue, function and origin (`_tally_of`).
        self._tallies: dict[tuple[str, str, int], Tally] = {}
        self._last_tally = Tally("", "", -1)  # matches no job
        #: Jobs handed to a worker, by the worker's protocol: one counter per protocol, which
        #: each worker session holds (`WorkerSession.started`), so counting is one increment.
        self._started_by_protocol: dict[str, Count] = {}
        #: Seconds from submission to a worker, per attempt.
        self.wait_times = TimeHistogram()
        #: Seconds from a worker taking a job to its end (completed, failed, retried).
        self.run_times = TimeHistogram()

    def __len__(self) -> int:
        return self._held

    @property
    def last_seq(self) -> int:
        """The sequence number of the newest event (0 before the first)."""
        return self._last_seq

    def observe(self, event: str, job: Job, at: float = 0.0) -> None:
        """Record a job event (`Engine.event_log`; this runs for every job). `at`: when it
        happened; 0: the time the engine just set on the job (its creation, start or end),
        read from the clock for the others."""
        tally = self._last_tally
        # The events of a read, and of one function's traffic, share their strings: two
        # pointer comparisons find the tally (compiled: no call, no hashing).
        if (
            job.function is not tally.function
            or job.queue is not tally.queue
            or job.origin != tally.origin
        ):
            tally = self._last_tally = self._tally_of(job)
        ran = -1.0  # seconds it ran (an end); -1: none (a native float: no box unless kept)
        worker_name: str | None = None
        if event == "job.enqueued":
            tally.enqueued += 1
            if not at:
                at = job.created_at
        elif event == "job.started":
            tally.started += 1
            started = job.started_at
            if started is not None:
                self.wait_times.observe(started - job.created_at)
                if not at:
                    at = started
            worker = job.worker
            if worker is not None:
                worker_name = worker.name
                cell = worker.started
                if cell is None:
                    cell = worker.started = self._protocol_cell(worker.protocol)
                cell.n += 1
        elif event == "job.completed" or event == "job.discarded" or event == "job.cancelled":
            if event == "job.completed":
                tally.completed += 1
            elif event == "job.cancelled":
                tally.cancelled += 1
            elif job.attempts:
                tally.failed += 1
            else:
                tally.expired += 1  # discarded before it ever ran (counted apart)
            finished = job.finished_at
            if finished is not None and not at:
                at = finished
            ran = self._ran(job, finished)
        elif event == "job.retrying":
            tally.retried += 1
            ran = self._ran(job, None)
        elif event == "job.scheduled":
            tally.scheduled += 1
            if not at:
                at = job.created_at
        if not self.capacity:
            return
        slot = self._next
        self._types[slot] = event
        self._times[slot] = at or self.clock()
        self._jobs[slot] = job
        self._queues[slot] = job.queue
        self._attempts[slot] = job.attempts
        self._states[slot] = job.state
        self._durations[slot] = ran if ran >= 0.0 else None
        self._workers[slot] = worker_name
        self._records[slot] = None
        self._advance()

    def _ran(self, job: Job, finished: float | None) -> float:
        """How long the job ran, into the run time histogram (-1: it never started)."""
        started = job.started_at
        if started is None:
            return -1.0
        ran = (finished or self.clock()) - started
        self.run_times.observe(ran)
        return ran

    def _protocol_cell(self, protocol: str) -> Count:
        cell = self._started_by_protocol.get(protocol)
        if cell is None:
            cell = self._started_by_protocol[protocol] = Count()
        return cell

    @property
    def started_by_protocol(self) -> dict[str, int]:
        """Jobs handed to a worker, by the worker's protocol (read at scrape time)."""
        return {protocol: cell.n for protocol, cell in self._started_by_protocol.items()}

    def _tally_of(self, job: Job) -> Tally:
        queue = job.queue or ""
        key = (queue, job.function, job.origin)
        tally = self._tallies.get(key)
        if tally is None:
            tally = self._tallies[key] = Tally(queue, job.function, job.origin)
        return tally

    def tallies(self) -> list[Tally]:
        """Every tally (scrape time)."""
        return list(self._tallies.values())

    def throughput(self) -> tuple[int, int, int, dict[str, int]]:
        """Jobs submitted, completed and failed so far, and completed by queue: what the
        dashboard samples every second, in one pass over the tallies."""
        submitted = completed = failed = 0
        by_queue: dict[str, int] = {}
        for tally in self._tallies.values():
            submitted += tally.enqueued + tally.scheduled
            failed += tally.failed
            done = tally.completed
            if done:
                completed += done
                by_queue[tally.queue] = by_queue.get(tally.queue, 0) + done
        return submitted, completed, failed, by_queue

    @property
    def counts(self) -> dict[str, dict[str, dict[str, int]]]:
        """Job events by type, queue and function (origins added up), built when read."""
        out: dict[str, dict[str, dict[str, int]]] = {name: {} for name in TALLY_EVENTS}
        for tally in self._tallies.values():
            for name, value in tally.by_event().items():
                if value:
                    per_function = out[name].setdefault(tally.queue, {})
                    per_function[tally.function] = per_function.get(tally.function, 0) + value
        return out

    def record(
        self, event: str, subject: str, queue: str | None, data: dict[str, Any]
    ) -> Event | None:
        """Append an event (any kind: job, cron, workflow, worker)."""
        if not self.capacity:
            return None
        entry = Event(self._last_seq + 1, event, self.clock(), subject, queue, data)
        slot = self._next
        self._types[slot] = event
        self._queues[slot] = queue
        self._jobs[slot] = None
        self._records[slot] = entry
        self._advance()
        return entry

    def snapshot(self) -> list[Event]:
        """Every event held, oldest first."""
        return self.query(limit=self._held)

    def restore(self, events: list[Event]) -> None:
        """Put back a snapshot's events (start-up, before any other event), keeping their
        sequence numbers, so readers' cursors stay valid across the restart."""
        if not self.capacity or not events:
            return
        kept = events[-self._size :]
        self._last_seq = kept[0].seq - 1
        for entry in kept:
            slot = self._next
            self._types[slot] = entry.type
            self._queues[slot] = entry.queue
            self._jobs[slot] = None
            self._records[slot] = entry
            self._advance()
        self._last_seq = max(self._last_seq, events[-1].seq)

    def _advance(self) -> None:
        self._last_seq += 1
        slot = self._next + 1
        self._next = 0 if slot == self._size else slot
        if self._held < self._size:
            self._held += 1

    def query(
        self,
        *,
        types: Collection[str] = (),
        queues: Collection[str] = (),
        after: int = 0,
        limit: int = 100,
    ) -> list[Event]:
        """Matching events in the order they happened: those after sequence `after` if given,
        else the newest `limit` of them."""
        if limit <= 0:
            return []
        picked: list[tuple[int, int]] = []  # (sequence number, slot)
        for found in self._matching(types, queues, after):
            picked.append(found)
            if after and len(picked) == limit:
                break
        if not after:
            picked = picked[-limit:]
        return [self._event(seq, slot) for seq, slot in picked]

    def _matching(
        self, types: Collection[str], queues: Collection[str], after: int
    ) -> Iterator[tuple[int, int]]:
        """(sequence number, slot) of each matching event, oldest first."""
        held = self._held
        size = self._size
        first_seq = self._last_seq - held + 1
        if after >= first_seq:  # start at the cursor, not at the oldest event held
            held -= min(held, after - first_seq + 1)
            first_seq = after + 1
        slot = (self._next - held) % size
        for seq in range(first_seq, first_seq + held):
            here = slot
            slot = 0 if slot + 1 == size else slot + 1
            if types and self._types[here] not in types:
                continue
            if queues and self._queues[here] not in queues:
                continue
            yield seq, here

    def _event(self, seq: int, slot: int) -> Event:
        entry = self._records[slot]
        if entry is not None:
            return entry
        job = self._jobs[slot]
        assert job is not None  # a job event
        kind, queue = self._types[slot], self._queues[slot]
        return Event(seq, kind, self._times[slot], job.id, queue, self._job_data(slot, job))

    def _job_data(self, slot: int, job: Job) -> dict[str, Any]:
        """The protocol-neutral facts of a job event (OJS events vocabulary field names)."""
        kind = self._types[slot]
        data: dict[str, Any] = {
            "job_id": job.id,
            "job_type": job.function,
            "queue": self._queues[slot],
            "attempt": self._attempts[slot],
            "state": _STATE_NAMES[self._states[slot]],
        }
        ran = self._durations[slot]
        if (kind == "job.completed" or kind == "job.discarded") and ran is not None:
            data["duration_ms"] = max(0, int(ran * 1000))
        worker = self._workers[slot]
        if worker is not None:
            data["worker_id"] = worker
        priority = job.priority
        if priority:
            data["priority"] = priority
        return data

    def clear(self) -> None:
        """Forget every event; sequence numbers go on growing, so a reader's cursor holds."""
        self._held = 0
        self._records = [None] * self._size
        self._jobs = [None] * self._size
