"""What only the PostgreSQL store has: a connection that breaks, a database that goes away and
comes back, nodes, fencing, migration, and one statement per batch. Against the local
PostgreSQL, in a schema and role of the test's own (tests/pg.py)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import psycopg

from jobwire.engine import Engine, EngineConfig, Job
from jobwire.engine.job import ORIGIN_GEARMAN, JobState, Output
from jobwire.store.frames import full_row
from jobwire.store.pgcluster import ClusterNode, RemoteClient
from jobwire.store.pgfollow import FOLLOW
from jobwire.store.pgremote import RemoteJobs
from jobwire.store.postgres import (
    BATCH_RELAXED_SQL,
    BATCH_SQL,
    BATCH_UNIQUE_SQL,
    PostgresStore,
    WrittenAs,
    batch_parameters,
)
from tests.pg import ADMIN, Schema, pg_schema
from tests.store.kinds import committed
from tests.store.test_stores import make_job, run

__all__ = ["pg_schema"]

DEADLINE = 30.0


def ids(schema: Schema) -> list[str]:
    store = PostgresStore(schema.dsn)
    try:
        return [row.id for row in store.load()]
    finally:
        store.close()


def blocked(schema: Schema) -> int:
    """Statements of the schema's role waiting for a lock (a table lock a test holds)."""
    rows = schema.rows(
        "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
        f" WHERE NOT l.granted AND a.usename = '{schema.role}'"
    )
    return int(rows[0][0])  # type: ignore[call-overload]


async def until(condition: Callable[[], bool]) -> None:
    end = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < end
        await asyncio.sleep(0.01)


def test_a_batch_is_one_statement_whatever_its_size(pg_schema: Schema) -> None:
    store = PostgresStore(pg_schema.dsn)

    async def main() -> None:
        for number in range(1, 1001):
            store.job_saved(make_job(number))
        store.kv_put("cron", "a", b"1")
        assert await committed(store)

    run(main)
    assert (store.commits, store.round_trips) == (1, 1)
    store.close()
    assert len(ids(pg_schema)) == 1000


def test_a_killed_backend_costs_a_retry_not_the_batch(pg_schema: Schema) -> None:
    store = PostgresStore(pg_schema.dsn)

    async def main() -> None:
        store.job_saved(make_job(1))
        assert await committed(store)
        assert pg_schema.terminate() >= 1  # the writer's and the lock's backends
        store.job_saved(make_job(2))
        assert await committed(store)

    run(main)
    assert (store.commits, store.round_trips) == (2, 3)
    store.close()
    assert ids(pg_schema) == ["H:test:1", "H:test:2"]


def test_a_batch_whose_answer_was_lost_after_its_commit_is_sent_again_as_upserts(
    pg_schema: Schema,
) -> None:
    """New rows go as a plain insert; the second try of a batch may find them committed."""
    store = PostgresStore(pg_schema.dsn)

    async def main() -> None:
        store.job_saved(make_job(1))
        assert await committed(store)
        job = make_job(2)
        store.job_saved(job)  # its batch goes at the end of this loop turn
        row = {job.row: (*full_row(job), store.node, None)}
        with psycopg.connect(pg_schema.dsn, autocommit=True) as conn:  # its first try's commit
            conn.execute(BATCH_SQL, batch_parameters(row, {}, store.node, fresh=set(row)))
        assert pg_schema.terminate() >= 1  # ... whose answer the store never heard
        assert await committed(store)

    run(main)
    assert (store.commits, store.round_trips) == (2, 3)
    store.close()
    assert ids(pg_schema) == ["H:test:1", "H:test:2"]


def test_key_value_writes_are_forgotten_once_committed(pg_schema: Schema) -> None:
    store = PostgresStore(pg_schema.dsn)

    async def main() -> None:
        for number in range(50):
            store.kv_put("titanic", f"request-{number}", b"x")
            store.kv_put("titanic", f"request-{number - 1}", None)
            assert await committed(store)

    run(main)
    assert not store._kv_written  # read back from the database, not kept in memory
    assert store.kv_load("titanic") == {"request-49": b"x"}
    store.close()


