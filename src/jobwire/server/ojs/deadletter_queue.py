"""The dead letter queue: discarded jobs kept for an operator to look at, retry or delete.

Which discarded jobs belong here is the protocol's call (OJS: `retry.on_exhaustion =
"dead_letter"`), so `DeadLetter` takes a predicate and watches the engine's job events. A
retry puts the job back into its queue with its attempts counted from zero (`Engine.revive`).
Entries live in memory, oldest dropped past `capacity`, and in the store's key-value records
when it has them: an entry is written in the same commit as the job's removal, so a restart
(even a crash) neither loses it nor brings the job back as queued.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from jobwire.engine.errors import UnknownJob
from jobwire.engine.job import Job, JobState
from jobwire.ports import KeyValueStore

log = logging.getLogger("jobwire.ojs")

NAMESPACE = "dead_letter"

if TYPE_CHECKING:
    from jobwire.engine.engine import Engine


class DeadLetter:
    def __init__(
        self,
        engine: Engine,
        *,
        wants: Callable[[Job], bool],
        capacity: int = 100_000,
        kv: KeyValueStore | None = None,
    ) -> None:
        self.engine = engine
        self.wants = wants
        self.capacity = capacity
        self.kv = kv
        self._jobs: dict[str, Job] = {}  # insertion order: oldest first

    def load(self) -> int:
        """The entries the store kept (start-up), oldest first; returns how many."""
        return self.adopt(self.kv.kv_load(NAMESPACE)) if self.kv is not None else 0

    def adopt(self, stored: dict[str, bytes]) -> int:
        """Keep these stored entries (at start-up, or a cluster node gone), in the order
        the jobs were discarded; returns how many."""
        records = []
        for key, raw in stored.items():
            try:
                records.append(json.loads(raw))
            except ValueError as exc:
                log.error("dead letter entry %r cannot be restored: %s", key, exc)
        for record in records:
            job = _job_of(record)
            self._jobs[job.id] = job
        ordered = sorted(self._jobs.values(), key=lambda job: (job.finished_at or 0, job.id))
        self._jobs = {job.id: job for job in ordered}
        return len(records)

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def observe(self, event: str, job: Job) -> None:
        """`Engine.finish_observers` hook: keep discarded jobs the predicate wants."""
        if event == "job.discarded" and self.wants(job):
            self._jobs.pop(job.id, None)
            self._jobs[job.id] = job
            self._save(job.id, _record_of(job))
            while len(self._jobs) > self.capacity:
                oldest = next(iter(self._jobs))
                self._drop(self._jobs.pop(oldest))

    def get(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    def jobs(self, queue: str | None = None) -> list[Job]:
        """Entries, oldest first; only those of `queue` if given."""
        return [job for job in self._jobs.values() if queue is None or job.queue == queue]

    def retry(self, job_id: str) -> Job:
        """Back to its queue, attempts from zero; raises UnknownJob."""
        job = self._take(job_id)
        return self.engine.revive(job)

    def delete(self, job_id: str) -> Job:
        """Remove the entry for good: the job is no longer retrievable; raises UnknownJob."""
        job = self._take(job_id)
        self._drop(job)
        return job

    def clear(self) -> None:
        for job_id in self._jobs:
            self._save(job_id, None)
        self._jobs.clear()

    def _take(self, job_id: str) -> Job:
        job = self._jobs.pop(job_id, None)
        if job is None:
            raise UnknownJob(f"job {job_id} is not in the dead letter queue")
        self._save(job_id, None)
        return job

    def _save(self, job_id: str, record: dict[str, Any] | None) -> None:
        if self.kv is not None:
            value = None if record is None else json.dumps(record, default=str).encode()
            self.kv.kv_put(NAMESPACE, job_id, value)

    def _drop(self, job: Job) -> None:
        self._save(job.id, None)
        if job.state is JobState.DISCARDED:
            self.engine.forget(job)


def _record_of(job: Job) -> dict[str, Any]:
    """A discarded job as kept in the store: enough to show it and to retry it."""
    error = job.error
    if isinstance(error, bytes):
        error = error.decode("utf-8", "replace")
    return {
        "id": job.id,
        "function": job.function,
        "queue": job.queue,
        "unique": job.unique,
        "payload": base64.b64encode(job.payload).decode(),
        "priority": job.priority,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "lease_timeout": job.lease_timeout,
        "created_at": job.created_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "reducer": job.reducer,
        "origin": job.origin,
        "error": error,
        "ext": job.ext,
    }


def _job_of(record: dict[str, Any]) -> Job:
    job = Job(
        record["id"],
        record["function"],
        base64.b64decode(record["payload"]),
        record["queue"],
        record.get("unique"),
        record.get("priority", 0),
        True,
        record.get("created_at", 0.0),
        record.get("origin", 0),
    )
    job.state = JobState.DISCARDED
    job.attempts = record.get("attempts", 0)
    job.max_attempts = record.get("max_attempts")
    job.lease_timeout = record.get("lease_timeout")
    job.started_at = record.get("started_at")
    job.finished_at = record.get("finished_at")
    job.reducer = record.get("reducer")
    job.error = record.get("error")
    job.ext = record.get("ext")
    return job
