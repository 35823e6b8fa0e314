"""The dead letter queue: discarded jobs kept for an operator to look at, retry or delete.

Which discarded jobs belong here is the protocol's call (OJS: `retry.on_exhaustion =
"dead_letter"`), so `DeadLetter` takes a predicate and watches the engine's job events. A
retry puts the job back into its queue with its attempts counted from zero (`Engine.revive`).
Entries live in memory, oldest dropped past `capacity`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from jobwire.engine.errors import UnknownJob
from jobwire.engine.job import Job, JobState

if TYPE_CHECKING:
    from jobwire.engine.engine import Engine


class DeadLetter:
    def __init__(
        self, engine: Engine, *, wants: Callable[[Job], bool], capacity: int = 100_000
    ) -> None:
        self.engine = engine
        self.wants = wants
        self.capacity = capacity
        self._jobs: dict[str, Job] = {}  # insertion order: oldest first

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def observe(self, event: str, job: Job) -> None:
        """`Engine.finish_observers` hook: keep discarded jobs the predicate wants."""
        if event == "job.discarded" and self.wants(job):
            self._jobs.pop(job.id, None)
            self._jobs[job.id] = job
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
        self._jobs.clear()

    def _take(self, job_id: str) -> Job:
        job = self._jobs.pop(job_id, None)
        if job is None:
            raise UnknownJob(f"job {job_id} is not in the dead letter queue")
        return job

    def _drop(self, job: Job) -> None:
        if job.state is JobState.DISCARDED:
            self.engine.forget(job)
