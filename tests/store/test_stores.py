"""One suite for every store (memory, SQLite, PostgreSQL), so that they cannot drift.

Each test writes through the ports (`Store`, `KeyValueStore`) or through the engine, waits
for the commit through `after_commit` (never by sleeping), closes or crashes the store, and
reopens it: a durable store shows exactly what was acknowledged, the memory store nothing.
What only one store has (the redo log and checkpoints, a connection to PostgreSQL) is tested
in test_sqlite.py and test_postgres.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobwire.engine import Engine, EngineConfig, Job, JobState, WorkerSession
from jobwire.ports import StoredJob, key_value_store
from tests.store.kinds import Kind, committed

T = TypeVar("T")


def run(main: Callable[[], Awaitable[T]]) -> T:
    async def wrapper() -> T:
        return await main()

    return asyncio.run(wrapper())


def make_job(number: int, **fields: object) -> Job:
    job = Job(f"H:test:{number}", "reverse", f"payload {number}".encode(), created_at=1000.0)
    for name, value in fields.items():
        setattr(job, name, value)
    return job


def test_jobs_replay_in_enqueue_order_with_every_field(kind: Kind) -> None:
    store = kind.open()

    async def main() -> None:
        first = make_job(1, unique="u1", priority=1, max_attempts=3, reducer="sum")
        first.ext = {"retry": {"max": 3}, "tags": ["a"]}
        store.job_saved(first)
        store.job_saved(make_job(2, run_at=5000.0, state=JobState.SCHEDULED))
        store.job_saved(make_job(3, queue="other"))
        assert await committed(store)
        # A later change of the first job (its attempt) must not move it behind the others.
        first.attempts = 1
        first.state = JobState.ACTIVE
        store.job_saved(first)
        assert await committed(store)

    run(main)
    store.close()
    rows = kind.loaded()
    assert [row.id for row in rows] == kind.expect(["H:test:1", "H:test:2", "H:test:3"])
    if not kind.keeps:
        return
    assert rows[0] == StoredJob(
        id="H:test:1",
        function="reverse",
        queue="reverse",
        unique="u1",
        payload=b"payload 1",
        priority=1,
        state=JobState.ACTIVE,
        attempts=1,
        max_attempts=3,
        run_at=None,
        created_at=1000.0,
        reducer="sum",
        ext=b'{"retry":{"max":3},"tags":["a"]}',
        row=1,
    )
    assert [row.row for row in rows] == [1, 2, 3]
    assert (rows[1].run_at, rows[1].state) == (5000.0, JobState.SCHEDULED)
    assert rows[2].queue == "other"


def test_latest_change_per_job_wins_within_a_batch(kind: Kind) -> None:
    store = kind.open()

    async def main() -> None:
        gone, back, kept = make_job(1), make_job(2), make_job(3)
        store.job_saved(back)
        assert await committed(store)
        # One loop turn: save+remove cancels out; remove+save keeps the job.
        store.job_saved(gone)
        store.job_saved(kept)
        store.job_removed(gone)
        store.job_removed(back)
        store.job_saved(back)
        assert await committed(store)

    run(main)
    store.close()
    assert [row.id for row in kind.loaded()] == kind.expect(["H:test:2", "H:test:3"])


def test_replayed_jobs_share_their_function_and_queue_names(kind: Kind) -> None:
    store = kind.open()

    async def main() -> None:
        for number in range(1, 4):
            store.job_saved(make_job(number))
        store.job_saved(make_job(4, queue="other"))
        assert await committed(store)

    run(main)
    store.close()
    rows = kind.loaded()
    assert len(rows) == len(kind.expect([1, 2, 3, 4]))
    if rows:
        # One string per name, as for jobs queued live: not one per job and column.
        assert rows[0].function is rows[1].function is rows[2].function is rows[3].function
        assert rows[0].queue is rows[0].function
        assert rows[3].queue == "other"


def test_after_commit_waits_for_the_commit_and_is_immediate_when_idle(kind: Kind) -> None:
    store = kind.open()
    calls: list[tuple[str, bool]] = []

    async def main() -> None:
        store.after_commit(lambda ok: calls.append(("idle", ok)))
        assert calls == [("idle", True)]
        store.job_saved(make_job(1))
        store.after_commit(lambda ok: calls.append(("first", ok)))
        if store.durable:  # nothing reaches the disk or the database within the call
            assert store.pending()
            assert calls == [("idle", True)]
        assert await committed(store)
        assert not store.pending()
        store.after_commit(lambda ok: calls.append(("idle again", ok)))

    run(main)
    store.close()
    assert calls == [("idle", True), ("first", True), ("idle again", True)]


def test_large_batches_keep_order_and_delete_exactly(kind: Kind) -> None:
    store = kind.open()
    jobs = [make_job(number) for number in range(1, 601)]

    async def main() -> None:
        for job in jobs:
            store.job_saved(job)
        assert await committed(store)
        for job in jobs[::2]:
            store.job_removed(job)
        assert await committed(store)

    run(main)
    store.close()
    assert [row.id for row in kind.loaded()] == kind.expect([job.id for job in jobs[1::2]])


def test_attributes_that_are_not_json_do_not_lose_the_job(kind: Kind) -> None:
    store = kind.open()

    async def main() -> None:
        store.job_saved(make_job(1, ext={"raw": b"bytes are not JSON"}))
        store.job_saved(make_job(2, ext={"fine": [1, 2]}))
        assert await committed(store)

    run(main)
    store.close()
    assert [(row.id, row.ext) for row in kind.loaded()] == kind.expect(
        [("H:test:1", None), ("H:test:2", b'{"fine":[1,2]}')]
    )


def test_acknowledged_jobs_survive_a_crash(kind: Kind) -> None:
    store = kind.open()

    async def main() -> None:
        store.job_saved(make_job(1, unique="u1", max_attempts=2, ext={"k": "v"}))
        store.job_saved(make_job(2))
        assert await committed(store)
        removed = make_job(3)
        store.job_saved(removed)
        assert await committed(store)
        store.job_removed(removed)
        assert await committed(store)

    run(main)
    kind.crash(store)
    rows = kind.loaded()
    assert [(row.id, row.unique, row.ext) for row in rows] == kind.expect(
        [("H:test:1", "u1", b'{"k":"v"}'), ("H:test:2", None, None)]
    )


class IdleWorker:
    def wake(self) -> None:
        pass

    def assign(self, job: Job) -> None:
        pass

    def revoke(self, job: Job, reason: str) -> None:
        pass


def test_engine_replay_counts_active_attempts_and_keeps_handles_unique(kind: Kind) -> None:
    config = EngineConfig(id_prefix="H:test")
    store = kind.open()
    engine = Engine(config, journal=store)

    async def main() -> None:
        for number in range(4):
            engine.submit("reverse", b"%d" % number)
        engine.submit("reverse", b"later", run_at=engine.clock() + 3600)
        engine.submit("reverse", b"foreground", background=False)
        worker = WorkerSession("w", IdleWorker(), protocol="test")
        engine.add_worker(worker)
        engine.add_ability(worker, "reverse")
        done = engine.grab(worker)
        active = engine.grab(worker)
        assert done is not None and active is not None
        engine.complete(done, b"ok")
        assert await committed(store)

    run(main)
    kind.crash(store)  # killed: the active job's lease is what the store says

    store = kind.open()
    engine = Engine(config, journal=store)
    assert engine.replay(store.load(), store.numbers_ceiling()) == len(kind.expect([1, 2, 3, 4]))
    jobs = list(engine.jobs.values())
    if kind.keeps:
        assert [job.payload for job in jobs] == [b"1", b"2", b"3", b"later"]  # b"0" completed
        assert [job.attempts for job in jobs] == [1, 0, 0, 0]
        assert [job.state for job in jobs] == [JobState.AVAILABLE] * 3 + [JobState.SCHEDULED]

    async def submit_again() -> str:
        job, _ = engine.submit("reverse", b"new")
        assert await committed(store)
        return job.id

    new_id = run(submit_again)
    store.close()
    if kind.keeps:
        # After the last number given out (the foreground H:test:6 included), not H:test:1.
        assert int(new_id.rpartition(":")[2]) > 6
        assert len(kind.loaded()) == 5


# ---------------------------------------------------------------------- key-value records


def test_records_are_committed_with_the_jobs_and_survive_reopening(kind: Kind) -> None:
    store = kind.open()
    records = key_value_store(store)
    if not kind.keeps:
        assert records is None  # the memory store offers no key-value API
        store.close()
        return
    assert records is store

    async def write() -> bool:
        store.kv_put("cron", "nightly", b'{"a":1}')
        store.kv_put("cron", "hourly", b"x")
        store.kv_put("workflow", "w1", b"y")
        store.job_saved(make_job(1))
        # Written and not yet committed: still what kv_load answers.
        assert store.kv_load("cron") == {"nightly": b'{"a":1}', "hourly": b"x"}
        ok = await committed(store)
        store.kv_put("cron", "hourly", None)  # deleted in a later batch
        return ok and await committed(store)

    try:
        assert run(write)
    finally:
        store.close()
    store = kind.open()
    try:
        assert store.kv_load("cron") == {"nightly": b'{"a":1}'}
        assert store.kv_load("workflow") == {"w1": b"y"}
        assert store.kv_load("nothing") == {}
        assert [row.id for row in store.load()] == ["H:test:1"]
    finally:
        store.close()


# ---------------------------------------------------------------------- random histories

JOBS = 12
Op = tuple[str, int, int]  # (kind, job number, version)

ops = st.lists(
    st.one_of(
        st.tuples(st.just("save"), st.integers(0, JOBS - 1), st.integers(0, 99)),
        st.tuples(st.just("remove"), st.integers(0, JOBS - 1), st.just(0)),
        st.tuples(st.just("kv"), st.integers(0, 3), st.integers(0, 99)),
        st.tuples(st.just("turn"), st.just(0), st.just(0)),
        st.tuples(st.just("commit"), st.just(0), st.just(0)),
        st.tuples(st.just("crash"), st.just(0), st.just(0)),
    ),
    max_size=40,
)


def replay_history(kind: Kind, operations: list[Op]) -> None:
    """Drive the store with `operations`; every reopening must show exactly the
    acknowledged state (nothing for the memory store)."""
    model: dict[str, bytes] = {}  # job id -> payload, as acknowledged
    kv_model: dict[str, bytes] = {}
    pending: dict[str, bytes | None] = {}
    kv_pending: dict[str, bytes] = {}

    def open_store() -> tuple[Any, dict[str, Job]]:
        store = kind.open()
        jobs = {}
        for stored in store.load():
            job = Job(stored.id, "f", stored.payload, created_at=1.0)
            job.row = stored.row
            jobs[stored.id] = job
        assert {id_: job.payload for id_, job in jobs.items()} == (model if kind.keeps else {})
        if kind.keeps:
            assert store.kv_load("test") == kv_model
        else:
            model.clear()
            kv_model.clear()
        return store, jobs

    async def acknowledged() -> None:
        assert await committed(store)
        for key, value in pending.items():
            if value is None:
                model.pop(key, None)
            else:
                model[key] = value
        kv_model.update(kv_pending)
        pending.clear()
        kv_pending.clear()

    async def drive() -> None:
        nonlocal store, jobs
        for op, number, version in [*operations, ("commit", 0, 0)]:
            name = f"H:test:{number}"
            if op == "save":
                job = jobs.get(name) or Job(name, "f", b"", created_at=1.0)
                job.payload = b"v%d" % version
                jobs[name] = job
                store.job_saved(job)
                pending[name] = job.payload
            elif op == "remove" and name in jobs:
                store.job_removed(jobs.pop(name))
                pending[name] = None
            elif op == "kv" and kind.keeps:
                store.kv_put("test", str(number), b"%d" % version)
                kv_pending[str(number)] = b"%d" % version
            elif op == "turn":  # the batch goes out; the next one starts
                await asyncio.sleep(0)
            elif op == "commit":
                await acknowledged()
            elif op == "crash":
                await acknowledged()  # nothing unacknowledged is judged
                kind.crash(store)
                store, jobs = open_store()

    store, jobs = open_store()
    asyncio.run(drive())
    store.close()
    open_store()[0].close()


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(operations=ops)
def test_reopening_shows_exactly_the_acknowledged_state(kind: Kind, operations: list[Op]) -> None:
    store = kind.open()  # the same tables for every example: start them empty

    async def empty() -> bool:
        for stored in list(store.load()):
            job = Job(stored.id, "f", b"", created_at=1.0)
            job.row = stored.row
            store.job_removed(job)
        if kind.keeps:
            for key in store.kv_load("test"):
                store.kv_put("test", key, None)
        return await committed(store)

    try:
        assert run(empty)
    finally:
        store.close()
    replay_history(kind, operations)
