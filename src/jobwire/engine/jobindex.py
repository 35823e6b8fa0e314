"""Every live job by id, the engine's index for status queries, results and admin.

Most jobs carry an id the engine made, `PREFIX:N` with N counting up. Those are kept in a
dict keyed by N: an int hashes to itself, so consecutive numbers land in consecutive slots
and adding a job touches memory the previous one just touched. Keyed by the id string, a
new job lands in a random slot of a table that, with a few hundred thousand jobs queued, is
mostly out of the CPU cache: that insert was a fifth of the enqueue path's CPU.
Ids chosen by clients (OJS) are kept by string.
"""

from __future__ import annotations

from collections.abc import Iterator

from jobwire.engine.job import Job


class JobIndex:
    """Jobs by id. A job with `number` set is the engine's `PREFIX:number`; others (number 0)
    are kept under their id string."""

    __slots__ = ("_named", "_numbered", "prefix")

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._numbered: dict[int, Job] = {}
        self._named: dict[str, Job] = {}

    def number(self, job_id: str) -> int:
        """N when `job_id` is exactly `PREFIX:N` as the engine writes it (N > 0), else 0."""
        prefix = self.prefix
        if not job_id.startswith(prefix):
            return 0
        tail = job_id[len(prefix) :]
        # isascii: str.isdigit accepts digits int() refuses; the round trip rejects "007".
        if not (tail.isascii() and tail.isdigit()):
            return 0
        number = int(tail)
        return number if str(number) == tail else 0

    def add(self, job: Job) -> None:
        """Index `job` under its id, replacing the job indexed there before."""
        if job.number:
            self._numbered[job.number] = job
        else:
            self._named[job.id] = job

    def discard(self, job: Job) -> None:
        """Drop `job` from the index; a different job under the same id stays."""
        if job.number:
            numbered = self._numbered
            if numbered.get(job.number) is job:
                del numbered[job.number]
        else:
            named = self._named
            if named.get(job.id) is job:
                del named[job.id]

    def get(self, job_id: str) -> Job | None:
        number = self.number(job_id)
        if number:
            job = self._numbered.get(number)
            if job is not None:
                return job
        # A client may have chosen an id in the engine's own format: it is kept by string.
        return self._named.get(job_id) if self._named else None

    def __getitem__(self, job_id: str) -> Job:
        job = self.get(job_id)
        if job is None:
            raise KeyError(job_id)
        return job

    def __contains__(self, job_id: object) -> bool:
        return isinstance(job_id, str) and self.get(job_id) is not None

    def __len__(self) -> int:
        return len(self._numbered) + len(self._named)

    def __iter__(self) -> Iterator[str]:
        for job in self.values():
            yield job.id

    def values(self) -> Iterator[Job]:
        """The jobs, those with engine ids first (in the order they were added)."""
        yield from list(self._numbered.values())
        yield from list(self._named.values())

    def items(self) -> Iterator[tuple[str, Job]]:
        for job in self.values():
            yield job.id, job

    def clear(self) -> None:
        self._numbered.clear()
        self._named.clear()
