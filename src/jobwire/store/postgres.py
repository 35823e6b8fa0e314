"""The PostgreSQL store: a node's jobs in a PostgreSQL database, one statement per batch.

`--store postgresql://USER:PASS@HOST:PORT/DB` (libpq's URI; `?options=-csearch_path%3DNAME`
puts jobwire's tables in schema NAME). The tables are created and migrated by jobwire
(`SCHEMA_VERSION`, `jobwire db migrate`, `jobwire db status`).

Group commit, as in the SQLite store: the engine calls `job_saved` / `job_removed` on the
event loop thread, and they only note the job in the current batch (the latest change per
job wins; a job created and removed within one batch writes nothing). At the end of the
loop turn (or between two reads, for a large batch) the batch is turned into column arrays
on the loop thread and sent as ONE statement (`BATCH_SQL`: data-modifying CTEs over
`unnest` of the arrays, inserting new jobs, upserting changed ones, deleting finished ones,
writing key-value records) in autocommit: one round trip and one commit per batch, whatever
its size. Up to `IN_FLIGHT` (2) batches are in flight at once, each on its own connection, so
one is sent while the other waits for its WAL flush, and PostgreSQL can flush both at once; a
batch that changes a job of a batch in flight waits for it, so the latest state always lands
last; the turns written meanwhile join the next batch. Waiters hear of batches in order.

Failures. Every row carries a job's whole state, so a batch can be sent again: when the
connection breaks, the batch is retried once on a new connection (a killed backend,
`pg_terminate_backend`, costs nothing). If that fails too, the batch fails: its new jobs go
to `on_failure` (the runtime retracts them: clients get QUEUE_ERROR / 503) and its waiters
hear `False`; its changes to older jobs are carried into the next batch, so the database
catches up with the engine once it is back. While it is down, batches fail at once and a new
connection is tried with back-off (`RECONNECT_MIN` doubling to `RECONNECT_MAX`).

Several nodes per database (schema) form a cluster: each registers in `nodes` with a lease
and holds an advisory lock of its own; every row it writes carries its owner (NULL: in the
shared queue), and its changes and deletions are conditional on owning the row, so a node
declared dead writes nothing over the jobs the others requeued. At start a node adopts the
jobs of dead nodes (and the unowned ones when it is alone) and replays only what it owns.
Leases, claims and wake-ups run beside the engine in `jobwire.store.pgcluster`;
docs/scaling.md ("The cluster") describes the whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import psycopg

from jobwire.engine.job import Job, JobState
from jobwire.ports import RetractJobs, StoredJob

# A job's row with every column, `Job.ext` encoded as the SQLite store encodes it.
from jobwire.store import pgarrays
from jobwire.store.frames import KVChanges, full_row
from jobwire.store.sharedkeys import CRON_CHANGED, CRON_NAMESPACE, shared_key
from jobwire.store.sqlite import EARLY_BATCH_WRITES, StoreError

log = logging.getLogger("jobwire.store")

SCHEMA_VERSION = 7


@dataclass(frozen=True, slots=True)
class WrittenAs:
    """What `PostgresStore.releases` answers for a new job to be written as `node`'s (this
    node's or another's) in its own batch: that node runs it once the batch commits,
    without claiming it (`jobwire.store.pgcluster`). A foreground job's client waits here;
    a background job is told to the cluster after its commit (`PostgresStore.on_handed`)."""

    node: int


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
#: Seconds a starting node waits for a node that ran on its address (a killed process whose
#: backend has not ended yet) to be found dead, so that it adopts its jobs.
LOCK_WAIT = 3.0
#: Seconds a node's lease lasts (`--node-lease`); it is renewed every third of it.
NODE_LEASE = 15.0
#: Row keys a node takes from the `job_keys` sequence at a time (its INCREMENT).
KEY_BLOCK = 65536
#: While commits keep failing, repeat the same error in the log at most this often (seconds).
_LOG_EVERY = 10.0
#: The transaction lock that keeps two nodes from migrating at once: this constant + 1 and
#: the hash of the schema's name.
_LOCK_CLASS = 0x6A6F62  # "job"
#: The advisory lock each node holds while it runs, on one bigint: the schema's hash and the
#: node's id. A starting node that can take another node's lock knows that node is gone.
_NODE_LOCK = "(hashtext(current_schema())::bigint << 32) | %s"

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
#: Version 2, the cluster: nodes with leases, an owner per job (NULL: any node may claim it),
#: row keys from a sequence in blocks, and the indexes claims and status look-ups use; and
#: the listener each job came through (`Job.origin`; older rows: 0, unknown).
CLUSTER_STATEMENTS = (
    "CREATE SEQUENCE IF NOT EXISTS node_ids",
    """CREATE TABLE IF NOT EXISTS nodes (
        id bigint PRIMARY KEY DEFAULT nextval('node_ids'),
        address text NOT NULL,
        pid integer NOT NULL,
        started_at timestamptz NOT NULL DEFAULT now(),
        lease_until timestamptz NOT NULL
    )""",
    "ALTER TABLE jobs ADD COLUMN IF NOT EXISTS owner bigint",
    "ALTER TABLE jobs ADD COLUMN IF NOT EXISTS origin smallint NOT NULL DEFAULT 0",
    # The node a foreground job's client waits on: the node running it tells that one.
    "ALTER TABLE jobs ADD COLUMN IF NOT EXISTS client_node bigint",
    # Results too large for a notification, named by the one that tells of them.
    "CREATE TABLE IF NOT EXISTS relay (id bigserial PRIMARY KEY, payload text NOT NULL)",
    f"CREATE SEQUENCE IF NOT EXISTS job_keys INCREMENT BY {KEY_BLOCK}",
    "SELECT setval('job_keys', (SELECT COALESCE(max(seq), 0) + 1 FROM jobs), false)",
    "CREATE INDEX IF NOT EXISTS jobs_unowned_by_function"
    " ON jobs (function, priority DESC, created_at, seq) WHERE owner IS NULL",
    "CREATE INDEX IF NOT EXISTS jobs_unowned_by_queue"
    " ON jobs (queue, priority DESC, created_at, seq) WHERE owner IS NULL",
    "CREATE INDEX IF NOT EXISTS jobs_by_id ON jobs (id)",
)
#: Version 3, state the nodes share (`jobwire.store.pgshared`): each live job's unique key
#: with a unique index (one job per key in the whole cluster), the cron ticks fired, and the
#: paused queues. Rows written before have no key: they coalesce only on their own node.
SHARED_STATEMENTS = (
    "ALTER TABLE jobs ADD COLUMN IF NOT EXISTS ukey text",
    "CREATE UNIQUE INDEX IF NOT EXISTS jobs_by_unique_key ON jobs (ukey) WHERE ukey IS NOT NULL",
    """CREATE TABLE IF NOT EXISTS cron_ticks (
        name text NOT NULL,
        at double precision NOT NULL,
        node bigint NOT NULL,
        fired_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (name, at)
    )""",
    """CREATE TABLE IF NOT EXISTS paused_queues (
        queue text PRIMARY KEY,
        since timestamptz NOT NULL DEFAULT now()
    )""",
)
#: Version 4, the queues' rate limits the nodes share (`jobwire.store.pgrates`): a token
#: bucket per queue.
RATE_STATEMENTS = (
    """CREATE TABLE IF NOT EXISTS queue_rates (
        queue text PRIMARY KEY,
        per_second integer NOT NULL,
        tokens double precision NOT NULL,
        refreshed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
        granted integer NOT NULL DEFAULT 0
    )""",
)
#: Version 5, the rate-limiting extension's keyed limits the nodes share
#: (`jobwire.store.pgrates`): a token bucket per key, the slots of a key's running jobs, and
#: the function that takes both for one job under the key's row lock. And the node that
#: keeps each key-value record (`NODE_NAMESPACES`; 0: every node's, as cron entries).
KEYED_STATEMENTS = (
    "ALTER TABLE kv ADD COLUMN IF NOT EXISTS owner bigint NOT NULL DEFAULT 0",
    "ALTER TABLE kv DROP CONSTRAINT IF EXISTS kv_pkey",
    "ALTER TABLE kv ADD PRIMARY KEY (namespace, owner, key)",
    """CREATE TABLE IF NOT EXISTS key_limits (
        key text PRIMARY KEY,
        tokens double precision NOT NULL,
        refreshed_at timestamptz NOT NULL DEFAULT clock_timestamp()
    )""",
    """CREATE TABLE IF NOT EXISTS key_slots (
        job text PRIMARY KEY,
        key text NOT NULL,
        node bigint NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS key_slots_by_key ON key_slots (key)",
    """CREATE OR REPLACE FUNCTION take_keyed(
        p_key text, p_job text, p_node bigint, p_concurrency integer, p_rate integer,
        p_period double precision
    ) RETURNS boolean LANGUAGE plpgsql AS $$
    DECLARE
        limits key_limits%ROWTYPE;
        held integer;
        available double precision;
    BEGIN
        INSERT INTO key_limits (key, tokens) VALUES (p_key, COALESCE(p_rate, 0))
            ON CONFLICT (key) DO NOTHING;
        SELECT * INTO limits FROM key_limits WHERE key = p_key FOR UPDATE;
        IF p_concurrency IS NOT NULL THEN
            DELETE FROM key_slots s WHERE s.key = p_key AND NOT EXISTS (
                SELECT 1 FROM nodes n WHERE n.id = s.node AND n.lease_until > now());
            SELECT count(*) INTO held FROM key_slots s WHERE s.key = p_key AND s.job <> p_job;
            IF held >= p_concurrency THEN
                RETURN false;
            END IF;
        END IF;
        IF p_rate IS NOT NULL THEN
            available := LEAST(p_rate, limits.tokens + p_rate * GREATEST(0, EXTRACT(EPOCH FROM
                clock_timestamp() - limits.refreshed_at)) / p_period);
            IF available < 1 THEN
                UPDATE key_limits SET tokens = available, refreshed_at = clock_timestamp()
                    WHERE key = p_key;
                RETURN false;
            END IF;
            UPDATE key_limits SET tokens = available - 1, refreshed_at = clock_timestamp()
                WHERE key = p_key;
        END IF;
        IF p_concurrency IS NOT NULL THEN
            INSERT INTO key_slots (job, key, node) VALUES (p_job, p_key, p_node)
                ON CONFLICT (job) DO UPDATE SET key = EXCLUDED.key, node = EXCLUDED.node;
        END IF;
        RETURN true;
    END
    $$""",
)
#: Version 6, the links between nodes (`jobwire.store.peerlink`): the address each node
#: listens on for them, and the secret a node proves it knows to open one.
PEER_STATEMENTS = (
    "ALTER TABLE nodes ADD COLUMN IF NOT EXISTS peer text",
    """CREATE TABLE IF NOT EXISTS cluster_secret (
        id integer PRIMARY KEY CHECK (id = 1),
        secret bytea NOT NULL
    )""",
)
#: Version 7: the shared queue's jobs by the time they come due (`jobwire.store.pgcluster`,
#: `NEXT_DUE_SQL`): a node that died or left leaves its scheduled jobs there, and no
#: notification says when they are due. Rows that wait for no time are not in it.
DUE_STATEMENTS = (
    "CREATE INDEX IF NOT EXISTS jobs_unowned_by_run_at ON jobs (run_at)"
    " WHERE owner IS NULL AND run_at IS NOT NULL",
)
#: Migrations from version N to N + 1, by N (version 0: no tables). Rows of a one-node schema
#: (version 1) have no owner after the upgrade: the first node to start alone adopts them.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    0: SCHEMA_STATEMENTS,
    1: CLUSTER_STATEMENTS,
    2: SHARED_STATEMENTS,
    3: RATE_STATEMENTS,
    4: KEYED_STATEMENTS,
    5: PEER_STATEMENTS,
    6: DUE_STATEMENTS,
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
#: A row is rewritten with its owner: this node's, or none for a queued job it gives to the
#: shared queue (`give_away`); only ever by its owner (`WHERE jobs.owner = ...`).
_UPDATES = ", ".join(f"{c} = EXCLUDED.{c}" for c in [*_COLUMNS.split(", ")[1:], "owner"])
_ROW_TYPES = [*_TYPES, "bigint", "bigint"]
_UNIQUE_ROW_TYPES = [*_ROW_TYPES, "text"]
_ARRAYS = ", ".join(f"%b::{t}[]" for t in _ROW_TYPES)
#: One batch, one statement, its parameters sent in binary (`%b`: a third of the client's
#: CPU of text, bench/pg_drivers.py), the arrays encoded by `jobwire.store.pgarrays` (42
#: parameters: the new rows' 15 job columns, owner and client's node; the same 17 of the
#: changed rows; the node, the row keys to delete and the node; the key-value records to
#: write (namespace, key, value, owner) and to delete (namespace, key, owner); the channel
#: and the "function<US>queue" names that got unowned jobs).
#:
#: New rows are a plain insert: an upsert's speculative insertion cost the database a fifth
#: of its CPU per enqueued job (6.2-6.6 against 5.0-5.2 us a row in 500-row batches). A
#: batch sent again after its connection broke may have committed: it goes as all upserts.
#:
#: Fencing: a node changes or deletes only rows it owns. Once other nodes have declared it
#: dead and requeued its jobs, its writes of them change nothing (and its heartbeat stops it).
#: The notifications go out with the commit, to the nodes that LISTEN for ready work.
BATCH_SQL = f"""
WITH fresh AS (
    INSERT INTO jobs ({_COLUMNS}, owner, client_node) SELECT * FROM unnest({_ARRAYS})
), saved AS (
    INSERT INTO jobs ({_COLUMNS}, owner, client_node) SELECT * FROM unnest({_ARRAYS})
    ON CONFLICT (seq) DO UPDATE SET {_UPDATES} WHERE jobs.owner = %b::bigint
), removed AS (
    DELETE FROM jobs WHERE seq = ANY(%b::bigint[]) AND owner = %b::bigint
), put AS (
    INSERT INTO kv (namespace, key, value, owner)
    SELECT * FROM unnest(%b::text[], %b::text[], %b::bytea[], %b::bigint[])
    ON CONFLICT (namespace, owner, key) DO UPDATE SET value = EXCLUDED.value
), unput AS (
    DELETE FROM kv WHERE (namespace, key, owner)
        IN (SELECT * FROM unnest(%b::text[], %b::text[], %b::bigint[]))
)
SELECT count(pg_notify(%b::text, name)) FROM unnest(%b::text[]) AS name
"""
_UNIQUE_ARRAYS = ", ".join(f"%b::{t}[]" for t in _UNIQUE_ROW_TYPES)
#: A batch with new jobs that carry a unique key (`jobwire.store.pgshared.shared_key`):
#: `BATCH_SQL`'s parameters, then those rows with their key last. A row whose key a live job
#: already holds (on any node) is not inserted: the conflict returns that job instead (the
#: no-op update locks it, and waits for a batch inserting the same key to commit or roll
#: back, so two nodes' batches never both take a key). The rows deleted go first (one whose
#: key a new job takes again in this batch must not conflict with it). Answers the count of
#: notifications, then per key taken or found: the key, the row key and the id of its job.
#: Its other rows are all upserted: its new ones mostly carry a key too (the SDK's client
#: gives every submission one), and a statement shorter by a CTE commits sooner.
BATCH_UNIQUE_SQL = f"""
WITH saved AS (
    INSERT INTO jobs ({_COLUMNS}, owner, client_node) SELECT * FROM unnest({_ARRAYS})
    ON CONFLICT (seq) DO UPDATE SET {_UPDATES} WHERE jobs.owner = %b::bigint
), removed AS (
    DELETE FROM jobs WHERE seq = ANY(%b::bigint[]) AND owner = %b::bigint RETURNING 1
), put AS (
    INSERT INTO kv (namespace, key, value, owner)
    SELECT * FROM unnest(%b::text[], %b::text[], %b::bytea[], %b::bigint[])
    ON CONFLICT (namespace, owner, key) DO UPDATE SET value = EXCLUDED.value
), unput AS (
    DELETE FROM kv WHERE (namespace, key, owner)
        IN (SELECT * FROM unnest(%b::text[], %b::text[], %b::bigint[]))
), uniq AS (
    INSERT INTO jobs ({_COLUMNS}, owner, client_node, ukey)
    SELECT * FROM unnest({_UNIQUE_ARRAYS}) WHERE (SELECT count(*) FROM removed) >= 0
    ON CONFLICT (ukey) WHERE ukey IS NOT NULL DO UPDATE SET ukey = EXCLUDED.ukey
    RETURNING ukey, seq, id
)
SELECT (SELECT count(pg_notify(%b::text, name)) FROM unnest(%b::text[]) AS name),
    (SELECT array_agg(ukey) FROM uniq), (SELECT array_agg(seq) FROM uniq),
    (SELECT array_agg(id) FROM uniq)
"""
#: `BATCH_UNIQUE_SQL` for a batch whose rows are all foreground jobs written as the node's
#: that runs them (`WrittenAs`), with no record: its commit does not wait for the WAL flush
#: (`synchronous_commit` off for this transaction alone). Foreground jobs are not durable
#: (one node never stores them): such a row is there to hold the job's unique key in the
#: index, and the job runs from the engine that holds it. Lost in a PostgreSQL crash, the key
#: is free again for the moment the job runs. Takes the WAL flush out of the round trip of a
#: foreground job handed to another node: p50 1.45 against 1.55 ms (medians of six runs
#: alternated, on a VM where a flush took 30-40 us; bench/PERFORMANCE.md, round 45).
BATCH_RELAXED_SQL = BATCH_UNIQUE_SQL.replace(
    "\n), uniq AS (",
    "\n), relaxed AS (SELECT set_config('synchronous_commit', 'off', true) AS was\n), uniq AS (",
).replace(
    "(SELECT array_agg(id) FROM uniq)",
    "(SELECT array_agg(id) FROM uniq), (SELECT count(was) FROM relaxed)",
)
#: Claimed, looked-up and loaded rows, as `StoredJob` takes them: the row key, then the origin.
_STORED = f"{_COLUMNS.removeprefix('seq, ').removesuffix(', origin')}, seq, origin"
_LOAD = f"SELECT {_STORED} FROM jobs WHERE owner = %s ORDER BY seq"
#: At start: nodes whose lease ran out or whose lock is free are dead; their jobs become
#: this node's, and the unowned jobs too if no other node lives; this node's lease is renewed.
#: Parameters: the lease, the node four times. Answers (jobs adopted, whether another node
#: lives).
ADOPT_SQL = f"""
WITH renewed AS (
    UPDATE nodes SET lease_until = now() + make_interval(secs => %s) WHERE id = %s
), dead AS (
    DELETE FROM nodes WHERE id <> %s
    AND (lease_until < now() OR pg_try_advisory_xact_lock({_NODE_LOCK.replace("%s", "id")}))
    RETURNING id
), alone AS (
    SELECT NOT EXISTS (
        SELECT 1 FROM nodes WHERE id <> %s AND id NOT IN (SELECT id FROM dead)
    ) AS yes
), adopted AS (
    UPDATE jobs SET owner = %s
    WHERE owner IN (SELECT id FROM dead) OR (owner IS NULL AND (SELECT yes FROM alone))
    RETURNING 1
)
SELECT (SELECT count(*) FROM adopted), NOT (SELECT yes FROM alone)
"""
#: A node leaving (parameters: the node twice, the channel): its row goes, its jobs lose
#: their owner, and the nodes listening hear which queues got work and that nodes changed.
LEAVE_SQL = """
WITH gone AS (
    DELETE FROM nodes WHERE id = %s RETURNING id
), released AS (
    UPDATE jobs SET owner = NULL WHERE owner = %s AND EXISTS (SELECT 1 FROM gone)
    RETURNING function, queue
)
SELECT count(pg_notify(%s, name)) FROM (
    SELECT DISTINCT function || chr(31) || queue AS name FROM released
    UNION ALL SELECT 'nodes'
) AS names
"""
_KV_LOAD = "SELECT key, value FROM kv WHERE namespace = %s AND owner IN (0, %s)"
#: Key-value records a node keeps for itself (its workflows, dead letters and event log);
#: the others (cron entries, the engine's numbers) every node reads.
NODE_NAMESPACES = frozenset({"workflow", "dead_letter", "events"})
#: At start, after `ADOPT_SQL`: the records of nodes that are gone become this node's, with
#: their jobs, and so do those written before version 5 (owner 0). Event-log chunks are
#: numbered by their node: only the latest node gone keeps its chunks. Parameters: the node
#: twice, `NODE_NAMESPACES`.
KV_ADOPT_SQL = """
WITH orphan AS (
    SELECT DISTINCT owner FROM kv WHERE owner NOT IN (0, %s)
    AND NOT EXISTS (SELECT 1 FROM nodes WHERE nodes.id = kv.owner)
), dropped AS (
    DELETE FROM kv WHERE namespace = 'events' AND owner IN (SELECT owner FROM orphan)
    AND owner < (SELECT max(owner) FROM orphan)
)
UPDATE kv SET owner = %s
WHERE namespace = ANY(%s)
AND (owner = 0 OR owner IN (SELECT owner FROM orphan)
    AND (namespace <> 'events' OR owner = (SELECT max(owner) FROM orphan)))
"""
#: Every statement of the store's and the cluster's is prepared (`prepare_threshold=0`). A
#: generic plan PostgreSQL keeps after five runs may be one made while the tables were small:
#: the batch's delete then scanned all of `jobs` per batch on a fresh schema (11k jobs/s
#: falling to 3k as the queue grew to 300k). These statements find their rows through an
#: index, so none may scan a table; nor be compiled (JIT) when a scan cannot be avoided (the
#: heartbeat's requeue of a dead node's jobs, never run when none died: 290 ms a run).
SESSION_SQL = "SELECT set_config('enable_seqscan', 'off', false), set_config('jit', 'off', false)"
#: The batch statement is planned once: PostgreSQL planned it again at each run (0.6 ms of
#: its CPU per batch, in series with the commit). Not the cluster's claims: their generic plan
#: sorts every unowned job, where a plan for the one function reads its index in order.
BATCH_SESSION_SQL = f"{SESSION_SQL}, set_config('plan_cache_mode', 'force_generic_plan', false)"
_ENGINE_NAMESPACE = "engine"
_NUMBERS_KEY = "numbers_reserved"

