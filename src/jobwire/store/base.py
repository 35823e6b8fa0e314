"""The store interface the engine logs job changes to.

The engine calls the `job_*` hooks synchronously as state changes; a store collects them
and commits them together (group commit). Adapters hold back acknowledgements until
`after_commit` fires, so a client is told "accepted" only once its job is durable.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the engine imports this module
    from jobwire.engine.job import Job


@dataclass(slots=True)
class StoredJob:
    """What a store gives back on replay: enough to rebuild the job."""

    id: str
    function: str
    queue: str
    unique: str | None
    payload: bytes
    priority: int
    state: int
    attempts: int
    max_attempts: int | None
    run_at: float | None
    created_at: float
    reducer: str | None = None
    ext: bytes | None = None  # protocol-specific attributes, serialized by their owner
    row: int = 0  # the store's key for the job (`Job.row`)


def encode_ext(ext: dict[str, Any]) -> bytes:
    """`Job.ext` as stored: JSON, so protocols must keep it to JSON types."""
    return json.dumps(ext, separators=(",", ":")).encode()


def decode_ext(raw: bytes) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(raw)
    return value


class Store(Protocol):
    #: False for the memory store: the engine then skips every hook on the hot path.
    durable: bool
    #: Grows with every hook call; adapters compare it to learn whether a batch wrote.
    write_count: int

    def load(self) -> Iterable[StoredJob]:
        """Every job to resume, in their original enqueue order."""

    def start(self) -> None:
        """On the running event loop, after `load` and before the first hook: start what
        the store runs beside the loop, so the first write does not wait for it."""

    def job_saved(self, job: Job) -> None:
        """Insert or replace the job's row (new job, new attempt, new run_at)."""

    def job_removed(self, job: Job) -> None:
        """The job reached a terminal state and need not be resumed."""

    def pending(self) -> bool:
        """True while some hook's write is not yet durable."""

    def after_commit(self, callback: Callable[[bool], None]) -> None:
        """Call `callback(ok)` once everything written so far is durable (ok) or has failed.

        When a commit fails, `ok` is False: what that batch acknowledged must be retracted
        (the client told the job was not accepted) and its new jobs dropped.
        """

    def poll(self) -> None:
        """Run the `after_commit` callbacks of commits that have finished, if the store can
        tell without waiting (no system call); they run in a later loop turn otherwise. For
        the loop to call while it works through a long read of requests."""

    def commit_if_idle(self) -> None:
        """Start committing the changes so far if no commit is in progress and enough of
        them wait; for the loop to call between two reads."""

    def close(self) -> None:
        """Commit what is pending and release the file."""


class MemoryStore:
    """Keeps nothing: jobs live only as long as the process."""

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

    def pending(self) -> bool:
        return False

    def after_commit(self, callback: Callable[[bool], None]) -> None:
        callback(True)

    def poll(self) -> None:
        pass

    def commit_if_idle(self) -> None:
        pass

    def close(self) -> None:
        pass
