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

from jobwire.engine.job import Job

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

#: What an event's `data` says about its job, per event; see `job_data`.
JobDescriber = Callable[[str, Job], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Event:
    seq: int  # grows by one per event: a cursor for readers
    type: str
    time: float
    subject: str  # the job id, cron name, workflow id, ...
    queue: str | None
    data: dict[str, Any] = field(default_factory=dict)


def job_data(event: str, job: Job) -> dict[str, Any]:
    """The protocol-neutral facts of a job event (OJS events vocabulary field names)."""
    data: dict[str, Any] = {
        "job_id": job.id,
        "job_type": job.function,
        "queue": job.queue,
        "attempt": job.attempts,
        "state": job.state.name.lower(),
    }
    if event in ("job.completed", "job.discarded") and job.started_at is not None:
        end = job.finished_at if job.finished_at is not None else job.started_at
        data["duration_ms"] = max(0, int((end - job.started_at) * 1000))
    if event == "job.started" and job.worker is not None:
        data["worker_id"] = job.worker.name
    if job.priority:
        data["priority"] = job.priority
    return data


class EventLog:
    """The newest `capacity` events; `capacity` 0 records nothing."""

    def __init__(
        self,
        capacity: int = 10_000,
        *,
        clock: Callable[[], float],
        describe: JobDescriber = job_data,
    ) -> None:
        self.capacity = capacity
        self.clock = clock
        self.describe = describe
        self._events: deque[Event] = deque(maxlen=max(1, capacity))
        self._seq = itertools.count(1)

    def __len__(self) -> int:
        return len(self._events) if self.capacity else 0

    def observe(self, event: str, job: Job) -> None:
        """`Engine.observers` hook: record a job event."""
        if self.capacity:
            self.record(event, job.id, job.queue, self.describe(event, job))

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
        events: Iterable[Event] = self._events if self.capacity else ()
        for entry in events:
            if entry.seq <= after:
                continue
            if types and entry.type not in types:
                continue
            if queues and entry.queue not in queues:
                continue
            yield entry

    def clear(self) -> None:
        self._events.clear()
