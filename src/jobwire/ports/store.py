"""What a store is to the engine and to the runtime (see `jobwire.ports`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import orjson

if TYPE_CHECKING:
    from jobwire.engine.job import Job

#: Told of the new jobs of a batch whose commit failed (`Committer.on_failure`).
RetractJobs = Callable[[list["Job"]], None]


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
    origin: int = 0  # the `Origin` of the job (0: a store that predates it)


def encode_ext(ext: dict[str, Any]) -> bytes:
    """`Job.ext` as stored: JSON, so protocols must keep it to JSON types. Written by orjson
    (a durable store writes one per job: the standard library's encoder was 5 % of the
    server's CPU under a stream of OJS pushes), and by the standard library's where orjson
    refuses (integers beyond 64 bits, the surrogates that stand for bytes that are not
    UTF-8, keys that are not strings); `decode_ext` reads both."""
    try:
        return orjson.dumps(ext)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return json.dumps(ext, separators=(",", ":")).encode()


def decode_ext(raw: bytes) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(raw)
    return value


class Committer(Protocol):
    """The runtime-facing half of a store: group commit and its reports.

    The runtime drives it (`jobwire.server.runtime.Runtime`): `commit_if_idle` between two
    reads, `poll` while a long read is worked through, and `after_commit` behind its one
    commit barrier, which every listener waits on before it acknowledges anything.
    """

    #: False for the memory store: nothing is ever pending.
    durable: bool
    #: Grows with every write; adapters compare it to learn whether a batch wrote.
    write_count: int

    def start(self) -> None:
        """On the running event loop, after replay and before the first write: start what
        the store runs beside the loop, so the first write does not wait for it."""

    def pending(self) -> bool:
        """True while some write is not yet durable."""

    def after_commit(self, callback: Callable[[bool], None]) -> None:
        """Call `callback(ok)` once everything written so far is durable (ok) or has failed.

        When a commit fails, the store first hands the new jobs of the failed batches to the
        `on_failure` callback (the runtime retracts them), then calls these with ok False.
        """

    def on_failure(self, retract: RetractJobs) -> None:
        """Who to tell of the jobs first written in a batch whose commit failed."""

    def poll(self) -> None:
        """Run the `after_commit` callbacks of commits that have finished, if the store can
        tell without waiting (no system call); they run in a later loop turn otherwise."""

    def commit_if_idle(self) -> None:
        """Start committing the changes so far if no commit is in progress and enough of
        them wait; for the loop to call between two reads."""

    def close(self) -> None:
        """Commit what is pending and release the file."""


class Store(Committer, Protocol):
    """A whole store: replay, the engine's journal hooks and the committer."""

    def load(self) -> Iterable[StoredJob]:
        """Every job to resume, in their original enqueue order."""

    def job_saved(self, job: Job) -> None:
        """Insert or replace the job's row (new job, new attempt, new run_at)."""

    def job_removed(self, job: Job) -> None:
        """The job reached a terminal state and need not be resumed."""

    def numbers_reserved(self, ceiling: int) -> None:
        """Keep the engine's ceiling of job numbers given out (`Journal.numbers_reserved`)."""

    def numbers_ceiling(self) -> int:
        """The last ceiling kept (0 if none), read at start-up with `load`."""


@runtime_checkable
class KeyValueStore(Protocol):
    """Small durable records beside the jobs, committed with them (one `after_commit`
    covers both). Values are bytes owned by their namespace (JSON in practice)."""

    def kv_load(self, namespace: str) -> dict[str, bytes]:
        """Every record of `namespace`; call at start-up, before the first write."""

    def kv_put(self, namespace: str, key: str, value: bytes | None) -> None:
        """Insert or replace a record (None deletes it); durable with the next commit."""


def key_value_store(store: object) -> KeyValueStore | None:
    """The store's key-value API, or None when it has none (the memory store)."""
    return store if isinstance(store, KeyValueStore) else None
