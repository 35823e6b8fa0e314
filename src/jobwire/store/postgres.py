"""The PostgreSQL store: one node's jobs in a PostgreSQL database, one statement per batch.

`--store postgresql://USER:PASS@HOST:PORT/DB` (libpq's URI; `?options=-csearch_path%3DNAME`
puts jobwire's tables in schema NAME). The tables are created and migrated by jobwire
(`SCHEMA_VERSION`, `jobwire db migrate`, `jobwire db status`).

Group commit, as in the SQLite store: the engine calls `job_saved` / `job_removed` on the
event loop thread, and they only note the job in the current batch (the latest change per
job wins; a job created and removed within one batch writes nothing). At the end of the
loop turn (or between two reads, for a large batch) the batch is turned into column arrays
on the loop thread and sent as ONE statement (`BATCH_SQL`: data-modifying CTEs over
`unnest` of the arrays, upserting changed jobs, deleting finished ones, writing key-value
records) in autocommit: one round trip and one commit per batch, whatever its size. Up to
`IN_FLIGHT` (2) batches are in flight at once, each on its own connection, so one is sent
while the other waits for its WAL flush, and PostgreSQL can flush both at once; a batch that
changes a job of a batch in flight waits for it, so the latest state always lands last; the
turns written meanwhile join the next batch. Waiters hear of batches in order.

Failures. Every row carries a job's whole state, so a batch can be sent again: when the
connection breaks, the batch is retried once on a new connection (a killed backend,
`pg_terminate_backend`, costs nothing). If that fails too, the batch fails: its new jobs go
to `on_failure` (the runtime retracts them: clients get QUEUE_ERROR / 503) and its waiters
hear `False`; its changes to older jobs are carried into the next batch, so the database
catches up with the engine once it is back. While it is down, batches fail at once and a new
connection is tried with back-off (`RECONNECT_MIN` doubling to `RECONNECT_MAX`).

One node per database (schema): the node holds a PostgreSQL advisory lock (per schema) for
as long as it runs, so a second `jobwire serve` on the same tables is refused instead of
replaying and running the same jobs. Sharing one database between nodes is not built yet
(docs/scaling.md says how it would be).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import psycopg

from jobwire.engine.job import Job
from jobwire.ports import RetractJobs, StoredJob

# A job's row with every column, `Job.ext` encoded as the SQLite store encodes it.
from jobwire.store.frames import KVChanges, full_row
from jobwire.store.sqlite import EARLY_BATCH_WRITES, StoreError

log = logging.getLogger("jobwire.store")

SCHEMA_VERSION = 2
#: Seconds between two connection attempts while PostgreSQL is away: doubling from the
#: first to the last.
RECONNECT_MIN = 0.05
RECONNECT_MAX = 2.0
CONNECT_TIMEOUT = 5
#: Commits in flight at once, each on a connection of its own: while one waits for its WAL
#: flush the next is sent, and PostgreSQL flushes both with one fsync when it can. Batches
#: that change the same job never fly together (`PostgresStore._overlaps_a_commit`).
IN_FLIGHT = max(1, int(os.environ.get("JOBWIRE_PG_IN_FLIGHT", "2")))  # 1: bench/durable.py
#: Seconds a commit may take before its connection is given up for a new one (a database
#: that stopped answering without closing the connection).
COMMIT_TIMEOUT = 30.0
#: Seconds a starting node waits for the lock of a node that just ended.
LOCK_WAIT = 3.0
#: While commits keep failing, repeat the same error in the log at most this often (seconds).
_LOG_EVERY = 10.0
#: The advisory lock a node holds: this constant and the hash of the schema's name.
_LOCK_CLASS = 0x6A6F62  # "job"
_LOCK_KEY = f"{_LOCK_CLASS}, hashtext(current_schema())"

SCHEMA_STATEMENTS = (
    "CREATE TABLE IF NOT EXISTS jobwire_schema (version integer NOT NULL)",
    # `seq` is the node's key for a job (`Job.row`), given out in enqueue order: replay
    # scans the primary key in order.
    """CREATE TABLE IF NOT EXISTS jobs (
        seq bigint PRIMARY KEY,
        id text NOT NULL,
        function text NOT NULL,
        queue text NOT NULL,
        uniq text,
        payload bytea NOT NULL,
        priority integer NOT NULL,
        state integer NOT NULL,
        attempts integer NOT NULL,
        max_attempts integer,
        run_at double precision,
        created_at double precision NOT NULL,
        reducer text,
        ext bytea
    )""",
    """CREATE TABLE IF NOT EXISTS kv (
        namespace text NOT NULL,
        key text NOT NULL,
        value bytea NOT NULL,
        PRIMARY KEY (namespace, key)
    )""",
)
#: Migrations from version N to N + 1, by N (version 0: no tables).
MIGRATIONS: dict[int, tuple[str, ...]] = {
    0: SCHEMA_STATEMENTS,
    # Version 2: the listener each job came through (`Job.origin`); older rows: 0, unknown.
    1: ("ALTER TABLE jobs ADD COLUMN IF NOT EXISTS origin smallint NOT NULL DEFAULT 0",),
}

_COLUMNS = (
    "seq, id, function, queue, uniq, payload, priority, state, attempts, max_attempts,"
    " run_at, created_at, reducer, ext, origin"
)
_TYPES = [
    "bigint",
    "text",
    "text",
    "text",
    "text",
    "bytea",
    "integer",
    "integer",
    "integer",
    "integer",
    "float8",
    "float8",
    "text",
    "bytea",
    "int2",
]
_UPDATES = ", ".join(f"{c} = EXCLUDED.{c}" for c in _COLUMNS.split(", ")[1:])
_ARRAYS = ", ".join(f"%b::{t}[]" for t in _TYPES)
#: One batch, one statement, its parameters sent in binary (`%b`: a third of the client's
#: CPU of text, bench/pg_drivers.py) (21 parameters: 15 job columns, the row keys to delete, the
#: key-value records to write (namespace, key, value) and to delete (namespace, key)).
BATCH_SQL = f"""
WITH saved AS (
    INSERT INTO jobs ({_COLUMNS}) SELECT * FROM unnest({_ARRAYS})
    ON CONFLICT (seq) DO UPDATE SET {_UPDATES}
), removed AS (
    DELETE FROM jobs WHERE seq = ANY(%b::bigint[])
), put AS (
    INSERT INTO kv (namespace, key, value) SELECT * FROM unnest(%b::text[], %b::text[], %b::bytea[])
    ON CONFLICT (namespace, key) DO UPDATE SET value = EXCLUDED.value
), unput AS (
    DELETE FROM kv WHERE (namespace, key) IN (SELECT * FROM unnest(%b::text[], %b::text[]))
)
SELECT 1
"""
# StoredJob's field order: the row key, then the origin.
_LOAD = f"SELECT {_COLUMNS.removeprefix('seq, ').removesuffix(', origin')}, seq, origin FROM jobs"
_LOAD += " ORDER BY seq"
_KV_LOAD = "SELECT key, value FROM kv WHERE namespace = %s"
_ENGINE_NAMESPACE = "engine"
_NUMBERS_KEY = "numbers_reserved"

Callback = Callable[[bool], None]
#: A job's row as sent: the 15 columns in `_COLUMNS` order.
Row = tuple[Any, ...]


def batch_parameters(rows: dict[int, Row | None], kv: KVChanges) -> list[list[Any]]:
    """`BATCH_SQL`'s parameters for these changes (row key -> row, None: delete)."""
    columns: list[list[Any]] = [[] for _ in _TYPES]
    deleted: list[int] = []
    for key, row in rows.items():
        if row is None:
            deleted.append(key)
        else:
            for column, value in zip(columns, row, strict=True):
                column.append(value)
    put: list[list[Any]] = [[], [], []]
    unput: list[list[Any]] = [[], []]
    for (namespace, name), value in kv.items():
        if value is None:
            unput[0].append(namespace)
            unput[1].append(name)
        else:
            put[0].append(namespace)
            put[1].append(name)
            put[2].append(value)
    return [*columns, deleted, *put, *unput]


