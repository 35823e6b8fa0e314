"""The SQLite store: a redo log for acknowledgements, SQLite for everything that lasts.

The engine calls `job_saved` / `job_removed` on the event loop thread. They only note the
job in the current batch (the latest change per job wins), and the first write of a loop
turn schedules a hand-off. The hand-off encodes the batch (`jobwire.store.frames`), still on
the loop thread where jobs may be read safely, and appends it as one frame to the redo log
(`jobwire.store.redolog`), which a syncer process fsyncs. When that is done (or has
failed) the loop thread learns of it and calls the `after_commit` callbacks registered for
that batch and earlier ones, with `ok` telling whether it reached the disk.

Once the log has grown by `checkpoint_bytes`, the store starts a new log file and, when
every batch of the old one is written, a checkpoint process (`jobwire.store.checkpoint`)
applies the finished log files to SQLite in one transaction, which also records the last
log generation it covers; then those files are deleted. It streams their frames through
chunks of changes, each keeping only the latest state of a job (`CHECKPOINT_CHUNK`). It is
the same procedure that opening the store runs on the files a crash left, in a process of
its own so that binding rows never takes the GIL from the event loop. So SQLite is off the
acknowledgement path, the server keeps no rows in memory for it, and a job that ends
before the next checkpoint never reaches SQLite (unless a chunk ends between its changes:
then it is written and deleted within the transaction). Closing the store applies the rest
of the log itself and leaves no log behind.

Fsync policies (`--fsync`):

- `batch` (default): every log write is fsynced before anyone hears of it. While one
  fsync runs, the frames of the following loop turns are written and wait for the next
  one: under load an fsync carries many turns and its cost is shared.
- `always`: fsynced, and every loop turn that wrote is synced on its own, never merged
  with later turns. Slower.
- `off`: nothing is fsynced. Log writes still finish before clients are answered, so a
  killed server loses nothing, but a power cut or OS crash can lose acknowledged jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import logging
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from jobwire.engine.events import Histogram
from jobwire.engine.job import Job
from jobwire.ports import RetractJobs, StoredJob
from jobwire.ports.journal import Journal
from jobwire.store import frames
from jobwire.store.frames import FULL_WIDTH, PLAIN_WIDTH, Changes, FrameBuilder, KVChanges
from jobwire.store.redolog import RedoLog, read_frames

log = logging.getLogger("jobwire.store")

FSYNC_POLICIES = ("always", "batch", "off")
#: The key-value record of the engine's job-number ceiling (`numbers_reserved`).
_ENGINE_NAMESPACE = "engine"
_NUMBERS_KEY = "numbers_reserved"
SCHEMA_VERSION = 4
#: Log bytes between two checkpoints: bounds the log on disk and the replay at start.
CHECKPOINT_BYTES = 16 << 20
#: Bucket bounds (seconds) of the commit latency and checkpoint duration histograms.
COMMIT_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
CHECKPOINT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Changes (of jobs and key-value records) a checkpoint decodes before it writes them to
#: SQLite. It streams the log through dicts this large rather than holding every change of
#: its files at once: a checkpoint of 700,000 queued jobs peaked at 341 MB that way, at 149
#: MB in chunks. Changes to one job within a chunk collapse into the latest; later chunks
#: overwrite earlier ones, all in one transaction.
CHECKPOINT_CHUNK = 32_768
#: Writes (job changes and key-value puts) a batch needs to go to an idle disk between two
#: reads rather than at the end of the loop turn (`SQLiteStore.commit_if_idle`): at about a
#: microsecond of the loop's work each, about as long as a sync takes.
EARLY_BATCH_WRITES = 64

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
    ext BLOB,
    origin INTEGER NOT NULL DEFAULT 0
)
"""
_OLD_COLUMNS = (
    "id, function, queue, uniq, payload, priority, state, attempts, max_attempts, run_at,"
    " created_at, reducer, ext"
)
_COLUMNS = f"{_OLD_COLUMNS}, origin"
# StoredJob's field order: the row key, then the origin.
_LOAD = f"SELECT {_OLD_COLUMNS}, seq, origin FROM jobs ORDER BY seq"
#: Version 1 had a unique index on `id`; rebuilding the table drops it.
_MIGRATE_FROM_1 = (
    _SCHEMA.replace("CREATE TABLE jobs (", "CREATE TABLE jobs_v2 ("),
    f"INSERT INTO jobs_v2 (seq, {_OLD_COLUMNS}) SELECT * FROM jobs",
    "DROP TABLE jobs",
    "ALTER TABLE jobs_v2 RENAME TO jobs",
)
#: Version 4 keeps the origin of each job (`Job.origin`); older rows have 0 (unknown).
_MIGRATE_TO_4 = "ALTER TABLE jobs ADD COLUMN origin INTEGER NOT NULL DEFAULT 0"
#: Most jobs have no unique id, attempt limit, run time, reducer or protocol attributes:
#: their rows leave those columns NULL and bind 10 values instead of 15.
_FULL_COLUMNS = f"seq, {_COLUMNS}"
_PLAIN_COLUMNS = "seq, id, function, queue, payload, priority, state, attempts, created_at, origin"
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
# The last redo log generation whose changes are in this file (one row; none: 0).
_CHECKPOINT_SCHEMA = "CREATE TABLE IF NOT EXISTS checkpoint (generation INTEGER NOT NULL)"
_CHECKPOINT_LOAD = "SELECT generation FROM checkpoint"
_CHECKPOINT_SAVE = ("DELETE FROM checkpoint", "INSERT INTO checkpoint (generation) VALUES (?)")
#: Rows per statement: a checkpoint of many rows runs few statements (each one prepared
#: once and cached), and needs a handful of shapes only.
_STATEMENT_SIZES = (256, 32, 4, 1)