def test_while_away_new_jobs_fail_and_older_changes_reach_the_database_after(
    pg_schema: Schema,
) -> None:
    store = PostgresStore(pg_schema.dsn)
    retracted: list[Job] = []
    store.on_failure(retracted.extend)
    finished, refused = make_job(1), make_job(2)

    async def main() -> Job:
        store.job_saved(finished)
        assert await committed(store)
        pg_schema.go_away()
        try:
            store.job_saved(refused)
            store.job_removed(finished)  # its removal fails with the batch: carried on
            assert not await committed(store)
            assert retracted == [refused]
            assert store.last_error is not None
        finally:
            pg_schema.come_back()
        end = time.monotonic() + DEADLINE
        number = 3
        while True:  # the next write after the back-off connects again
            accepted = make_job(number)
            store.job_saved(accepted)
            if await committed(store):
                return accepted
            assert time.monotonic() < end, store.last_error
            number += 1
            await asyncio.sleep(0.05)

    accepted = run(main)
    assert store.last_error is None
    store.close()
    # The removal made while away is in; the refused jobs are not.
    assert ids(pg_schema) == [accepted.id]


def test_two_stores_on_one_schema_are_two_nodes_with_their_own_jobs_and_keys(
    pg_schema: Schema,
) -> None:
    first = PostgresStore(pg_schema.dsn)
    second = PostgresStore(pg_schema.dsn)
    mine, theirs = make_job(1), make_job(2)
    try:
        assert first.node != second.node

        async def main() -> None:
            first.job_saved(mine)
            second.job_saved(theirs)
            assert await committed(first)
            assert await committed(second)

        run(main)
        assert mine.row != theirs.row  # row keys from one sequence, in blocks per node
        owners = pg_schema.rows("SELECT id, owner FROM {schema}.jobs ORDER BY id")
        assert owners == [("H:test:1", first.node), ("H:test:2", second.node)]
        assert [row.id for row in first.load()] == ["H:test:1"]
    finally:
        first.close()  # hands its job back to the shared queue
        assert pg_schema.rows("SELECT owner FROM {schema}.jobs WHERE id = 'H:test:1'") == [(None,)]
        second.close()
    assert ids(pg_schema) == ["H:test:1", "H:test:2"]  # a node alone adopts both


def test_a_node_declared_dead_writes_nothing_over_the_requeued_jobs(pg_schema: Schema) -> None:
    store = PostgresStore(pg_schema.dsn)
    job = make_job(1)

    async def main() -> None:
        store.job_saved(job)
        assert await committed(store)
        # What another node does when this one's lease ran out.
        pg_schema.rows(f"DELETE FROM {{schema}}.nodes WHERE id = {store.node}")
        pg_schema.rows("UPDATE {schema}.jobs SET owner = NULL")
        job.attempts = 7
        store.job_saved(job)
        assert await committed(store)
        store.job_removed(job)
        assert await committed(store)

    try:
        run(main)
        rows = pg_schema.rows("SELECT id, attempts, owner FROM {schema}.jobs")
        assert rows == [("H:test:1", 0, None)]
    finally:
        store.close()


def test_a_one_node_schema_is_migrated_and_its_jobs_adopted(pg_schema: Schema) -> None:
    from jobwire.store.postgres import MIGRATIONS, SCHEMA_VERSION

    with psycopg.connect(pg_schema.dsn, autocommit=True) as conn:
        for statement in MIGRATIONS[0]:
            conn.execute(statement)
        conn.execute("INSERT INTO jobwire_schema (version) VALUES (1)")
        conn.execute(
            "INSERT INTO jobs (seq, id, function, queue, payload, priority, state, attempts,"
            " created_at) VALUES (41, 'H:old:41', 'f', 'f', 'x', 0, 3, 0, 1000.0)"
        )
    store = PostgresStore(pg_schema.dsn)
    try:
        assert [(row.id, row.row) for row in store.load()] == [("H:old:41", 41)]
        version = pg_schema.rows("SELECT version FROM {schema}.jobwire_schema")
        assert version == [(SCHEMA_VERSION,)]

        async def main() -> None:
            fresh = make_job(2)
            store.job_saved(fresh)
            assert await committed(store)
            assert fresh.row > 41  # the sequence starts above the old keys

        run(main)
    finally:
        store.close()


def test_close_after_drain_writes_everything_pending(pg_schema: Schema) -> None:
    store = PostgresStore(pg_schema.dsn)

    async def main() -> None:
        store.job_saved(make_job(1))
        await asyncio.sleep(0)  # the batch is on its way
        store.job_saved(make_job(2))  # waits for it
        await store.drain()
        assert not store.pending()

    run(main)
    store.close()
    assert ids(pg_schema) == ["H:test:1", "H:test:2"]


