"""The event log: a bounded, in-memory record of job lifecycle events, whatever the protocol.

The engine tells its observers about every job transition (`Engine.observers`); `EventLog`
is one such observer. It keeps the newest `capacity` events in a ring, each a small frozen
snapshot taken when the event happened (the job keeps changing afterwards). Adapters read it
(OJS `GET /ojs/v1/events`) by type, queue and a sequence cursor. Events are not durable: they
describe what this process saw, and a restart starts a new log.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
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


@dataclass(frozen=True, slots=True)
class Event:
    seq: int  # grows by one per event: a cursor for readers
    type: str
    time: float
    subject: str  # the job id, cron name, workflow id, ...
    queue: str | None
    data: dict[str, Any] = field(default_factory=dict)


#: What the log keeps of a job event: cheap to take on the hot path, turned into `data` only
#: when read. (seq, event, time, id, function, queue, attempts, state, started, finished,
#: priority, worker name)
_Snapshot = tuple[
    int, str, float, str, str, str, int, JobState, float | None, float | None, int, str | None
]


def _job_data(snap: _Snapshot) -> dict[str, Any]:
    """The protocol-neutral facts of a job event (OJS events vocabulary field names)."""
    _, event, _, job_id, function, queue, attempts, state, started, finished, priority, worker = (
        snap
    )
    data: dict[str, Any] = {
        "job_id": job_id,
        "job_type": function,
        "queue": queue,
        "attempt": attempts,
        "state": state.name.lower(),
    }
    if event in ("job.completed", "job.discarded") and started is not None:
        end = finished if finished is not None else started
        data["duration_ms"] = max(0, int((end - started) * 1000))
    if worker is not None:
        data["worker_id"] = worker
    if priority:
        data["priority"] = priority
    return data


class EventLog:
    """The newest `capacity` events; `capacity` 0 records nothing."""

    def __init__(self, capacity: int = 10_000, *, clock: Callable[[], float]) -> None:
        self.capacity = capacity
        self.clock = clock
        self._events: deque[Event | _Snapshot] = deque(maxlen=max(1, capacity))
        self._seq = itertools.count(1)

    def __len__(self) -> int:
        return len(self._events) if self.capacity else 0

    def observe(self, event: str, job: Job) -> None:
        """`Engine.observers` hook: record a job event (a tuple: this runs for every job)."""
        if self.capacity:
            worker = job.worker
            self._events.append(
                (
                    next(self._seq),
                    event,
                    self.clock(),
                    job.id,
                    job.function,
                    job.queue,
                    job.attempts,
                    job.state,
                    job.started_at,
                    job.finished_at,
                    job.priority,
                    worker.name if worker is not None and event == "job.started" else None,
                )
            )

    def record(
        self, event: str, subject: str, queue: str | None, data: dict[str, Any]
    ) -> Event | None:
        """Append an event (any kind: job, cron, workflow, worker)."""
        if not self.capacity:
            return None
        entry = Event(next(self._seq), event, self.clock(), subject, queue, data)
        self._events.append(entry)
        return entry

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
        matching = self._matching(types, queues, after)
        if after:
            return list(itertools.islice(matching, limit))
        newest: deque[Event] = deque(maxlen=max(0, limit))
        newest.extend(matching)
        return list(newest)

    def _matching(
        self, types: Collection[str], queues: Collection[str], after: int
    ) -> Iterator[Event]:
        events: Iterable[Event | _Snapshot] = self._events if self.capacity else ()
        for entry in events:
            if isinstance(entry, Event):
                seq, kind, queue = entry.seq, entry.type, entry.queue
            else:
                seq, kind, queue = entry[0], entry[1], entry[5]
            if seq <= after or (types and kind not in types) or (queues and queue not in queues):
                continue
            if isinstance(entry, Event):
                yield entry
            else:
                yield Event(seq, kind, entry[2], entry[3], queue, _job_data(entry))

    def clear(self) -> None:
        self._events.clear()
