"""The memory store: keeps nothing, so jobs live only as long as the process.

The interfaces every store implements are in `jobwire.ports`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from jobwire.ports import RetractJobs, StoredJob

if TYPE_CHECKING:
    from jobwire.engine.job import Job


class MemoryStore:
    """A `jobwire.ports.Store` that keeps nothing; every commit is immediate."""

    durable = False
    write_count = 0

    def load(self) -> Iterable[StoredJob]:
        return ()

    def start(self) -> None:
        pass

    def job_saved(self, job: Job) -> None:
        pass

    def job_removed(self, job: Job) -> None:
        pass

    def numbers_reserved(self, ceiling: int) -> None:
        pass

    def numbers_ceiling(self) -> int:
        return 0

    def pending(self) -> bool:
        return False

    def after_commit(self, callback: Callable[[bool], None]) -> None:
        callback(True)

    def on_failure(self, retract: RetractJobs) -> None:
        pass

    def poll(self) -> None:
        pass

    def commit_if_idle(self) -> None:
        pass

    def close(self) -> None:
        pass