def test_two_batches_fly_at_once_unless_they_change_the_same_job(pg_schema: Schema) -> None:
    store = PostgresStore(pg_schema.dsn)
    first, second = make_job(1), make_job(2)

    async def main() -> None:
        with psycopg.connect(ADMIN) as holder:  # a transaction that keeps writers out
            holder.execute(f"LOCK TABLE {pg_schema.name}.jobs IN SHARE MODE")
            store.job_saved(first)
            await until(lambda: blocked(pg_schema) == 1)  # batch 1 is in flight, blocked
            first.attempts = 1
            store.job_saved(first)  # the same job: must wait for batch 1
            await asyncio.sleep(0)  # the loop turn ends
            await asyncio.sleep(0)
            assert len(store._flying) == 1 and store._changes
            holder.rollback()  # batch 1 commits; then the next goes
        assert await committed(store)
        with psycopg.connect(ADMIN) as holder:
            holder.execute(f"LOCK TABLE {pg_schema.name}.jobs IN SHARE MODE")
            store.job_saved(second)
            await until(lambda: blocked(pg_schema) == 1)
            store.job_saved(make_job(3))  # another job: flies beside it
            await until(lambda: blocked(pg_schema) == 2)
            assert len(store._flying) == 2
            later: list[bool] = []
            store.after_commit(later.append)
            holder.rollback()
        assert await committed(store)
        assert later == [True]

    run(main)
    store.close()
    stored = PostgresStore(pg_schema.dsn)
    try:
        rows = list(stored.load())
    finally:
        stored.close()
    assert [(row.id, row.attempts) for row in rows] == [
        ("H:test:1", 1),
        ("H:test:2", 0),
        ("H:test:3", 0),
    ]


def test_a_version_1_schema_gains_the_origin_column_and_its_jobs_load(pg_schema: Schema) -> None:
    from jobwire.store.postgres import MIGRATIONS

    with psycopg.connect(pg_schema.dsn, autocommit=True) as conn:
        for statement in MIGRATIONS[0]:  # the tables as version 1 made them
            conn.execute(statement.encode())
        conn.execute(b"INSERT INTO jobwire_schema (version) VALUES (1)")
        conn.execute(
            b"INSERT INTO jobs (seq, id, function, queue, payload, priority, state, attempts,"
            b" created_at) VALUES (1, 'H:old:1', 'f', 'f', 'p', 0, 3, 0, 1.5)"
        )
    store = PostgresStore(pg_schema.dsn)

    async def main() -> None:
        job = make_job(2)
        job.origin = ORIGIN_GEARMAN
        store.job_saved(job)
        assert await committed(store)

    try:
        assert [(row.id, row.origin) for row in store.load()] == [("H:old:1", 0)]  # unknown
        run(main)
    finally:
        store.close()
    store = PostgresStore(pg_schema.dsn)
    try:
        loaded = [(row.id, row.origin) for row in store.load()]
    finally:
        store.close()
    assert loaded == [("H:old:1", 0), ("H:test:2", ORIGIN_GEARMAN)]


def test_a_unique_key_another_node_holds_is_named_and_the_job_not_held_still_kept(
    pg_schema: Schema,
) -> None:
    first = PostgresStore(pg_schema.dsn)
    second = PostgresStore(pg_schema.dsn)
    told: list[tuple[list[str], list[tuple[str, str]]]] = []
    second.on_unique = lambda won, lost, failed: told.append(
        ([job.id for job in won], [(job.id, holder) for job, holder in lost])
    )
    holder = make_job(1, unique="u")
    loser, free, kept = make_job(2, unique="u"), make_job(3, unique="v"), make_job(4, unique="u")
    named: list[dict[str, str]] = []

    async def main() -> None:
        first.job_saved(holder)
        assert await committed(first)
        second.held[loser.id] = loser  # as the cluster holds a job back when others run
        second.held[free.id] = free
        for job in (loser, free):
            second.job_saved(job)
        second.after_commit(lambda ok: named.append(dict(second.coalesced)))
        assert await committed(second)
        second.job_saved(kept)  # not held: it may have run already, so it stays
        assert await committed(second)
        assert await committed(second)  # and its row is written again, without the key

    try:
        run(main)
    finally:
        first.close()
        second.close()
    assert named == [{loser.id: holder.id}]  # what acknowledgements read as they go out
    assert told == [([free.id], [(loser.id, holder.id)])]
    rows = pg_schema.rows("SELECT id, ukey FROM {schema}.jobs ORDER BY id")
    assert rows == [
        (holder.id, "e\x1freverse\x1fu"),
        (free.id, "e\x1freverse\x1fv"),
        (kept.id, None),
    ]