def schema_version(conn: psycopg.Connection[Any]) -> int:
    """The version of jobwire's tables in the connection's schema (0: none)."""
    exists = conn.execute("SELECT to_regclass('jobwire_schema') IS NOT NULL").fetchone()
    if not exists or not exists[0]:
        return 0
    row = conn.execute("SELECT max(version) FROM jobwire_schema").fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def migrate(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    """Create or upgrade jobwire's tables, in one transaction: (version before, after).
    StoreError if the tables are newer than this jobwire."""
    with conn.transaction():
        # Two nodes starting at once must not both create the tables.
        conn.execute(f"SELECT pg_advisory_xact_lock({_LOCK_CLASS} + 1, hashtext(current_schema()))")
        before = version = schema_version(conn)
        if version > SCHEMA_VERSION:
            raise StoreError(f"schema version {version}, this jobwire knows {SCHEMA_VERSION}")
        while version < SCHEMA_VERSION:
            for statement in MIGRATIONS[version]:
                conn.execute(statement)
            version += 1
        if version != before:
            conn.execute("DELETE FROM jobwire_schema")
            conn.execute("INSERT INTO jobwire_schema (version) VALUES (%s)", (version,))
    return before, version


def connect(dsn: str) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT)
    except psycopg.Error as exc:
        raise StoreError(f"cannot connect to PostgreSQL: {_reason(exc)}") from exc