Callback = Callable[[bool], None]
UniqueOutcome = Callable[[list[Job], list[tuple[Job, str]], list[Job]], None]
#: A job's row as sent: the 15 columns in `_COLUMNS` order.
Row = tuple[Any, ...]


def batch_parameters(
    rows: dict[int, Row | None],
    kv: KVChanges,
    node: int = 0,
    channel: str = "",
    ready: Iterable[str] = (),
    unique: dict[int, Row] | None = None,
    fresh: Collection[int] = (),
) -> list[Any]:
    """`BATCH_SQL`'s parameters for these changes (row key -> row with its owner and its
    client's node last, None: delete), written by `node`, notifying `ready` on `channel`,
    the rows of `fresh` keys inserted (never written before), the others upserted;
    `BATCH_UNIQUE_SQL`'s with the new rows that carry a unique key (`unique`, each row with
    its key after its client's node), in the order of their keys (two batches inserting the
    same keys then wait for each other in the same order), and every other row upserted."""
    if unique:
        fresh = ()
    new: list[Row] = []
    live: list[Row] = []
    deleted: list[int] = []
    for key, row in rows.items():
        if row is None:
            deleted.append(key)
        elif key in fresh:
            new.append(row)
        else:
            live.append(row)
    put: list[list[Any]] = [[], [], [], []]
    unput: list[list[Any]] = [[], [], []]
    for (namespace, name), value in kv.items():
        owner = node if namespace in NODE_NAMESPACES else 0
        if value is None:
            unput[0].append(namespace)
            unput[1].append(name)
            unput[2].append(owner)
        else:
            put[0].append(namespace)
            put[1].append(name)
            put[2].append(value)
            put[3].append(owner)
    parameters = [
        *([] if unique else _column_arrays(new, _ROW_TYPES)),
        *_column_arrays(live, _ROW_TYPES),
        node,
        pgarrays.encode("bigint", deleted),
        node,
        *map(pgarrays.encode, ("text", "text", "bytea", "bigint"), put),
        *map(pgarrays.encode, ("text", "text", "bigint"), unput),
    ]
    if unique:
        keyed = sorted(unique.values(), key=lambda row: row[-1])  # by key: no deadlock
        parameters += _column_arrays(keyed, _UNIQUE_ROW_TYPES)
    return [*parameters, channel, pgarrays.encode("text", list(ready))]