def test_a_submit_that_joined_a_held_job_in_a_later_batch_is_told_of_the_key_s_holder(
    pg_schema: Schema,
) -> None:
    """A submit that joins a held job in a later read waits for a later batch than the job's:
    its acknowledgement is renamed all the same."""
    first = PostgresStore(pg_schema.dsn)
    second = PostgresStore(pg_schema.dsn)
    holder, loser = make_job(1, unique="u"), make_job(2, unique="u")
    named: list[dict[str, str]] = []

    async def main() -> None:
        first.job_saved(holder)
        assert await committed(first)
        with psycopg.connect(ADMIN) as lock:  # both batches fly, neither commits yet
            lock.execute(f"LOCK TABLE {pg_schema.name}.jobs IN SHARE MODE")
            second.held[loser.id] = loser
            second.job_saved(loser)
            await until(lambda: blocked(pg_schema) == 1)
            second.job_saved(make_job(3))  # another job's batch: the joiner waits for it
            await until(lambda: blocked(pg_schema) == 2)
            second.after_commit(lambda ok: named.append(dict(second.coalesced)))
            lock.rollback()
        assert await committed(second)

    try:
        run(main)
    finally:
        first.close()
        second.close()
    assert named == [{loser.id: holder.id}]


def test_clients_of_a_holder_that_ended_unknown_to_any_node_get_a_job_run_in_its_place(
    pg_schema: Schema,
) -> None:
    """The job that held a key ended before the clients that lost it could follow it, and
    no node keeps it: their node runs the job itself, telling them under the holder's id."""
    store = PostgresStore(pg_schema.dsn)
    engine = Engine(EngineConfig(id_prefix="H:n"), journal=store)
    cluster = ClusterNode(store, engine)
    remote = RemoteJobs(cluster)
    heard: list[tuple[str, JobState, bytes | None]] = []

    class Client:
        def job_progress(self, job: Job, done: int, total: int) -> None: ...

        def job_output(self, job: Job, kind: Output, data: bytes) -> None: ...

        def job_finished(
            self, job: Job, state: JobState, result: bytes | None, error: bytes | None
        ) -> None:
            heard.append((job.id, state, result))

    async def main() -> None:
        lost, _ = engine.submit(
            "reverse", b"abc", unique="k", background=False, subscriber=Client(), pending=True
        )
        assert engine.withdraw_pending(lost)  # as when its batch finds the key taken
        remote.follows.follow(lost, "H:gone:1")  # a holder whose row is gone already
        end = time.monotonic() + DEADLINE
        while not list(engine.jobs.values()):
            assert time.monotonic() < end
            await asyncio.sleep(0.01)
        [again] = engine.jobs.values()
        assert (again.function, again.payload, again.unique) == ("reverse", b"abc", "k")
        assert again.id != "H:gone:1" and again.state is JobState.AVAILABLE
        engine.cancel(again)  # its end, whatever it is, is the clients'
        remote.close()

    try:
        run(main)
    finally:
        store.close()
    assert heard == [("H:gone:1", JobState.CANCELLED, None)]


def test_a_node_asked_of_a_job_by_followers_subscribes_their_node_once_or_answers_its_end(
    pg_schema: Schema,
) -> None:
    store = PostgresStore(pg_schema.dsn)
    engine = Engine(EngineConfig(id_prefix="H:n", retain_finished=60.0), journal=store)
    cluster = ClusterNode(store, engine)
    remote = RemoteJobs(cluster)
    serve = remote._own[FOLLOW]

    async def main() -> None:
        job, _ = engine.submit("reverse", b"abc", unique="k")
        for _ in range(2):  # asked twice (an answer lost): subscribed once
            answer = await serve(FOLLOW, job.id, {"node": 99})
            assert answer is not None and json.loads(answer.body) == {}
        assert [type(s) for s in job.subscribers or ()] == [RemoteClient]
        assert await serve(FOLLOW, "H:unknown:1", {"node": 99}) is None
        engine.cancel(job)  # ended, and kept a while: its end is the answer
        answer = await serve(FOLLOW, job.id, {"node": 99})
        assert answer is not None
        assert json.loads(answer.body) == {"s": int(JobState.CANCELLED), "r": None}
        remote.close()

    try:
        run(main)
    finally:
        store.close()