def status(dsn: str) -> dict[str, Any]:
    """What `jobwire db status` prints: schema version, jobs by state, records, lock."""
    with connect(dsn) as conn:
        try:
            version = schema_version(conn)
            info: dict[str, Any] = {
                "schema": conn.execute("SELECT current_schema()").fetchone()[0],  # type: ignore[index]
                "version": version,
                "known_version": SCHEMA_VERSION,
            }
            if version:
                states = conn.execute("SELECT state, count(*) FROM jobs GROUP BY state").fetchall()
                info["jobs"] = {int(state): int(count) for state, count in states}
                info["records"] = conn.execute("SELECT count(*) FROM kv").fetchone()[0]  # type: ignore[index]
            holder = conn.execute(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
                " AND classid = %s AND objid = hashtext(current_schema())::oid AND objsubid = 2",
                (_LOCK_CLASS,),
            ).fetchone()
            info["node_pid"] = None if holder is None else int(holder[0])
        except psycopg.Error as exc:
            raise StoreError(f"cannot read the store: {_reason(exc)}") from exc
    return info


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _is_disconnect(exc: BaseException) -> bool:
    return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)


class PostgresStore:
    """A `Store` on a PostgreSQL database. Create it, `load()`, then use it from one loop.

    Not a `Journal` subclass: that base is compiled with the engine, and this module is not
    (the engine wraps it in a `StoreJournal`)."""

    durable = True

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.write_count = 0
        self.commits = 0  # successful batches, for benchmarks and tests
        self.round_trips = 0  # statements sent for batches, for benchmarks and tests
        #: Why the latest commit failed; None once one succeeds again.
        self.last_error: str | None = None
        # The lock connection: takes the node's lock, migrates, replays; then only holds
        # the lock (its backend's pid is `_holder`).
        self._lock_conn = connect(dsn)
        try:
            migrate(self._lock_conn)
            self._holder = self._take_lock(self._lock_conn)
            row = self._lock_conn.execute("SELECT COALESCE(max(seq), 0) FROM jobs").fetchone()
            self._next_row = 1 + int(row[0]) if row else 1
        except psycopg.Error as exc:
            self._lock_conn.close()
            raise StoreError(f"cannot open the store: {_reason(exc)}") from exc
        except BaseException:
            self._lock_conn.close()
            raise
        # The connections commits go on, one per commit in flight, made when first needed.
        self._conns: list[psycopg.AsyncConnection[Any] | None] = [None] * IN_FLIGHT
        self._free = list(range(IN_FLIGHT))  # the slots of `_conns` not in use
        self._connecting = asyncio.Lock()
        self._retry_at = 0.0  # monotonic time of the next connection attempt
        self._retry_delay = RECONNECT_MIN
        # The current batch: jobs by row key (None: removed), new rows, key-value writes.
        self._changes: dict[int, Job | None] = {}
        self._new_rows: set[int] = set()
        self._created: list[Job] = []
        self._kv: KVChanges = {}
        self._kv_written: KVChanges = {}  # every key-value write handed off
        # Rows of older jobs from batches that failed: sent again under the next batch.
        self._carried: dict[int, Row | None] = {}
        self._kv_carried: KVChanges = {}
        self._scheduled = False
        self._handed = 0  # number of the last batch handed off
        self._handed_at = 0  # `write_count` then
        self._done = 0  # number of the last batch whose commit finished
        # Batches in flight: their row keys, key-value names and task, by batch number.
        self._flying: dict[int, tuple[set[int], set[tuple[str, str]], asyncio.Task[None]]] = {}
        self._results: dict[int, bool] = {}  # finished before an earlier batch: ok, by number
        self._waiters: deque[tuple[int, Callback]] = deque()
        self._retract: RetractJobs | None = None
        self._failures = 0
        self._logged_at = 0.0
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def _take_lock(self, conn: psycopg.Connection[Any]) -> int:
        """Take the node's lock, waiting up to `LOCK_WAIT` seconds: the backend of a node
        killed a moment ago may not have ended yet, and holds it until it does."""
        deadline = time.monotonic() + LOCK_WAIT
        while True:
            row = conn.execute(
                f"SELECT pg_try_advisory_lock({_LOCK_KEY}), pg_backend_pid()"
            ).fetchone()
            assert row is not None
            if row[0]:
                return int(row[1])
            if time.monotonic() >= deadline:
                raise StoreError("the store is in use by another jobwire node")
            time.sleep(0.02)

    # ------------------------------------------------------------------ start-up reads

    def load(self) -> Iterator[StoredJob]:
        names: dict[str, str] = {}
        try:
            with self._lock_conn.cursor(name="jobwire_load") as cur, self._lock_conn.transaction():
                cur.itersize = 10_000
                cur.execute(_LOAD)
                for row in cur:
                    job = StoredJob(*row)
                    job.function = names.setdefault(job.function, job.function)
                    job.queue = names.setdefault(job.queue, job.queue)
                    job.payload = bytes(job.payload)
                    if job.ext is not None:
                        job.ext = bytes(job.ext)
                    yield job
        except psycopg.Error as exc:
            raise StoreError(f"cannot read the store: {_reason(exc)}") from exc

    def numbers_ceiling(self) -> int:
        raw = self.kv_load(_ENGINE_NAMESPACE).get(_NUMBERS_KEY)
        return int(raw) if raw is not None else 0

    def kv_load(self, namespace: str) -> dict[str, bytes]:
        """`KeyValueStore.kv_load`: call at start-up, like load(), before the first write."""
        try:
            rows = self._lock_conn.execute(_KV_LOAD, (namespace,)).fetchall()
        except psycopg.Error as exc:
            raise StoreError(f"cannot read the store: {_reason(exc)}") from exc
        records = {key: bytes(value) for key, value in rows}
        for layer in (self._kv_written, self._kv):
            for (ns, key), value in layer.items():
                if ns == namespace:
                    if value is None:
                        records.pop(key, None)
                    else:
                        records[key] = value
        return records

    # ------------------------------------------------------------------ engine hooks

    def job_saved(self, job: Job) -> None:
        self.write_count += 1
        key = job.row
        if not key:  # first save: the row key is ours to give
            key = job.row = self._next_row
            self._next_row += 1
            self._new_rows.add(key)
            self._created.append(job)
        self._changes[key] = job
        if not self._scheduled:
            self._schedule()

    def job_removed(self, job: Job) -> None:
        self.write_count += 1
        key = job.row
        if key:
            if key in self._new_rows:  # created in this batch: nothing to write
                self._new_rows.discard(key)
                self._changes.pop(key, None)
            else:
                self._changes[key] = None
        if not self._scheduled:
            self._schedule()

    def numbers_reserved(self, ceiling: int) -> None:
        self.kv_put(_ENGINE_NAMESPACE, _NUMBERS_KEY, str(ceiling).encode())

    def kv_put(self, namespace: str, key: str, value: bytes | None) -> None:
        self.write_count += 1
        self._kv[(namespace, key)] = value
        if not self._scheduled:
            self._schedule()

    # ------------------------------------------------------------------ committer

    def pending(self) -> bool:
        return self._has_writes() or self._handed > self._done

    def on_failure(self, retract: RetractJobs) -> None:
        self._retract = retract

    def poll(self) -> None:
        """Commits report through the loop (the driver's socket); nothing to poll."""

    def after_commit(self, callback: Callback) -> None:
        if self._has_writes():
            self._waiters.append((self._handed + 1, callback))
        elif self._handed > self._done:
            self._waiters.append((self._handed, callback))
        else:
            callback(True)

    def commit_if_idle(self) -> None:
        """Between two reads, a large batch goes at once if no commit is in flight (as the
        SQLite store sends one to an idle disk)."""
        if not self._flying and self.write_count - self._handed_at >= EARLY_BATCH_WRITES:
            self._hand_off()

    def start(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()

    def _schedule(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        self._scheduled = True
        self._loop.call_soon(self._turn_ended)

    def _turn_ended(self) -> None:
        self._scheduled = False
        self._hand_off()

    def _has_writes(self) -> bool:
        return bool(self._changes or self._kv or self._created)

    def _take_batch(self) -> tuple[dict[int, Row | None], KVChanges, list[Job]]:
        """The current batch as rows, under what failed batches left to carry."""
        rows = dict(self._carried)
        for key, job in self._changes.items():
            rows[key] = None if job is None else full_row(job)
        kv = dict(self._kv_carried)
        kv.update(self._kv)
        created = self._created
        self._carried, self._kv_carried = {}, {}
        self._changes, self._kv, self._created = {}, {}, []
        self._new_rows = set()
        return rows, kv, created

    def _overlaps_a_commit(self) -> bool:
        """Some row or record of the current batch is also in a commit in flight: the batch
        must wait for it, or the older state could land last."""
        for keys, names, _ in self._flying.values():
            if not keys.isdisjoint(self._changes) or not keys.isdisjoint(self._carried):
                return True
            if not names.isdisjoint(self._kv) or not names.isdisjoint(self._kv_carried):
                return True
        return False

    def _hand_off(self, carried: bool = False) -> None:
        """Send the batch on a free connection; with none free, or when it touches a job of a
        commit in flight, it goes when a commit ends. With `carried`, also when only rows of
        failed batches wait."""
        if self._closed or not self._free:
            return
        if not (self._has_writes() or (carried and (self._carried or self._kv_carried))):
            return
        if self._flying and self._overlaps_a_commit():
            return
        self._handed += 1
        number = self._handed
        self._handed_at = self.write_count
        created = self._created
        try:
            rows, kv, created = self._take_batch()
        except Exception as exc:  # a value that cannot be turned into a row: this batch fails
            log.exception("store: cannot encode a batch")
            self._changes, self._kv, self._created, self._new_rows = {}, {}, [], set()
            self._finished(number, None, {}, {}, created, f"cannot encode the batch: {exc!r}")
            return
        if kv:
            self._kv_written.update(kv)
        slot = self._free.pop()
        assert self._loop is not None
        task = self._loop.create_task(self._commit(number, slot, rows, kv, created))
        self._flying[number] = (set(rows), set(kv), task)

    async def _commit(
        self,
        number: int,
        slot: int,
        rows: dict[int, Row | None],
        kv: KVChanges,
        created: list[Job],
    ) -> None:
        error: str | None = None
        if rows or kv:
            try:
                await self._execute(slot, batch_parameters(rows, kv))
            except Exception as exc:
                error = _reason(exc)
        self._finished(number, slot, rows, kv, created, error)

    async def _execute(self, slot: int, parameters: list[list[Any]]) -> None:
        """One statement, on a new connection once more if the connection broke."""
        for attempt in (1, 2):
            conn = await self._connection(slot)
            try:
                self.round_trips += 1
                async with asyncio.timeout(COMMIT_TIMEOUT):
                    await conn.execute(BATCH_SQL, parameters)
                return
            except Exception as exc:
                if (
                    not _is_disconnect(exc)
                    and not conn.broken
                    and not isinstance(exc, TimeoutError)
                ):
                    raise
                self._drop_connection(slot)
                if attempt == 2:
                    raise

    async def _connection(self, slot: int) -> psycopg.AsyncConnection[Any]:
        conn = self._conns[slot]
        if conn is not None and not conn.broken and not conn.closed:
            return conn
        async with self._connecting:  # one at a time: each may take the node's lock
            if time.monotonic() < self._retry_at:
                raise StoreUnavailableError(f"PostgreSQL is away ({self.last_error})")
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.dsn,
                    autocommit=True,
                    connect_timeout=CONNECT_TIMEOUT,
                    prepare_threshold=0,
                )
                try:
                    await self._check_lock(conn)
                except BaseException:
                    await conn.close()
                    raise
            except Exception:
                self._retry_at = time.monotonic() + self._retry_delay
                self._retry_delay = min(self._retry_delay * 2, RECONNECT_MAX)
                raise
            self._retry_delay = RECONNECT_MIN
            self._conns[slot] = conn
            return conn

    async def _check_lock(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """The node's lock is still held by the connection that took it, or this one takes
        it now (PostgreSQL restarted); StoreError if another node took it meanwhile."""
        cur = await conn.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND classid = %s AND objid = hashtext(current_schema())::oid AND objsubid = 2",
            (_LOCK_CLASS,),
        )
        row = await cur.fetchone()
        if row is not None and int(row[0]) == self._holder:
            return
        cur = await conn.execute(f"SELECT pg_try_advisory_lock({_LOCK_KEY}), pg_backend_pid()")
        taken = await cur.fetchone()
        assert taken is not None
        if not taken[0]:
            raise StoreError("the store is in use by another jobwire node")
        self._holder = int(taken[1])

    def _drop_connection(self, slot: int) -> None:
        conn, self._conns[slot] = self._conns[slot], None
        if conn is not None and self._loop is not None:
            self._loop.create_task(_close_quietly(conn))

    def _finished(
        self,
        number: int,
        slot: int | None,
        rows: dict[int, Row | None],
        kv: KVChanges,
        created: list[Job],
        error: str | None,
    ) -> None:
        """On the loop: batch `number` is committed (error None) or failed. Its new jobs
        are retracted at once if it failed; its waiters hear of it once every batch before
        it has finished too, in order."""
        self._flying.pop(number, None)
        if slot is not None:
            self._free.append(slot)
        ok = error is None
        self._note_result(error)
        if ok:
            self.commits += 1
        else:
            # The older jobs' rows go again with a later batch (newer changes win); the new
            # jobs are retracted, and their removal is written then too.
            new = {job.row for job in created}
            carried = {key: row for key, row in rows.items() if key not in new}
            carried.update(self._carried)
            self._carried = carried
            kv_carried = dict(kv)
            kv_carried.update(self._kv_carried)
            self._kv_carried = kv_carried
            if created and self._retract is not None:
                try:
                    self._retract(created)
                except Exception:
                    log.exception("retracting the jobs of a failed batch failed")
        results = self._results
        results[number] = ok
        waiters = self._waiters
        while self._done + 1 in results:
            self._done += 1
            reported = results.pop(self._done)
            while waiters and waiters[0][0] <= self._done:
                callback = waiters.popleft()[1]
                try:
                    callback(reported)
                except Exception:
                    log.exception("after_commit callback failed")
        # The next batch goes at once; rows carried from a failed batch go with it, or
        # alone once a commit succeeds again (PostgreSQL is back).
        self._hand_off(carried=ok)

    def _note_result(self, error: str | None) -> None:
        if error is None:
            if self._failures:
                log.warning(
                    "store: commits succeed again after %d failed (last: %s)",
                    self._failures,
                    self.last_error,
                )
                self._failures = 0
                self.last_error = None
            return
        self._failures += 1
        now = time.monotonic()
        if error != self.last_error or now - self._logged_at >= _LOG_EVERY:
            log.error("store: PostgreSQL commit failed, clients get errors: %s", error)
            self._logged_at = now
        self.last_error = error

    # ------------------------------------------------------------------ shutdown

    async def drain(self) -> None:
        """Commit everything pending, the rows carried from failed batches too (the server
        calls it before `close`); after three failed attempts it leaves the rest (logged)."""
        attempts = 0
        while True:
            if self._flying:
                await asyncio.wait([task for _, _, task in self._flying.values()])
                continue  # a finished commit may have sent the next batch
            if attempts == 3 or not (self._has_writes() or self._carried or self._kv_carried):
                return
            attempts += 1
            self._retry_at = 0.0
            self._hand_off(carried=True)

    def close(self) -> None:
        """Write what is pending (when no commit is in flight) and close the connections."""
        if self._closed:
            return
        ok = True
        if self._flying:
            log.error("store: closed with commits in flight (call drain() first)")
            for _, _, task in self._flying.values():
                task.cancel()
            ok = False
        elif self._has_writes() or self._carried or self._kv_carried:
            rows, kv, _created = self._take_batch()
            self._handed += 1
            try:
                if rows or kv:
                    self._lock_conn.execute(BATCH_SQL, batch_parameters(rows, kv))
            except psycopg.Error as exc:
                log.error("store: final commit failed: %s", _reason(exc))
                ok = False
        self._closed = True
        self._done = self._handed
        waiters, self._waiters = self._waiters, deque()
        for _, callback in waiters:
            try:
                callback(ok)
            except Exception:
                log.exception("after_commit callback failed")
        for slot, conn in enumerate(self._conns):
            self._conns[slot] = None
            if conn is not None:
                conn.pgconn.finish()
        self._lock_conn.close()


class StoreUnavailableError(Exception):
    """PostgreSQL is away and the next connection attempt is not due yet."""


async def _close_quietly(conn: psycopg.AsyncConnection[Any]) -> None:
    with contextlib.suppress(Exception):
        await conn.close()
