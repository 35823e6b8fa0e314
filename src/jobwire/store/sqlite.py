"""The SQLite store: one file, WAL mode, group commit on a writer thread.

The engine calls `job_saved` / `job_removed` on the event loop thread. They only note the
job in the current batch (the latest change per job wins), and the first write of a loop
turn schedules a hand-off. The hand-off turns the batch into rows, still on the loop thread
where jobs may be read safely, and gives them to the writer thread, which runs the whole
batch as one transaction. When the commit is done (or has failed) the loop thread learns of
it and calls the `after_commit` callbacks registered for that batch and earlier ones, with
`ok` telling whether it reached the disk.

Fsync policies (`--fsync`):

- `batch` (default): `synchronous=FULL`, so every commit is fsynced before anyone hears of
  it. While one commit runs, the writes of the following loop turns gather into the next
  one: under load a commit carries many turns and the fsync cost is shared.
- `always`: `synchronous=FULL`, and every loop turn that wrote is committed on its own,
  never merged with later turns: a failed commit affects one turn's requests only. Slower.
- `off`: `synchronous=OFF`. Commits still finish before clients are answered, so a killed
  server loses nothing, but a power cut or OS crash can lose acknowledged jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import queue
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from jobwire.engine.job import Job
from jobwire.store.base import StoredJob, encode_ext

log = logging.getLogger("jobwire.store")

FSYNC_POLICIES = ("always", "batch", "off")
SCHEMA_VERSION = 2

# `seq` is the rowid and the store's key for a job (`Job.row`): given out in enqueue order
# and kept by every rewrite, so scanning by it replays jobs in their original order without
# a sort. Rows are found by it alone: an index on `id` would double the cost of each insert.
_SCHEMA = """
CREATE TABLE jobs (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL,
    function TEXT NOT NULL,
    queue TEXT NOT NULL,
    uniq TEXT,
    payload BLOB NOT NULL,
    priority INTEGER NOT NULL,
    state INTEGER NOT NULL,
    attempts INTEGER NOT NULL,
    max_attempts INTEGER,
    run_at REAL,
    created_at REAL NOT NULL,
    reducer TEXT,
    ext BLOB
)
"""
_COLUMNS = (
    "id, function, queue, uniq, payload, priority, state, attempts, max_attempts, run_at,"
    " created_at, reducer, ext"
)
_LOAD = f"SELECT {_COLUMNS}, seq FROM jobs ORDER BY seq"
#: Version 1 had a unique index on `id`; rebuilding the table drops it.
_MIGRATE_FROM_1 = (
    _SCHEMA.replace("CREATE TABLE jobs (", "CREATE TABLE jobs_v2 ("),
    "INSERT INTO jobs_v2 SELECT * FROM jobs",
    "DROP TABLE jobs",
    "ALTER TABLE jobs_v2 RENAME TO jobs",
)
#: Most jobs have no unique id, attempt limit, run time, reducer or protocol attributes:
#: their rows leave those columns NULL and bind 9 values instead of 14.
_FULL_COLUMNS = f"seq, {_COLUMNS}"
_PLAIN_COLUMNS = "seq, id, function, queue, payload, priority, state, attempts, created_at"
# Small records beside the jobs (cron registrations, workflows: `jobwire.store.kv`). Created
# when missing, so files of this schema version without it gain it on open.
_KV_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (
    namespace TEXT NOT NULL,
    key TEXT NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (namespace, key)
) WITHOUT ROWID
"""
_KV_PUT = "INSERT OR REPLACE INTO kv (namespace, key, value) VALUES (?, ?, ?)"
_KV_DELETE = "DELETE FROM kv WHERE namespace = ? AND key = ?"
_KV_LOAD = "SELECT key, value FROM kv WHERE namespace = ?"
#: Rows per statement. Many rows per statement, because the writer thread gives up the GIL
#: around every statement and waits to get it back while the loop thread is busy.
_STATEMENT_SIZES = (256, 32, 4, 1)
_FULL_WIDTH = 14  # values per row
_PLAIN_WIDTH = 9