def statements_sent(store: PostgresStore, check: Callable[[], bool] = lambda: True) -> list[str]:
    """The batch statements `store` sends from now on, in order; `check()` must hold as each
    goes."""
    sent: list[str] = []
    execute = store._execute

    async def spied(
        slot: int, parameters: list[Any], statement: str = BATCH_SQL, again: Any = None
    ) -> Any:
        sent.append(statement)
        assert check()
        return await execute(slot, parameters, statement, again)

    store._execute = spied  # type: ignore[method-assign]
    return sent


def test_a_batch_of_foreground_jobs_written_as_a_node_s_alone_does_not_wait_for_the_flush(
    pg_schema: Schema,
) -> None:
    """Their rows hold unique keys, not jobs anyone must find after a crash: such a batch
    commits with `synchronous_commit` off; one with any other row waits as ever."""
    store = PostgresStore(pg_schema.dsn)
    store.releases = lambda job: WrittenAs(77) if not job.background else False
    sent = statements_sent(store)
    foreground = [make_job(n, unique=f"f{n}", background=False) for n in (1, 2)]
    mixed = [make_job(3, unique="f3", background=False), make_job(4, unique="b4")]

    async def main() -> None:
        for jobs in (foreground, mixed):
            for job in jobs:
                store.held[job.id] = job
                store.job_saved(job)
            assert await committed(store)

    try:
        run(main)
    finally:
        store.close()
    assert sent == [BATCH_RELAXED_SQL, BATCH_UNIQUE_SQL]
    rows = pg_schema.rows("SELECT id, owner FROM {schema}.jobs ORDER BY id")
    # The node left when the store closed: its own job is nobody's now.
    assert rows == [("H:test:1", 77), ("H:test:2", 77), ("H:test:3", 77), ("H:test:4", None)]


def test_a_background_job_written_as_another_node_s_waits_for_the_flush_and_is_handed_on(
    pg_schema: Schema,
) -> None:
    """A background job is a job someone must find after a crash: its batch waits for the
    flush even when its only row is written as a node's, and the cluster hears of the job
    once the batch committed (to send it to that node)."""
    store = PostgresStore(pg_schema.dsn)
    store.releases = lambda job: WrittenAs(77)
    handed: list[tuple[list[str], bool]] = []
    store.on_handed = lambda jobs, ok: handed.append(([job.id for job in jobs], ok))
    sent = statements_sent(store, lambda: not handed)  # not handed on before its commit

    async def main() -> None:
        store.job_saved(make_job(1))
        assert await committed(store)

    try:
        run(main)
    finally:
        store.close()
    assert sent == [BATCH_SQL]
    assert handed == [(["H:test:1"], True)]
    assert pg_schema.rows("SELECT id, owner FROM {schema}.jobs") == [("H:test:1", 77)]


def test_a_row_another_node_is_committing_as_this_node_s_is_written_here_once_confirmed(
    pg_schema: Schema,
) -> None:
    """A background job sent over a peer link as its commit begins runs at once; the node
    running it holds its writes back until told the commit ended. Here the job ends before
    its row is committed: written at once, the delete would find nothing, and the row
    committed after it would stay for ever; held back, it deletes the row."""
    sender = PostgresStore(pg_schema.dsn)
    runner = PostgresStore(pg_schema.dsn)
    sender.releases = lambda job: WrittenAs(runner.node)
    job, there = make_job(1), make_job(1)

    async def main() -> None:
        sender.job_saved(job)  # its row key is given now; its commit begins at the turn's end
        there.row = job.row
        seq = f"SELECT owner FROM {{schema}}.jobs WHERE seq = {job.row}"
        runner.expect_row(job.row)
        assert not runner.givable(there)  # not to the shared queue before it is known
        runner.job_saved(there)  # it started...
        runner.job_removed(there)  # ...and ended
        assert await committed(runner)
        assert pg_schema.rows(seq) == []  # nothing written: the row is not there yet
        assert await committed(sender)
        assert pg_schema.rows(seq) == [(runner.node,)]
        runner.confirm_row(job.row)
        assert await committed(runner)
        assert pg_schema.rows(seq) == []

    try:
        run(main)
    finally:
        runner.close()
        sender.close()