@functools.cache
def _upsert(rows: int, width: int) -> str:
    columns = _FULL_COLUMNS if width == FULL_WIDTH else _PLAIN_COLUMNS
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


Callback = Callable[[bool], None]
T = TypeVar("T")

#: While commits keep failing, repeat the same error in the log at most this often (seconds).
_LOG_EVERY = 10.0


def _log_file_bytes(checkpoint_bytes: int) -> int:
    """The zeros each redo log file starts with: room for a checkpoint's worth of frames
    and some over (a checkpoint may still be running when the limit is reached), at least
    1 MiB, at most 64 MiB of disk ahead of need."""
    return min(max(checkpoint_bytes + checkpoint_bytes // 16, 1 << 20), 64 << 20)


class StoreError(Exception):
    """The store cannot be opened (unwritable path, corrupt file, used by another server)."""


def lock(path: Path) -> int:
    """Lock the database for this server alone; the lock file's descriptor.

    A second server on the same file fails here instead of replaying (and running) the same
    jobs twice. The lock is a file beside the database, not SQLite's own, because the
    checkpoint process must be able to write the database while the server holds it.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.with_name(f"{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise StoreError(f"cannot open {path}: {exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        raise StoreError(f"{path} is in use by another process ({exc})") from exc
    return fd


def _check_policy(fsync: str) -> None:
    if fsync not in FSYNC_POLICIES:
        raise ValueError(f"fsync must be one of {', '.join(FSYNC_POLICIES)}, not {fsync!r}")


def connect(path: Path, fsync: str = "batch", timeout: float = 5.0) -> sqlite3.Connection:
    """Open (creating or upgrading if needed) the job database."""
    _check_policy(fsync)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, isolation_level=None, timeout=timeout)
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(f"cannot open {path}: {exc}") from exc
    try:
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode != "wal":
            raise StoreError(f"{path}: cannot switch to WAL mode (got {mode!r})")
        conn.execute(f"PRAGMA synchronous = {'OFF' if fsync == 'off' else 'FULL'}")
        conn.execute("PRAGMA cache_size = -65536")  # 64 MiB: the pages a checkpoint updates
        conn.execute("BEGIN IMMEDIATE")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{path}: schema version {version}, this jobwire knows {SCHEMA_VERSION}"
            )
        if version == 0:
            conn.execute(_SCHEMA)
        elif version == 1:
            for statement in _MIGRATE_FROM_1:
                conn.execute(statement)
        elif version < 4:
            conn.execute(_MIGRATE_TO_4)
        # Version 3 added the checkpoint table: a server of version 2 would ignore the redo
        # log, so it must not open the file any more.
        conn.execute(_KV_SCHEMA)
        conn.execute(_CHECKPOINT_SCHEMA)
        if version != SCHEMA_VERSION:
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        conn.close()
        raise StoreError(f"cannot use {path}: {exc}") from exc
    except StoreError:
        conn.close()
        raise
    return conn


def _open(path: Path, fsync: str) -> tuple[sqlite3.Connection, int, int]:
    """Connect and apply the log a crash left: the connection, the log generation to write
    next and the next row key."""
    conn = connect(path, fsync)
    try:
        generation = apply_log(conn, path) + 1
        next_row = 1 + conn.execute("SELECT COALESCE(MAX(seq), 0) FROM jobs").fetchone()[0]
    except sqlite3.Error as exc:
        conn.close()
        raise StoreError(f"cannot read {path}: {exc}") from exc
    except BaseException:
        conn.close()
        raise
    return conn, generation, int(next_row)


def apply_log(conn: sqlite3.Connection, path: Path, through: int | None = None) -> int:
    """Apply the redo log files newer than SQLite's checkpoint (up to generation `through`,
    or all) in one transaction, then delete them; the last generation now covered."""
    redo = RedoLog(path)
    try:
        row = conn.execute(_CHECKPOINT_LOAD).fetchone()
        checkpointed = 0 if row is None else int(row[0])
        generations = [g for g in redo.generations() if through is None or g <= through]
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(f"cannot read {path}: {exc}") from exc
    newer = [generation for generation in generations if generation > checkpointed]
    if newer:
        applied = _apply_generations(conn, path, redo, newer)
        log.info("store %s: %d batch(es) of the redo log applied", path, applied)
    last = max([checkpointed, *generations])
    try:
        redo.remove_through(last)
    except OSError as exc:  # the next start skips them: they are older than the checkpoint
        log.warning("store %s: applied redo log files not removed: %s", path, exc)
    return last


def _apply_generations(
    conn: sqlite3.Connection, path: Path, redo: RedoLog, generations: list[int]
) -> int:
    """One transaction: the frames of `generations`, and the last of them as the checkpoint;
    the number of frames applied. Any failure rolls it all back (StoreError)."""
    sizes = _statement_sizes(conn)
    applied = 0
    try:
        conn.execute("BEGIN IMMEDIATE")
        changes: Changes = {}
        kv: KVChanges = {}
        for batch_changes, batch_kv in _decoded_frames(redo, generations):
            changes.update(batch_changes)  # in order: the latest change wins
            kv.update(batch_kv)
            applied += 1
            if len(changes) + len(kv) >= CHECKPOINT_CHUNK:
                _write_changes(conn, changes, kv, sizes)
                changes, kv = {}, {}
        _write_changes(conn, changes, kv, sizes)
        conn.execute(_CHECKPOINT_SAVE[0])
        conn.execute(_CHECKPOINT_SAVE[1], (generations[-1],))
        conn.execute("COMMIT")
    except Exception as exc:
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass
        if isinstance(exc, StoreError):
            raise
        error = f"{type(exc).__name__}: {exc}"
        raise StoreError(f"cannot apply the redo log to {path}: {error}") from exc
    return applied


def _decoded_frames(redo: RedoLog, generations: list[int]) -> Iterator[tuple[Changes, KVChanges]]:
    """The changes of every frame of `generations`, in order; StoreError if a file cannot
    be read or a frame decoded."""
    for generation in generations:
        log_path = redo.path(generation)
        try:
            for body in read_frames(log_path):
                yield frames.decode(body)
        except (OSError, ValueError, EOFError, TypeError) as exc:
            raise StoreError(f"cannot read the redo log {log_path}: {exc}") from exc


def _statement_sizes(conn: sqlite3.Connection) -> tuple[int, ...]:
    """The rows per statement this SQLite allows: before 3.32 it binds at most 999
    parameters per statement, later ones 32766."""
    limit = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    return tuple(size for size in _STATEMENT_SIZES if size * FULL_WIDTH <= limit)


def _write_changes(
    conn: sqlite3.Connection, changes: Changes, kv: KVChanges, sizes: tuple[int, ...]
) -> None:
    """Run the statements of `changes` and `kv`, inside the caller's transaction."""
    upserts = [row for row in changes.values() if row is not None]
    deletes = [key for key, row in changes.items() if row is None]
    plain = [row for row in upserts if len(row) == PLAIN_WIDTH]
    full = [row for row in upserts if len(row) == FULL_WIDTH] if len(plain) < len(upserts) else []
    for width, rows_of_width in ((PLAIN_WIDTH, plain), (FULL_WIDTH, full)):
        for size, rows in _runs(rows_of_width, sizes):
            conn.execute(_upsert(size, width), [value for row in rows for value in row])
    for size, ids in _runs(deletes, sizes):
        conn.execute(_delete(size), ids)
    for (namespace, key), value in kv.items():
        if value is None:
            conn.execute(_KV_DELETE, (namespace, key))
        else:
            conn.execute(_KV_PUT, (namespace, key, value))


class SQLiteStore(Journal):
    """A `Store` on one SQLite file. Create it, `load()`, then use it from one event loop."""

    durable = True

    def __init__(
        self,
        path: Path,
        *,
        fsync: str = "batch",
        checkpoint_bytes: int = CHECKPOINT_BYTES,
        busy_poll: float = 0.0,
    ) -> None:
        """`busy_poll`: seconds the redo log's syncer polls for the next request after each
        sync before it sleeps (`jobwire.store.syncproc`)."""
        self.path = path
        self.fsync = fsync
        self.checkpoint_bytes = checkpoint_bytes
        #: Seconds a checkpoint process waits for a lock on the database before it fails.
        self.checkpoint_timeout = 30.0
        self.write_count = 0
        self.commits = 0  # successful log writes, for benchmarks and tests
        self.checkpoints = 0  # successful checkpoints, for tests
        #: Metrics (read when scraped): seconds from handing a batch to the log to its
        #: write being done, batches handed, bytes handed to the log in all.
        self.commit_times = Histogram(COMMIT_BUCKETS)
        self.batches = 0
        self.log_bytes_total = 0
        #: The latest checkpoint: when it ended (epoch seconds), how long it took, the
        #: redo-log bytes it applied; 0 before the first.
        self.checkpoint_at = 0.0
        self.checkpoint_seconds = 0.0
        self.checkpoint_bytes_applied = 0
        self.checkpoint_times = Histogram(CHECKPOINT_BUCKETS)
        self._handed_times: deque[tuple[int, float]] = deque()  # (batch number, perf time)
        self._checkpoint_started = 0.0
        self._checkpoint_size = 0  # redo-log bytes the running checkpoint applies
        #: Why the latest log write failed; None once a write succeeds again.
        self.last_error: str | None = None
        _check_policy(fsync)  # before the lock file is made
        self._lock = lock(path)
        try:
            # The log generation written now, the next job's row key.
            self._conn, self._generation, self._next_row = _open(path, fsync)
        except BaseException:
            os.close(self._lock)
            raise
        self._log = RedoLog(
            path,
            sync=fsync != "off",
            merge=fsync != "always",
            preallocate=_log_file_bytes(checkpoint_bytes),
            busy_poll=busy_poll,
        )
        self._log.prepare()
        # The current batch's changes, encoded as they come (see `jobwire.store.frames`).
        self._frame = FrameBuilder()
        self._kv: KVChanges = {}  # key-value writes of the current batch
        # Key-value writes handed to the log that SQLite may not have yet, each with its
        # batch's number: a checkpoint through that batch drops them (else every key ever
        # written, a Titanic request's say, would stay in memory).
        self._kv_written: dict[tuple[str, str], tuple[bytes | None, int]] = {}
        self._scheduled = False
        self._handed = 0  # number of the last batch handed to the log
        self._handed_at = 0  # `write_count` then
        self._done = 0  # number of the last batch whose log write finished
        self._waiters: deque[tuple[int, Callback]] = deque()  # (batch number, callback)
        # The jobs first saved in the current batch, and in each batch handed off and not yet
        # reported: if a batch fails, its new jobs are retracted (`on_failure`).
        self._created: list[Job] = []
        self._created_in: deque[tuple[int, list[Job]]] = deque()
        self._retract: RetractJobs | None = None
        self._log_bytes = 0  # frame bytes handed to the current generation
        self._rotated_after: int | None = None  # last batch of the generation to checkpoint
        self._checkpoint_batches = 0  # the last batch the running checkpoint applies
        self._checkpoint_through = 0  # the last generation the next checkpoint applies
        self._checkpoint: subprocess.Popen[bytes] | None = None
        self._failures = 0
        self._logged_at = 0.0
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def fsyncs(self) -> int:
        """Syncs of the redo log so far (metrics)."""
        return self._log.syncs

    def redo_log_bytes(self) -> int:
        """Redo-log bytes not yet applied to the database by a checkpoint (metrics)."""
        pending = self._checkpoint_size if self._checkpoint is not None else 0
        return self._log_bytes + pending

    def job_count(self) -> int:
        """Jobs the store holds (what `load` yields): for replay progress."""
        try:
            return int(self._conn.execute("SELECT count(*) FROM jobs").fetchone()[0])
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read {self.path}: {exc}") from exc

    def load(self) -> Iterator[StoredJob]:
        # Rows repeat a few function and queue names: each read as a new string would stay
        # in its replayed job, two copies per job that jobs queued live share.
        names: dict[str, str] = {}
        try:
            for row in self._conn.execute(_LOAD):
                job = StoredJob(*row)
                function, queue = job.function, job.queue
                job.function = names.setdefault(function, function)
                job.queue = names.setdefault(queue, queue)
                yield job
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read {self.path}: {exc}") from exc

    # ------------------------------------------------------------------ engine hooks

    def job_saved(self, job: Job) -> None:
        self.write_count += 1
        key = job.row
        if key:
            self._frame.changed(key, job)
        else:  # first save: the job's row key is ours to give
            key = job.row = self._next_row
            self._next_row += 1
            self._frame.created(key, job)
            self._created.append(job)
        if not self._scheduled:
            self._schedule()

    def job_removed(self, job: Job) -> None:
        self.write_count += 1
        if job.row:  # replaces a save of the same batch
            self._frame.removed(job.row)
        if not self._scheduled:
            self._schedule()

    def numbers_reserved(self, ceiling: int) -> None:
        """`Journal.numbers_reserved`: a key-value record, committed with the batch."""
        self.kv_put(_ENGINE_NAMESPACE, _NUMBERS_KEY, str(ceiling).encode())

    def numbers_ceiling(self) -> int:
        raw = self.kv_load(_ENGINE_NAMESPACE).get(_NUMBERS_KEY)
        return int(raw) if raw is not None else 0

    def kv_load(self, namespace: str) -> dict[str, bytes]:
        """`KeyValueStore.kv_load`: call at start-up, like load(), before the first write."""
        try:
            records = dict(self._conn.execute(_KV_LOAD, (namespace,)).fetchall())
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read {self.path}: {exc}") from exc
        pending = {name: value for name, (value, _) in self._kv_written.items()}
        for layer in (pending, self._kv):  # what SQLite may not have yet
            for (ns, key), value in layer.items():
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
        return not self._frame.empty or bool(self._kv) or self._handed > self._done

    # Both run inside a client's read: a failure of the store's own must not reach that
    # connection, which its transport would close. Logged, as the loop logs its callbacks'.

    def poll(self) -> None:
        try:
            self._log.poll()
        except Exception:
            log.exception("store %s: reporting a finished sync failed", self.path)

    def commit_if_idle(self) -> None:
        """A batch is handed off at the end of a loop turn, but a turn can hold several
        clients' reads of many requests each, while the disk idles: then each waits for all
        of them. Between two reads, a batch that took about as long to build as a sync
        takes goes to an idle disk at once. A lower bar would cost a sync per read under a
        load of small reads (workers completing jobs one by one)."""
        if self._log.idle and self.write_count - self._handed_at >= EARLY_BATCH_WRITES:
            try:
                self._hand_off()
            except Exception:
                log.exception("store %s: handing off a batch failed", self.path)

    def on_failure(self, retract: RetractJobs) -> None:
        """`Committer.on_failure`: told of the new jobs of every batch whose write failed."""
        self._retract = retract

    def after_commit(self, callback: Callback) -> None:
        if not self._frame.empty or self._kv:
            self._waiters.append((self._handed + 1, callback))
        elif self._handed > self._done:
            self._waiters.append((self._handed, callback))
        else:
            callback(True)  # nothing written is still on its way to the disk

    # ------------------------------------------------------------------ group commit

    def start(self) -> None:
        """`Store.start`: the redo log's file and its syncer process, ready for the first
        write."""
        if self._loop is None:
            self._start_log()
        self._log.get_ready()

    def _start_log(self) -> asyncio.AbstractEventLoop:
        self._loop = loop = asyncio.get_running_loop()
        self._log.start(self._generation, self._written)
        return loop

    def _schedule(self) -> None:
        loop = self._loop
        if loop is None:  # not started: a store used without a server (tests, tools)
            loop = self._start_log()
        self._scheduled = True
        loop.call_soon(self._turn_ended)

    def _turn_ended(self) -> None:
        self._scheduled = False
        self._hand_off()

    def _hand_off(self) -> None:
        """Encode the batch here, on the loop thread that owns the jobs."""
        frame, kv = self._frame, self._kv
        if (frame.empty and not kv) or self._closed:
            return
        self._frame, self._kv = FrameBuilder(), {}
        self._handed += 1
        self._handed_at = self.write_count
        if self._created:
            self._created_in.append((self._handed, self._created))
            self._created = []
        try:
            body = frame.finish(kv)
        except Exception as exc:  # a value the encoder refuses: this batch fails, alone
            log.exception("store %s: cannot encode a batch", self.path)
            self._log.fail(self._handed, f"cannot encode the batch: {exc!r}")
            return
        if kv:
            written, number = self._kv_written, self._handed
            for name, value in kv.items():
                written[name] = (value, number)
        self._log.append(self._handed, body)
        self._handed_times.append((self._handed, time.perf_counter()))
        self.batches += 1
        self.log_bytes_total += len(body)
        self._log_bytes += len(body)
        if (
            self._log_bytes >= self.checkpoint_bytes
            and self._rotated_after is None
            and self._checkpoint is None  # one at a time
        ):
            self._rotate()
        elif self._log.wants_new_file:
            self._next_log_file()  # checkpointed with the next checkpoint's files

    def _written(self, number: int, error: str | None) -> None:
        """On the loop: batches up to `number` are in the log (error None) or failed."""
        if self._closed:
            return  # close() reports what was still in flight
        ok = error is None
        self._done = number
        self.commits += ok
        handed = self._handed_times
        if handed:
            now = time.perf_counter()
            while handed and handed[0][0] <= number:
                self.commit_times.observe(now - handed.popleft()[1])
        self._note_result(error)
        if self._rotated_after is not None and number >= self._rotated_after:
            self._start_checkpoint()
        self._report_created(number, ok)
        self._notify(number, ok)

    def _report_created(self, number: int, ok: bool) -> None:
        """Batches up to `number` are done; if they failed, their new jobs are retracted
        before anyone waiting on them hears of it."""
        created_in = self._created_in
        failed: list[Job] = []
        while created_in and created_in[0][0] <= number:
            jobs = created_in.popleft()[1]
            if not ok:
                failed.extend(jobs)
        if failed and self._retract is not None:
            try:
                self._retract(failed)
            except Exception:
                log.exception("retracting the jobs of a failed batch failed")

    def _notify(self, number: int, ok: bool) -> None:
        waiters = self._waiters
        while waiters and waiters[0][0] <= number:
            callback = waiters.popleft()[1]
            try:
                callback(ok)
            except Exception:
                log.exception("after_commit callback failed")

    # ------------------------------------------------------------------ checkpoints

    def _rotate(self) -> None:
        """Start a new log generation; checkpoint the old one once its writes are done."""
        self._rotated_after = self._handed
        self._checkpoint_through = self._generation
        self._checkpoint_size = self._log_bytes
        self._log_bytes = 0
        self._next_log_file()
        if self._done >= self._handed:
            self._start_checkpoint()

    def _next_log_file(self) -> None:
        self._generation += 1
        self._log.rotate(self._generation)

    def _start_checkpoint(self) -> None:
        """Every batch of the old generations is written: a process applies them to
        SQLite."""
        self._checkpoint_batches = self._rotated_after or 0
        self._rotated_after = None
        generation = self._checkpoint_through
        command = [sys.executable, "-m", "jobwire.store.checkpoint", str(self.path)]
        command += [str(generation), self.fsync, str(self.checkpoint_timeout), str(os.getpid())]
        try:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, env=_child_env())
        except OSError as exc:  # the log files stay: the next checkpoint takes them too
            log.error("store %s: cannot start a checkpoint: %s", self.path, exc)
            return
        self._checkpoint = process
        self._checkpoint_started = time.perf_counter()
        loop = self._loop
        assert loop is not None
        threading.Thread(
            target=self._await_checkpoint,
            args=(process, generation, loop),
            name="jobwire-checkpoint",
            daemon=True,
        ).start()

    def _await_checkpoint(
        self, process: subprocess.Popen[bytes], generation: int, loop: asyncio.AbstractEventLoop
    ) -> None:
        """A thread that only waits for the process (without the GIL) and tells the loop."""
        code = process.wait()
        with contextlib.suppress(RuntimeError):  # a closed loop: close() waited for it
            loop.call_soon_threadsafe(self._checkpoint_finished, process, generation, code)

    def _checkpoint_finished(
        self, process: subprocess.Popen[bytes], generation: int, code: int
    ) -> None:
        if self._checkpoint is not process:
            return
        self._checkpoint = None
        if code == 0:
            self.checkpoints += 1
            seconds = time.perf_counter() - self._checkpoint_started
            self.checkpoint_at = time.time()
            self.checkpoint_seconds = seconds
            self.checkpoint_bytes_applied = self._checkpoint_size
            self.checkpoint_times.observe(seconds)
            through = self._checkpoint_batches
            for name, (_, number) in list(self._kv_written.items()):
                if number <= through:  # SQLite has it now
                    del self._kv_written[name]
            log.info(
                "store %s: checkpoint through log generation %d: %.1f MB of redo log in %.2fs",
                self.path,
                generation,
                self._checkpoint_size / 1e6,
                seconds,
            )
            return
        # Its log files stay, so nothing is lost; the next checkpoint applies them too.
        log.error(
            "store %s: checkpoint through log generation %d failed (exit status %d),"
            " retried with the next one",
            self.path,
            generation,
            code,
        )

    def _note_result(self, error: str | None) -> None:
        if error is None:
            if self._failures:
                log.warning(
                    "store %s: writes succeed again after %d failed (last: %s)",
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
            log.error("store %s: redo log write failed, clients get errors: %s", self.path, error)
            self._logged_at = now
        self.last_error = error

    # ------------------------------------------------------------------ shutdown

    def close(self) -> None:
        """Write what is pending, apply the whole log to SQLite and close the file."""
        if self._closed:
            return
        self._hand_off()
        self._closed = True
        self._log.stop()
        if self._checkpoint is not None:
            self._checkpoint.wait()
            self._checkpoint = None
        # Every frame written is in the log files, reported or not: SQLite takes them all.
        try:
            apply_log(self._conn, self.path)
            ok = True
        except StoreError as exc:  # the log files stay: the next start applies them
            log.error("store %s: final checkpoint failed: %s", self.path, exc)
            ok = False
        self._done = self._handed
        self._report_created(self._handed, ok)
        self._notify(self._handed, ok)
        try:
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as exc:
            log.warning("store %s: final checkpoint failed: %s", self.path, exc)
        self._conn.close()
        os.close(self._lock)


def _child_env() -> dict[str, str]:
    """The environment of a checkpoint process: it imports this jobwire, wherever it is."""
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    return env