@functools.cache
def _upsert(rows: int, width: int) -> str:
    columns = _FULL_COLUMNS if width == _FULL_WIDTH else _PLAIN_COLUMNS
    row = f"({', '.join(['?'] * width)})"
    return f"INSERT OR REPLACE INTO jobs ({columns}) VALUES {', '.join([row] * rows)}"


@functools.cache
def _delete(rows: int) -> str:
    return f"DELETE FROM jobs WHERE seq IN ({', '.join(['?'] * rows)})"


def _same(value: T) -> T:
    return value


# Python's sqlite3 binds int, float and str directly but looks every other type up in its
# adaptation protocol first, which costs more than binding the rest of the row. A
# registered adapter is found at once; these return the value as it is.
sqlite3.register_adapter(bytes, _same)
sqlite3.register_adapter(type(None), _same)


def _runs(items: list[T], sizes: tuple[int, ...]) -> Iterator[tuple[int, list[T]]]:
    """`items` cut into runs of the given sizes (few distinct statements to cache)."""
    start, left = 0, len(items)
    for size in sizes:
        while left >= size:
            yield size, items[start : start + size]
            start += size
            left -= size


Row = tuple[Any, ...]
Callback = Callable[[bool], None]
#: What a batch changes: job row key -> its row to insert or replace, or None to delete it.
Changes = dict[int, Row | None]
#: Key-value changes of a batch: (namespace, key) -> value, or None to delete it.
KVChanges = dict[tuple[str, str], bytes | None]
T = TypeVar("T")

#: While commits keep failing, repeat the same error in the log at most this often (seconds).
_LOG_EVERY = 10.0


class StoreError(Exception):
    """The store cannot be opened (unwritable path, corrupt file, used by another server)."""


def _row(job: Job) -> Row:
    if (
        job.unique is None
        and job.max_attempts is None
        and job.run_at is None
        and job.reducer is None
        and job.ext is None
    ):
        return (
            job.row,
            job.id,
            job.function,
            job.queue,
            job.payload,
            job.priority,
            int(job.state),
            job.attempts,
            job.created_at,
        )
    return (
        job.row,
        job.id,
        job.function,
        job.queue,
        job.unique,
        job.payload,
        job.priority,
        int(job.state),
        job.attempts,
        job.max_attempts,
        job.run_at,
        job.created_at,
        job.reducer,
        None if job.ext is None else _ext(job),
    )


def _ext(job: Job) -> bytes | None:
    # Serializing runs in a loop callback: raising there would lose the whole batch.
    try:
        return encode_ext(job.ext or {})
    except (TypeError, ValueError) as exc:
        log.error("job %s stored without its protocol attributes: %s", job.id, exc)
        return None


def connect(path: Path, fsync: str = "batch") -> sqlite3.Connection:
    """Open (creating if needed) the job database and lock it for this process alone."""
    if fsync not in FSYNC_POLICIES:
        raise ValueError(f"fsync must be one of {', '.join(FSYNC_POLICIES)}, not {fsync!r}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # The writer thread uses the connection after load() ran on the loop thread.
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=1.0)
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(f"cannot open {path}: {exc}") from exc
    try:
        # Exclusive before WAL: no shared-memory index, and a second server on the same file
        # fails here instead of replaying (and running) the same jobs twice.
        conn.execute("PRAGMA locking_mode = EXCLUSIVE")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode != "wal":
            raise StoreError(f"{path}: cannot switch to WAL mode (got {mode!r})")
        conn.execute(f"PRAGMA synchronous = {'OFF' if fsync == 'off' else 'FULL'}")
        # Upserts look ids up in the unique index; keep it in memory (64 MiB).
        conn.execute("PRAGMA cache_size = -65536")
        conn.execute("BEGIN EXCLUSIVE")  # take the lock now, and keep it (locking_mode)
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version == 0:
            conn.execute(_SCHEMA)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        elif version == 1:
            for statement in _MIGRATE_FROM_1:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        elif version != SCHEMA_VERSION:
            raise StoreError(
                f"{path}: schema version {version}, this jobwire knows {SCHEMA_VERSION}"
            )
        conn.execute(_KV_SCHEMA)
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        conn.close()
        if "locked" in str(exc):
            raise StoreError(f"{path} is in use by another process ({exc})") from exc
        raise StoreError(f"cannot use {path}: {exc}") from exc
    except StoreError:
        conn.close()
        raise
    return conn