def _column_arrays(rows: list[Row], types: list[str]) -> list[pgarrays.PgArray]:
    """The rows' columns, each as an array of its type (rows all as long as `types`)."""
    if not rows:
        return [pgarrays.encode(name, ()) for name in types]
    if len(rows[0]) != len(types):
        raise ValueError(f"rows of {len(rows[0])} columns, {len(types)} expected")
    return list(map(pgarrays.encode, types, zip(*rows, strict=True)))


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
            info["nodes"] = []
            if version >= 2:
                peer = "peer" if version >= 6 else "NULL"  # the address of its links
                nodes = conn.execute(
                    f"SELECT id, address, pid, lease_until > now(), {peer},"
                    " (SELECT count(*) FROM jobs WHERE owner = nodes.id) FROM nodes ORDER BY id"
                ).fetchall()
                info["nodes"] = [
                    {
                        "id": n,
                        "address": a,
                        "pid": p,
                        "alive": bool(live),
                        "peer": link,
                        "jobs": int(j),
                    }
                    for n, a, p, live, link, j in nodes
                ]
                unowned = conn.execute("SELECT count(*) FROM jobs WHERE owner IS NULL").fetchone()
                info["unowned"] = int(unowned[0]) if unowned else 0
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

    def __init__(self, dsn: str, address: str = "", lease: float = NODE_LEASE) -> None:
        self.dsn = dsn
        self.address = address or f"{socket.gethostname()} pid {os.getpid()}"
        self.lease = lease
        self.write_count = 0
        self.commits = 0  # successful batches, for benchmarks and tests
        self.round_trips = 0  # statements sent for batches, for benchmarks and tests
        #: Why the latest commit failed; None once one succeeds again.
        self.last_error: str | None = None
        #: Decides, at the end of a turn, which new jobs go to the shared queue instead of
        #: staying with this node (`jobwire.store.pgcluster`); None: every job stays.
        self.releases: Callable[[Job], bool | WrittenAs] | None = None
        #: Told, when a batch with new background jobs written as another node's
        #: (`WrittenAs`) finishes, of those jobs and whether it committed: then that node
        #: runs them once it hears of them (`jobwire.store.pgcluster`).
        self.on_handed: Callable[[list[Job], bool], None] | None = None
        #: Told of those jobs as their batch goes to commit (the cluster sends them ahead).
        self.on_handing: Callable[[list[Job]], None] | None = None
        #: Called when the store drops its connections (the cluster's own go too).
        self.on_abandon: list[Callable[[], None]] = []
        #: Called when half the block of row keys is used (the cluster takes the next one).
        self.keys_low: Callable[[], None] | None = None
        #: The next block of row keys, when the cluster took it ahead of need.
        self.spare_keys: tuple[int, int] | None = None
        #: New jobs with a unique key that must not run before their batch shows whether
        #: their key was free in the whole cluster (`jobwire.store.pgshared`), by id: their
        #: rows are written as available.
        self.held: dict[str, Job] = {}
        #: Told, when a batch with held jobs finishes and before its waiters hear of it, of
        #: those that took their key, those that found it taken (each with the id of the
        #: job holding it) and those whose batch failed.
        self.on_unique: UniqueOutcome | None = None
        #: While the waiters of a batch are told: the new jobs of the batch that found their
        #: key taken, id -> the id of the job holding it (their acknowledgements name it).
        #: Always this one dict (the Gearman listener keeps a reference).
        self.coalesced: dict[str, str] = {}
        # The node's connection: migrates, registers the node, adopts the jobs of dead
        # nodes, replays; then holds the node's lock for as long as it runs.
        self._lock_conn = connect(dsn)
        try:
            migrate(self._lock_conn)
            self.schema = str(self._lock_conn.execute("SELECT current_schema()").fetchone()[0])  # type: ignore[index]
            #: The channel nodes LISTEN on: work became ready, or nodes came or went.
            self.channel = f"jobwire.{self.schema}"
            self.node = self._register()
            self._next_row, self._last_row = self._take_keys()
            self.adopted = self._adopt_dead_nodes()
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
        self._given: set[int] = set()  # rows of queued jobs given to the shared queue
        self._created: list[Job] = []
        self._kv: KVChanges = {}
        self._kv_written: KVChanges = {}  # key-value writes handed off, until committed
        # Rows of older jobs from batches that failed: sent again under the next batch.
        self._carried: dict[int, Row | None] = {}
        self._kv_carried: KVChanges = {}
        self._scheduled = False
        self._handed = 0  # number of the last batch handed off
        self._handed_at = 0  # `write_count` then
        self._done = 0  # number of the last batch whose commit finished
        # New jobs with a unique key by batch number, until their batch finishes.
        self._keyed: dict[int, dict[int, tuple[Job, str]]] = {}
        self._renames: dict[int, dict[str, str]] = {}  # `coalesced` of finished batches
        # New background jobs written as another node's, by batch number (`on_handed`).
        self._handed_rows: dict[int, list[Job]] = {}
        # Row keys of jobs another node wrote as this node's and sent before its commit
        # ended (`expect_row`), each with this node's latest change of it, held back.
        self._unconfirmed: dict[int, tuple[Job | None, ...]] = {}
        # Batches in flight: their row keys, key-value names and task, by batch number.
        self._flying: dict[int, tuple[set[int], set[tuple[str, str]], asyncio.Task[None]]] = {}
        self._results: dict[int, bool] = {}  # finished before an earlier batch: ok, by number
        self._waiters: deque[tuple[int, Callback]] = deque()
        self._retract: RetractJobs | None = None
        #: The cluster's part of a failed batch's retraction: its new jobs that left the engine
        #: for the shared queue (`ClusterNode.batch_failed`); None: no cluster.
        self.retract_released: RetractJobs | None = None
        self._failures = 0
        self._logged_at = 0.0
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def _register(self) -> int:
        """A row in `nodes` with a lease, and the node's lock: its id."""
        conn = self._lock_conn
        row = conn.execute(
            "INSERT INTO nodes (address, pid, lease_until)"
            " VALUES (%s, %s, now() + make_interval(secs => %s)) RETURNING id",
            (self.address, os.getpid(), self.lease),
        ).fetchone()
        assert row is not None
        node = int(row[0])
        conn.execute(f"SELECT pg_advisory_lock({_NODE_LOCK})", (node,))
        conn.execute("SELECT pg_notify(%s, 'nodes')", (self.channel,))
        return node

    def _take_keys(self) -> tuple[int, int]:
        """A block of row keys from the shared sequence: (first, last)."""
        row = self._lock_conn.execute("SELECT nextval('job_keys')").fetchone()
        assert row is not None
        first = int(row[0])
        return first, first + KEY_BLOCK - 1

    def _adopt_dead_nodes(self) -> int:
        """Take over the jobs of nodes that are gone (lease run out, or lock free: a killed
        process), in one transaction, and the unowned jobs too when no other node runs: a
        node alone replays everything, as a one-node store did. While other nodes seem alive
        it tries again for up to `LOCK_WAIT` seconds: the backend of a node killed a moment
        ago may hold its lock a little longer. Then the key-value records of the nodes gone.
        How many jobs it adopted."""
        deadline = time.monotonic() + LOCK_WAIT
        adopted = 0
        while True:
            row = self._lock_conn.execute(ADOPT_SQL, (self.lease, *[self.node] * 4)).fetchone()
            assert row is not None
            adopted += int(row[0])
            if not row[1] or time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        parameters = (self.node, self.node, sorted(NODE_NAMESPACES))
        self._lock_conn.execute(KV_ADOPT_SQL, parameters)
        return adopted

    # ------------------------------------------------------------------ start-up reads

    def load(self) -> Iterator[StoredJob]:
        names: dict[str, str] = {}
        try:
            with self._lock_conn.cursor(name="jobwire_load") as cur, self._lock_conn.transaction():
                cur.itersize = 10_000
                cur.execute(_LOAD, (self.node,))
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
            rows = self._lock_conn.execute(_KV_LOAD, (namespace, self.node)).fetchall()
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
            if key >= self._last_row:
                self._next_keys()
            else:
                self._next_row = key + 1
                if key == self._last_row - KEY_BLOCK // 2 and self.keys_low is not None:
                    self.keys_low()  # half the block is used: the cluster takes the next
            self._new_rows.add(key)
            self._created.append(job)
        self._changes[key] = job
        if not self._scheduled:
            self._schedule()

    def _next_keys(self) -> None:
        """The block of row keys is used up: the next one, taken ahead by the cluster
        (`spare_keys`), or now, in one round trip (rare: blocks are large)."""
        if self.spare_keys is not None:
            (self._next_row, self._last_row), self.spare_keys = self.spare_keys, None
            return
        try:
            if self._lock_conn.broken or self._lock_conn.closed:
                self._lock_conn = connect(self.dsn)  # PostgreSQL restarted meanwhile
            self._next_row, self._last_row = self._take_keys()
        except (psycopg.Error, StoreError) as exc:
            raise StoreUnavailableError(f"cannot take row keys: {exc}") from exc

    @property
    def keys_left(self) -> int:
        return self._last_row - self._next_row + 1

    def givable(self, job: Job) -> bool:
        """Whether `give_away` can take this job: its row is written, or on its way (not
        new in the batch being gathered, which writes it with its owner, nor held back for
        its unique key, nor sent by another node as its commit began)."""
        key = job.row
        return (
            bool(key)
            and key not in self._new_rows
            and job.id not in self.held
            and key not in self._unconfirmed  # another node's commit of it has not said yet
        )

    def give_away(self, job: Job) -> None:
        """A queued job this node's engine let go (`Engine.release`) goes to the shared
        queue with the next batch, for a node whose workers wait (`jobwire.store.pgcluster`):
        its row is rewritten nobody's (after any batch in flight that writes it)."""
        self.write_count += 1
        self._given.add(job.row)
        self._changes[job.row] = job
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

    def expect_row(self, key: int) -> None:
        """Another node is committing the row `key` as this node's, whose job runs here
        already: this node's writes of it wait (`confirm_row`). Written before that commit,
        an update would insert the row, which that commit then fails on; a delete would
        find nothing, and leave the row to be committed after it."""
        self._unconfirmed.setdefault(key, ())

    def confirm_row(self, key: int) -> None:
        """The row `key` is committed, or its commit failed and may have landed all the same
        (then the job is retracted here, and the removal deletes it if it is there): the
        writes held back go with the next batch, and later ones as ever."""
        held = self._unconfirmed.pop(key, None)
        if held:
            self._changes.setdefault(key, held[0])  # a change made since is newer
            if not self._scheduled:
                self._schedule()

    def kv_pending(self, namespace: str) -> set[str]:
        """The keys of `namespace` written here and not yet committed."""
        names = [*self._kv, *self._kv_carried]
        for _, flying, _ in self._flying.values():
            names += flying
        return {key for ns, key in names if ns == namespace}

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

    def _take_batch(
        self,
    ) -> _Batch:
        """The current batch as rows (each with its owner and its client's node last), under
        what failed batches left to carry, and the "function<US>queue" names that got unowned
        jobs: new jobs that `releases` lets go to the shared queue are written without an
        owner (a foreground one with this node as its client's; the cluster saves those
        only to offer them, `jobwire.store.pgcluster`). New jobs with a unique key are
        taken out of the rows, with their key, to be inserted on condition. Then whether
        the batch is only foreground jobs written as a node's (`BATCH_RELAXED_SQL`), and
        the new background jobs written as another node's (`on_handed`)."""
        rows = dict(self._carried)
        written_as: set[int] = set()
        handed: list[Job] = []
        me = self.node
        releases = self.releases
        new_rows = self._new_rows
        ready: set[str] = set()
        created = self._created
        kept_foreground = False
        given = self._given
        unconfirmed = self._unconfirmed
        for key, job in self._changes.items():
            if key in unconfirmed:  # another node's commit of the row has not said yet
                unconfirmed[key] = (job,)
            elif job is None:
                rows[key] = None
            elif key in given:  # nobody's now, and the nodes listening hear of it
                rows[key] = (*full_row(job), None, None)
                ready.add(f"{job.function}\x1f{job.queue}")
            elif releases is not None and key in new_rows:
                row = full_row(job)  # as queued here, before it may leave the engine
                verdict = releases(job)
                if isinstance(verdict, WrittenAs) and job.background:
                    rows[key] = (*row, verdict.node, None)  # durable: it waits for the flush
                    handed.append(job)
                elif isinstance(verdict, WrittenAs):  # that node's, its client waiting here
                    rows[key] = (*row, verdict.node, me)
                    written_as.add(key)
                elif verdict:
                    rows[key] = (*row, None, None if job.background else me)
                    ready.add(f"{job.function}\x1f{job.queue}")
                elif job.background:
                    rows[key] = (*row, me, None)
                else:
                    kept_foreground = True
            elif job.background:
                rows[key] = (*full_row(job), me, None)
            else:  # a foreground job this node runs itself: not stored, as ever
                kept_foreground = True
        if kept_foreground:
            created = [job for job in created if job.background or job.row in rows]
        keyed: dict[int, tuple[Job, str]] = {}
        if created:
            keyed = self._keyed_rows(rows, created)
        kv = dict(self._kv_carried)
        kv.update(self._kv)
        relaxed = bool(rows) and not kv and written_as.issuperset(rows)
        if kv and any(namespace == CRON_NAMESPACE for namespace, _ in kv):
            ready.add(CRON_CHANGED)  # the other nodes read the registrations again
        self._carried, self._kv_carried = {}, {}
        self._changes, self._kv, self._created = {}, {}, []
        self._new_rows = set()
        if given:
            self._given = set()
        return _Batch(rows, kv, created, ready, keyed, relaxed, handed)

    def _keyed_rows(
        self, rows: dict[int, Row | None], created: list[Job]
    ) -> dict[int, tuple[Job, str]]:
        """The new jobs of `rows` that carry a unique key: each with its key. A held job's
        row says it is available (the engine holds it back until its batch commits)."""
        keyed: dict[int, tuple[Job, str]] = {}
        held = self.held
        for job in created:
            row = rows.get(job.row)
            if row is None:
                held.pop(job.id, None)  # removed before it was written: nothing to settle
                continue
            key = shared_key(job)
            if key is None:
                continue
            if job.id in held:
                row = (*row[:7], int(JobState.AVAILABLE), *row[8:])
                rows[job.row] = row
            keyed[job.row] = (job, key)
        return keyed

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
            rows, kv, created, ready, keyed, relaxed, handed = self._take_batch()
        except Exception as exc:  # a value that cannot be turned into a row: this batch fails
            log.exception("store: cannot encode a batch")
            self._changes, self._kv, self._created, self._new_rows = {}, {}, [], set()
            self._given = set()
            held = {job.row: (job, "") for job in created if job.id in self.held}
            if held:
                self._keyed[number] = held  # settled as failed with the batch
            self._finished(number, None, {}, {}, created, f"cannot encode the batch: {exc!r}")
            return
        if kv:
            self._kv_written.update(kv)
        slot = self._free.pop()
        assert self._loop is not None
        if keyed:
            self._keyed[number] = keyed
        if handed:
            self._handed_rows[number] = handed
            if self.on_handing is not None:
                try:
                    self.on_handing(handed)
                except Exception:
                    log.exception("store: sending the jobs of a batch ahead failed")
        commit = self._commit(number, slot, rows, kv, created, ready, relaxed)
        task = self._loop.create_task(commit)
        self._flying[number] = (set(rows), set(kv), task)

    async def _commit(
        self,
        number: int,
        slot: int,
        rows: dict[int, Row | None],
        kv: KVChanges,
        created: list[Job],
        ready: set[str],
        relaxed: bool = False,
    ) -> None:
        error: str | None = None
        if rows or kv:
            try:
                keyed = self._keyed.get(number)
                unique = self._split_keyed(rows, keyed) if keyed else None
                fresh = {job.row for job in created}
                node, channel = self.node, self.channel
                parameters = batch_parameters(rows, kv, node, channel, ready, unique, fresh)
                if unique:
                    statement = BATCH_RELAXED_SQL if relaxed else BATCH_UNIQUE_SQL
                else:
                    statement = BATCH_SQL
                answer = await self._execute(
                    slot,
                    parameters,
                    statement,
                    lambda: batch_parameters(rows, kv, node, channel, ready, unique),
                )
                if keyed and answer is not None:
                    self._note_keys(number, keyed, answer)
            except Exception as exc:
                error = _reason(exc)
        self._finished(number, slot, rows, kv, created, error)

    @staticmethod
    def _split_keyed(
        rows: dict[int, Row | None], keyed: dict[int, tuple[Job, str]]
    ) -> dict[int, Row]:
        """The rows of `keyed` jobs with their key, out of `rows` (which keeps the others)."""
        unique: dict[int, Row] = {}
        for key, (_, ukey) in keyed.items():
            row = rows.pop(key, None)
            if row is not None:
                unique[key] = (*row, ukey)
        return unique

    def _note_keys(
        self, number: int, keyed: dict[int, tuple[Job, str]], answer: tuple[Any, ...]
    ) -> None:
        """Which new jobs of batch `number` found their key held by another job (the
        statement answers, per key, the row key and id of the job that holds it)."""
        holders = dict(
            zip(answer[1] or (), zip(answer[2] or (), answer[3] or (), strict=True), strict=True)
        )
        renames: dict[str, str] = {}
        for row_key, (job, ukey) in keyed.items():
            holder = holders.get(ukey)
            if holder is not None and holder[0] != row_key:
                renames[job.id] = str(holder[1])
        self._renames.setdefault(number, {}).update(renames)  # may hold an earlier batch's

    async def _execute(
        self,
        slot: int,
        parameters: list[Any],
        statement: str = BATCH_SQL,
        again: Callable[[], list[Any]] | None = None,
    ) -> tuple[Any, ...] | None:
        """One statement, on a new connection once more if the connection broke (or if the
        statement was chosen to break a deadlock: it changed nothing): its answer. `again`
        gives the parameters of the second try: the first may have committed unanswered."""
        for attempt in (1, 2):
            if attempt == 2 and again is not None:
                parameters = again()
            conn = await self._connection(slot)
            try:
                self.round_trips += 1
                async with asyncio.timeout(COMMIT_TIMEOUT):
                    cur = await conn.execute(statement, parameters)
                    return await cur.fetchone()
            except psycopg.errors.DeadlockDetected:
                if attempt == 2:
                    raise
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
        return None

    async def _connection(self, slot: int) -> psycopg.AsyncConnection[Any]:
        conn = self._conns[slot]
        if conn is not None and not conn.broken and not conn.closed:
            return conn
        async with self._connecting:  # one at a time, with one back-off
            if time.monotonic() < self._retry_at:
                raise StoreUnavailableError(f"PostgreSQL is away ({self.last_error})")
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.dsn,
                    autocommit=True,
                    connect_timeout=CONNECT_TIMEOUT,
                    prepare_threshold=0,
                )
                await conn.execute(BATCH_SESSION_SQL)
            except Exception:
                self._retry_at = time.monotonic() + self._retry_delay
                self._retry_delay = min(self._retry_delay * 2, RECONNECT_MAX)
                raise
            self._retry_delay = RECONNECT_MIN
            self._conns[slot] = conn
            return conn

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
        keyed = self._keyed.pop(number, None)
        if keyed:
            self._keys_settled(number, keyed, ok)
        handed = self._handed_rows.pop(number, None)
        if handed and self.on_handed is not None:
            try:
                self.on_handed(handed, ok)
            except Exception:
                log.exception("store: handing over the jobs of a batch failed")
        if ok:
            self.commits += 1
            for name in kv:  # in the database now (no batch in flight writes it too)
                self._kv_written.pop(name, None)
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
            for retract in (self._retract, self.retract_released):
                if created and retract is not None:
                    try:
                        retract(created)
                    except Exception:
                        log.exception("retracting the jobs of a failed batch failed")
        results = self._results
        results[number] = ok
        waiters = self._waiters
        while self._done + 1 in results:
            self._done += 1
            reported = results.pop(self._done)
            renames = self._renames.pop(self._done, None)
            if renames:
                self.coalesced.update(renames)  # one dict: listeners keep a reference
            while waiters and waiters[0][0] <= self._done:
                callback = waiters.popleft()[1]
                try:
                    callback(reported)
                except Exception:
                    log.exception("after_commit callback failed")
            if renames:
                self.coalesced.clear()
        # The next batch goes at once; rows carried from a failed batch go with it, or
        # alone once a commit succeeds again (PostgreSQL is back).
        self._hand_off(carried=ok)

    def _keys_settled(self, number: int, keyed: dict[int, tuple[Job, str]], ok: bool) -> None:
        """Batch `number`, with new jobs that carry a unique key, committed (`ok`) or failed:
        the held ones are released to the cluster's care (`on_unique`); a job not held whose
        key was taken (it may be running already) is written again without the key (it
        stays, coalescing on this node only)."""
        renames = self._renames.get(number, {}) if ok else {}
        won: list[Job] = []
        lost: list[tuple[Job, str]] = []
        failed: list[Job] = []
        for job, _ in keyed.values():
            held = self.held.pop(job.id, None) is job
            holder = renames.get(job.id)
            if not ok:
                if held:
                    failed.append(job)
                continue
            if holder is None:
                if held:
                    won.append(job)
            elif held:
                lost.append((job, holder))
            else:
                del renames[job.id]  # its acknowledgement names it: it stays
                if not job.state.terminal:  # a row of its own now, as an update
                    log.warning("store: job %s keeps a unique key %s also holds", job.id, holder)
                    self.job_saved(job)
        if lost:
            self._rename_later(number, {job.id: holder for job, holder in lost})
        if self.on_unique is not None and (won or lost or failed):
            try:
                self.on_unique(won, lost, failed)
            except Exception:
                log.exception("store: settling unique keys failed")

    def _rename_later(self, number: int, renames: dict[str, str]) -> None:
        """A submit that joined a held job in a later read than the one that made it waits
        for a later batch than the job's (up to the one being gathered): its acknowledgement
        names the key's holder too."""
        for later in range(number + 1, self._handed + 2):
            self._renames.setdefault(later, {}).update(renames)

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

    async def handed_over(self, timeout: float) -> None:
        """Wait (`timeout` seconds at most) for the commits in flight that carry background
        jobs written as another node's: `on_handed` has heard of them then."""
        tasks = [self._flying[n][2] for n in self._handed_rows if n in self._flying]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)

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
            rows, kv, _created, ready, keyed, _relaxed, _handed = self._take_batch()
            self._handed += 1
            try:
                if rows or kv:
                    unique = self._split_keyed(rows, keyed) if keyed else None
                    parameters = batch_parameters(rows, kv, self.node, self.channel, ready, unique)
                    self._lock_conn.execute(BATCH_UNIQUE_SQL if unique else BATCH_SQL, parameters)
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
        if ok:
            self._leave()
        self.abandon()

    def _leave(self) -> None:
        """Leave the cluster: the node's row goes, its jobs go back to the shared queue (a
        node alone adopts them at its next start) and the other nodes hear of it."""
        try:
            self._lock_conn.execute(LEAVE_SQL, (self.node, self.node, self.channel))
        except psycopg.Error as exc:
            log.error("store: could not hand this node's jobs back: %s", _reason(exc))

    def abandon(self) -> None:
        """Drop every connection without writing anything: what a killed process leaves
        (its row and its jobs stay until its lease runs out or its lock is found free)."""
        self._closed = True
        for slot, conn in enumerate(self._conns):
            self._conns[slot] = None
            if conn is not None:
                conn.pgconn.finish()
        for close in self.on_abandon:
            close()
        self._lock_conn.close()


class _Batch(NamedTuple):
    """A batch as `PostgresStore._take_batch` makes it."""

    rows: dict[int, Row | None]
    kv: KVChanges
    created: list[Job]
    ready: set[str]
    keyed: dict[int, tuple[Job, str]]
    relaxed: bool
    handed: list[Job]


class StoreUnavailableError(Exception):
    """PostgreSQL is away and the next connection attempt is not due yet."""


async def _close_quietly(conn: psycopg.AsyncConnection[Any]) -> None:
    with contextlib.suppress(Exception):
        await conn.close()
