"""Random job changes, checkpoints and crashes: what reopens is what was acknowledged.

The store is driven with saves, removals and key-value writes in batches (several in flight
at once when a loop turn ends without waiting for the log), with a checkpoint
threshold small enough that generations rotate every batch or two, and is "crashed" (its
log thread stopped, no final checkpoint) at random points; each reopening must show exactly
the state the acknowledged batches describe. Checkpoints run on their own thread: a crash
waits for a running one, so it lands between transactions, as a real crash does for SQLite.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from jobwire.engine import Job
from jobwire.store.sqlite import SQLiteStore

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
    max_size=60,
)


async def committed(store: SQLiteStore) -> bool:
    done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    store.after_commit(done.set_result)
    return await done


def crash(store: SQLiteStore) -> None:
    checkpoint = store._checkpoint
    if checkpoint is not None:
        checkpoint.wait()
    store._log.stop()
    store._closed = True
    store._conn.close()
    os.close(store._lock)


def run(path: Path, operations: list[Op]) -> None:
    model: dict[str, bytes] = {}  # job id -> payload, as acknowledged
    kv_model: dict[str, bytes] = {}
    pending: dict[str, bytes | None] = {}
    kv_pending: dict[str, bytes] = {}

    def open_store() -> tuple[SQLiteStore, dict[str, Job]]:
        store = SQLiteStore(path, checkpoint_bytes=150)
        jobs = {}
        for stored in store.load():
            job = Job(stored.id, "f", stored.payload, created_at=1.0)
            job.row = stored.row
            jobs[stored.id] = job
        assert {id_: job.payload for id_, job in jobs.items()} == model
        assert store.kv_load("test") == kv_model
        return store, jobs

    async def acknowledged() -> None:
        """Wait for the commit of everything so far; the model takes it on."""
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
        for kind, number, version in [*operations, ("commit", 0, 0)]:
            name = f"H:test:{number}"
            if kind == "save":
                job = jobs.get(name) or Job(name, "f", b"", created_at=1.0)
                job.payload = b"v%d" % version
                jobs[name] = job
                store.job_saved(job)
                pending[name] = job.payload
            elif kind == "remove" and name in jobs:
                store.job_removed(jobs.pop(name))
                pending[name] = None
            elif kind == "kv":
                store.kv_put("test", str(number), b"%d" % version)
                kv_pending[str(number)] = b"%d" % version
            elif kind == "turn":  # the batch goes to the log; the next one starts
                await asyncio.sleep(0)
            elif kind == "commit":
                await acknowledged()
                while store._checkpoint is not None:  # let a running checkpoint finish
                    await asyncio.sleep(0.001)
            elif kind == "crash":
                await acknowledged()  # nothing unacknowledged is judged
                crash(store)
                store, jobs = open_store()

    store, jobs = open_store()
    asyncio.run(drive())
    store.close()
    open_store()[0].close()


@settings(max_examples=100, deadline=None)
@given(ops)
def test_reopening_shows_exactly_the_acknowledged_state(operations: list[Op]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        run(Path(directory) / "jobs.db", operations)