class SQLiteStore:
    """A `Store` on one SQLite file. Create it, `load()`, then use it from one event loop."""

    durable = True

    def __init__(self, path: Path, *, fsync: str = "batch") -> None:
        self.path = path
        self.fsync = fsync
        self.write_count = 0
        self.commits = 0  # successful commits, for benchmarks and tests
        #: Why the latest commit failed; None once a commit succeeds again.
        self.last_error: str | None = None
        self._conn = connect(path, fsync)
        # SQLite before 3.32 allows 999 parameters per statement, later ones 32766.
        limit = self._conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
        self._sizes = tuple(size for size in _STATEMENT_SIZES if size * _FULL_WIDTH <= limit)
        self._next_row = (
            1 + self._conn.execute("SELECT COALESCE(MAX(seq), 0) FROM jobs").fetchone()[0]
        )
        self._merge_turns = fsync != "always"
        self._batch: dict[int, Job | None] = {}  # row key -> job to save, or None: remove
        self._scheduled = False
        self._handed = 0  # number of the last batch handed to the writer
        self._done = 0  # number of the last batch whose commit finished
        self._waiters: deque[tuple[int, Callback]] = deque()  # (batch number, callback)
        self._failures = 0
        self._logged_at = 0.0
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._kv: KVChanges = {}  # key-value writes of the current batch
        self._queue: queue.SimpleQueue[tuple[int, Changes, KVChanges] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ replay

    def load(self) -> Iterator[StoredJob]:
        try:
            for row in self._conn.execute(_LOAD):
                yield StoredJob(*row)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read {self.path}: {exc}") from exc

    # ------------------------------------------------------------------ engine hooks

    def job_saved(self, job: Job) -> None:
        self.write_count += 1
        key = job.row
        if not key:  # first save: the job's row key is ours to give
            key = job.row = self._next_row
            self._next_row += 1
        self._batch[key] = job
        if not self._scheduled:
            self._schedule()

    def job_removed(self, job: Job) -> None:
        self.write_count += 1
        if job.row:  # None replaces a save of the same batch
            self._batch[job.row] = None
        if not self._scheduled:
            self._schedule()

    def kv_load(self, namespace: str) -> dict[str, bytes]:
        """`KeyValueStore.kv_load`: call at start-up, like load(), before the first write."""
        try:
            records = dict(self._conn.execute(_KV_LOAD, (namespace,)).fetchall())
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read {self.path}: {exc}") from exc
        for (ns, key), value in self._kv.items():
            if ns == namespace:
                if value is None:
                    records.pop(key, None)
                else:
                    records[key] = value
        return records

    def kv_put(self, namespace: str, key: str, value: bytes | None) -> None:
        """`KeyValueStore.kv_put`: committed with the jobs of the same batch."""
        self.write_count += 1
        self._kv[(namespace, key)] = value
        if not self._scheduled:
            self._schedule()

    def pending(self) -> bool:
        return bool(self._batch) or bool(self._kv) or self._handed > self._done

    def after_commit(self, callback: Callback) -> None:
        if self._batch or self._kv:
            self._waiters.append((self._handed + 1, callback))
        elif self._handed > self._done:
            self._waiters.append((self._handed, callback))
        else:
            callback(True)  # nothing written is still on its way to the disk

    # ------------------------------------------------------------------ group commit

    def _schedule(self) -> None:
        loop = self._loop
        if loop is None:
            loop = self._start()
        self._scheduled = True
        loop.call_soon(self._turn_ended)

    def _start(self) -> asyncio.AbstractEventLoop:
        self._loop = loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._write_loop, name="jobwire-sqlite", daemon=True)
        self._thread.start()
        return loop

    def _turn_ended(self) -> None:
        self._scheduled = False
        self._hand_off()

    def _hand_off(self) -> None:
        """Turn the batch into rows here, on the loop thread that owns the jobs."""
        batch, kv = self._batch, self._kv
        if not (batch or kv) or self._closed:
            return
        self._batch, self._kv = {}, {}
        changes: Changes = {key: None if job is None else _row(job) for key, job in batch.items()}
        self._handed += 1
        self._queue.put((self._handed, changes, kv))

    def _write_loop(self) -> None:
        """The writer thread: commit what was handed off, then report back to the loop."""
        stopping = False
        while not stopping:
            item = self._queue.get()
            if item is None:
                break
            number, changes, kv = item
            # `batch`: everything that queued up during the last commit goes in this one.
            while self._merge_turns:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stopping = True
                    break
                number = item[0]
                changes.update(item[1])  # in order: the latest change of a job wins
                kv.update(item[2])
            upserts = [row for row in changes.values() if row is not None]
            deletes = [key for key, row in changes.items() if row is None]
            error = self._commit(upserts, deletes, kv)
            loop = self._loop
            assert loop is not None
            # A closed loop (after shutdown) has nobody waiting any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._committed, number, len(upserts), error)

    def _commit(self, upserts: list[Row], deletes: list[int], kv: KVChanges) -> str | None:
        """One transaction; the error that rolled it back, or None."""
        conn = self._conn
        plain = [row for row in upserts if len(row) == _PLAIN_WIDTH]
        full = (
            [row for row in upserts if len(row) == _FULL_WIDTH] if len(plain) < len(upserts) else []
        )
        try:
            conn.execute("BEGIN IMMEDIATE")
            for width, rows_of_width in ((_PLAIN_WIDTH, plain), (_FULL_WIDTH, full)):
                for size, rows in _runs(rows_of_width, self._sizes):
                    conn.execute(_upsert(size, width), [value for row in rows for value in row])
            for size, ids in _runs(deletes, self._sizes):
                conn.execute(_delete(size), ids)
            for (namespace, key), value in kv.items():
                if value is None:
                    conn.execute(_KV_DELETE, (namespace, key))
                else:
                    conn.execute(_KV_PUT, (namespace, key, value))
            conn.execute("COMMIT")
        except Exception as exc:  # any failure fails this batch, never the thread
            try:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            return f"{type(exc).__name__}: {exc}"
        return None

    def _committed(self, number: int, rows: int, error: str | None) -> None:
        """On the loop: batch `number` is on disk (error None) or was rolled back."""
        self._done = number
        ok = error is None
        self.commits += ok
        self._note_result(rows, error)
        waiters = self._waiters
        while waiters and waiters[0][0] <= number:
            callback = waiters.popleft()[1]
            try:
                callback(ok)
            except Exception:
                log.exception("after_commit callback failed")

    def _note_result(self, rows: int, error: str | None) -> None:
        if error is None:
            # Deleting the jobs of a failed batch writes nothing: no sign of recovery yet.
            if self._failures and rows:
                log.warning(
                    "store %s: commits succeed again after %d failed (last: %s)",
                    self.path,
                    self._failures,
                    self.last_error,
                )
                self._failures = 0
                self.last_error = None
            return
        self._failures += 1
        now = time.monotonic()
        if error != self.last_error or now - self._logged_at >= _LOG_EVERY:
            log.error(
                "store %s: commit of %d job change(s) failed, clients get errors: %s",
                self.path,
                rows,
                error,
            )
            self._logged_at = now
        self.last_error = error

    # ------------------------------------------------------------------ shutdown

    def close(self) -> None:
        """Commit what is pending, wait for the writer, fold the WAL in and close the file."""
        if self._closed:
            return
        self._hand_off()
        self._closed = True
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
        try:
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as exc:
            log.warning("store %s: final checkpoint failed: %s", self.path, exc)
        self._conn.close()
