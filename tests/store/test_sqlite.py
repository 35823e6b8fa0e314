"""SQLiteStore on its own and under the engine, on a real file, inside a real event loop.

Commits are awaited through `after_commit`, never by sleeping. Where a test needs the writer
thread to be busy, a temporary trigger calls a Python function that blocks until released.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import marshal
import os
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from jobwire.engine import Job
from jobwire.engine.job import ORIGIN_GEARMAN
from jobwire.ports import StoredJob
from jobwire.store import redolog
from jobwire.store import sqlite as sqlite_store
from jobwire.store.sqlite import EARLY_BATCH_WRITES, SCHEMA_VERSION, SQLiteStore, StoreError

T = TypeVar("T")


def run(main: Callable[[], Awaitable[T]]) -> T:
    async def wrapper() -> T:
        return await main()

    return asyncio.run(wrapper())


async def committed(store: SQLiteStore) -> bool:
    """Wait until everything written so far has been committed; return `ok`."""
    done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    store.after_commit(done.set_result)
    return await done


def make_job(number: int, **fields: object) -> Job:
    job = Job(f"H:test:{number}", "reverse", f"payload {number}".encode(), created_at=1000.0)
    for name, value in fields.items():
        setattr(job, name, value)
    return job


def crash(store: SQLiteStore) -> None:
    """Stop the store as a killed server would: the log written so far, no checkpoint (a
    running checkpoint process dies with the server)."""
    checkpoint = store._checkpoint
    if checkpoint is not None:
        checkpoint.kill()
        checkpoint.wait()
    store._log.stop()
    store._closed = True
    store._conn.close()
    os.close(store._lock)


def loaded(path: Path) -> list[StoredJob]:
    store = SQLiteStore(path)
    try:
        return list(store.load())
    finally:
        store.close()


#: Decides what reaches the syncer: `relay(ask, number, generation)`, where `ask` is the
#: syncer's own.
Relaying = Callable[[Callable[[int, int], None], int, int], None]


class Relay:
    """Stands between the redo log and its syncer, the current one or else the next one
    started, and passes its requests through `relaying` until `remove()`; the batches
    the log publishes reach the syncer while `publishing`."""

    def __init__(self, store: SQLiteStore, relaying: Relaying) -> None:
        self.redo = redo = store._log
        self.relaying = relaying
        self.publishing = True
        self.inner = redo._syncer
        self.start = redo.start_syncer
        if self.inner is None:
            redo.start_syncer = self.started
        else:
            redo._syncer = self

    def started(
        self, owner: redolog.RedoLog, loop: asyncio.AbstractEventLoop
    ) -> redolog.SyncerLink:
        self.redo.start_syncer = self.start
        self.inner = self.start(owner, loop)
        return self

    def ask(self, number: int, generation: int) -> None:
        assert self.inner is not None
        self.relaying(self.inner.ask, number, generation)

    def publish(self, number: int) -> None:
        assert self.inner is not None
        if self.publishing:
            self.inner.publish(number)

    def poll(self) -> None:
        if self.inner is not None:
            self.inner.poll()

    def stop(self) -> None:
        if self.inner is not None:
            self.inner.stop()

    def remove(self) -> None:
        self.redo.start_syncer = self.start
        if self.redo._syncer is self:
            self.redo._syncer = self.inner


class Gate:
    """Holds the redo log's next sync request until `open()`: as if the syncer were busy
    with it. `entered` is set once the request was made."""

    def __init__(self, store: SQLiteStore) -> None:
        self.entered = asyncio.Event()
        held: list[tuple[Callable[[int, int], None], int, int]] = []

        def gated(ask: Callable[[int, int], None], number: int, generation: int) -> None:
            if self.entered.is_set():
                ask(number, generation)
            else:
                held.append((ask, number, generation))
                self.entered.set()

        def open_gate() -> None:
            relay.publishing = True
            ask, number, generation = held[0]
            ask(number, generation)

        # The syncer, busy with the held request, does not follow the log: what is written
        # meanwhile waits for the next request.
        relay = Relay(store, gated)
        relay.publishing = False
        self.open: Callable[[], None] = open_gate


def test_after_commit_waits_for_the_commit_and_is_immediate_when_idle(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "jobs.db")
    calls: list[tuple[str, bool]] = []

    async def main() -> None:
        store.after_commit(lambda ok: calls.append(("idle", ok)))
        assert calls == [("idle", True)]
        gate = Gate(store)
        store.job_saved(make_job(1))
        store.after_commit(lambda ok: calls.append(("first", ok)))
        assert store.pending()
        await gate.entered.wait()  # the syncer is busy with the first batch
        store.after_commit(lambda ok: calls.append(("in flight", ok)))
        assert calls == [("idle", True)]
        gate.open()
        assert await committed(store)
        assert not store.pending()

    run(main)
    store.close()
    assert calls == [("idle", True), ("first", True), ("in flight", True)]


def test_between_reads_a_large_batch_goes_to_an_idle_disk_before_the_turn_ends(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "jobs.db")
    handed: list[int] = []  # batches handed to the log after each `commit_if_idle`

    async def main() -> None:
        for number in range(EARLY_BATCH_WRITES - 1):
            store.job_saved(make_job(number))
        store.commit_if_idle()
        handed.append(store._handed)  # too small to be worth a sync of its own: 0
        store.job_saved(make_job(EARLY_BATCH_WRITES))
        store.commit_if_idle()
        handed.append(store._handed)  # handed off now, not at the end of the turn: 1
        for number in range(EARLY_BATCH_WRITES):
            store.job_saved(make_job(EARLY_BATCH_WRITES + 1 + number))
        store.commit_if_idle()
        handed.append(store._handed)  # the first batch's sync is outstanding: 1
        assert await committed(store)

    run(main)
    store.close()
    assert handed == [0, 1, 1]
    assert store._handed == 2  # the rest at the end of the turn
    assert len(loaded(tmp_path / "jobs.db")) == 2 * EARLY_BATCH_WRITES


def test_a_store_failure_between_reads_is_logged_not_raised_into_the_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """`commit_if_idle` and `poll` run inside a client's read, whose connection an
    exception would close."""
    store = SQLiteStore(tmp_path / "jobs.db")

    def broken(data: bytes) -> int:
        raise RuntimeError("checksum unit on fire")

    async def main() -> None:
        for number in range(EARLY_BATCH_WRITES):
            store.job_saved(make_job(number))
        monkeypatch.setattr(redolog.zlib, "crc32", broken)
        store.commit_if_idle()
        monkeypatch.undo()

    with caplog.at_level(logging.ERROR):
        run(main)
    store.close()
    assert "handing off a batch failed" in caplog.text
    assert "checksum unit on fire" in caplog.text


def test_with_fsync_off_batches_wait_for_the_end_of_the_turn(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "jobs.db", fsync="off")

    async def main() -> None:
        for number in range(2 * EARLY_BATCH_WRITES):
            store.job_saved(make_job(number))
        store.commit_if_idle()
        assert store._handed == 0
        assert await committed(store)

    run(main)
    store.close()
    assert store.commits == 1


@pytest.mark.parametrize(("fsync", "commits"), [("batch", 2), ("always", 3)])
def test_batch_merges_turns_written_during_a_commit(
    tmp_path: Path, fsync: str, commits: int
) -> None:
    store = SQLiteStore(tmp_path / "jobs.db", fsync=fsync)
    oks: list[bool] = []

    async def main() -> None:
        gate = Gate(store)
        for number in range(3):
            store.job_saved(make_job(number))
            store.after_commit(oks.append)
            if number == 0:
                await gate.entered.wait()
            else:
                await asyncio.sleep(0)  # end the loop turn
        gate.open()
        assert await committed(store)

    run(main)
    assert store.commits == commits
    assert oks == [True, True, True]
    store.close()
    assert len(loaded(tmp_path / "jobs.db")) == 3


def test_a_killed_syncer_is_replaced_and_what_it_was_syncing_still_commits(
    tmp_path: Path,
) -> None:
    path = tmp_path / "jobs.db"
    store = SQLiteStore(path)

    async def main() -> None:
        store.job_saved(make_job(1))
        assert await committed(store)
        syncer = store._log._syncer
        assert isinstance(syncer, redolog._Syncer)
        first = syncer.process
        gate = Gate(store)
        store.job_saved(make_job(2))
        await gate.entered.wait()
        first.kill()  # the request below reaches a dead process
        await asyncio.to_thread(first.wait)
        gate.open()
        assert await committed(store)
        replaced = store._log._syncer
        assert isinstance(replaced, redolog._Syncer) and replaced.process is not first
        store.job_saved(make_job(3))
        assert await committed(store)

    run(main)
    crash(store)
    assert [row.id for row in loaded(path)] == ["H:test:1", "H:test:2", "H:test:3"]


def fail_syncs(store: SQLiteStore) -> Callable[[], None]:
    """Make the syncer fail, as a failing disk would: it is asked to sync a file it cannot
    open. Returns what undoes that."""
    relay = Relay(store, lambda ask, number, generation: ask(number, generation + 100))
    return relay.remove


def fails_alone(
    path: Path, break_store: Callable[[SQLiteStore], Callable[[], None]], error: str
) -> None:
    """Job 1 commits; job 2, saved while `break_store` holds, does not, and the store's last
    error says `error`; job 3 commits once it is undone; a crash then keeps 1 and 3."""
    store = SQLiteStore(path)

    async def main() -> None:
        store.job_saved(make_job(1))
        assert await committed(store)
        restore = break_store(store)
        store.job_saved(make_job(2))
        assert not await committed(store)
        assert store.last_error is not None and error in store.last_error
        restore()
        store.job_saved(make_job(3))
        assert await committed(store)
        assert store.last_error is None

    run(main)
    crash(store)
    assert [row.id for row in loaded(path)] == ["H:test:1", "H:test:3"]


def test_a_failed_sync_fails_its_batches_and_cuts_their_frames(tmp_path: Path) -> None:
    fails_alone(tmp_path / "jobs.db", fail_syncs, "No such file")


def test_a_batch_whose_sync_failed_is_not_replayed_after_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SQLiteStore(path)

    async def main() -> None:
        fail_syncs(store)
        store.job_saved(make_job(1))
        assert not await committed(store)

    run(main)
    crash(store)  # right after the failure: the failed frame must not be in the file
    assert loaded(path) == []


def test_failed_write_reports_not_ok_and_the_store_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "jobs.db"
    store = SQLiteStore(path)
    pwrite = os.pwrite

    def disk_full(fd: int, data: bytes, offset: int) -> int:
        pwrite(fd, data[: len(data) // 2], offset)  # half a frame reaches the file
        raise OSError(errno.ENOSPC, "No space left on device")

    async def main() -> None:
        store.job_saved(make_job(1))
        assert await committed(store)
        monkeypatch.setattr(redolog.os, "pwrite", disk_full)
        for number in range(2, 10):
            store.job_saved(make_job(number))
        assert not await committed(store)
        assert store.last_error is not None and "No space" in store.last_error
        monkeypatch.setattr(redolog.os, "pwrite", pwrite)
        store.job_saved(make_job(10))
        assert await committed(store)
        assert store.last_error is None

    run(main)
    # As if killed: the next open reads the log, which holds no trace of the failed write.
    crash(store)
    assert [row.id for row in loaded(path)] == ["H:test:1", "H:test:10"]


def test_a_batch_that_cannot_be_encoded_fails_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its waiters hear of the failure; the next batch's sync does not answer for it."""

    def refuse(value: object, version: int) -> bytes:
        raise ValueError("unmarshallable object")

    def break_encoding(store: SQLiteStore) -> Callable[[], None]:
        monkeypatch.setattr(marshal, "dumps", refuse)
        return monkeypatch.undo

    fails_alone(tmp_path / "jobs.db", break_encoding, "cannot encode")


def test_attributes_nested_too_deep_for_json_do_not_lose_the_job(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SQLiteStore(path)
    nested: list[object] = []
    for _ in range(5000):
        nested = [nested]

    async def main() -> None:
        store.job_saved(make_job(1, ext={"deep": nested}))
        assert await committed(store)

    run(main)
    store.close()
    assert [(row.id, row.ext) for row in loaded(path)] == [("H:test:1", None)]


def test_fsync_policy_sets_synchronous(tmp_path: Path) -> None:
    for fsync, level in (("always", 2), ("batch", 2), ("off", 0)):
        store = SQLiteStore(tmp_path / f"{fsync}.db", fsync=fsync)
        assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == level
        assert store._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        store.close()
    with pytest.raises(ValueError, match="fsync"):
        SQLiteStore(tmp_path / "x.db", fsync="sometimes")


def test_a_second_server_on_the_same_file_is_refused(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "jobs.db")
    with pytest.raises(StoreError, match="in use"):
        SQLiteStore(tmp_path / "jobs.db")
    store.close()
    SQLiteStore(tmp_path / "jobs.db").close()


def test_a_version_1_file_is_migrated_and_keeps_its_jobs(tmp_path: Path) -> None:
    """Version 1 had a unique index on the job id; opening the file drops it."""
    path = tmp_path / "v1.db"
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE jobs (seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE,"
            " function TEXT NOT NULL, queue TEXT NOT NULL, uniq TEXT, payload BLOB NOT NULL,"
            " priority INTEGER NOT NULL, state INTEGER NOT NULL, attempts INTEGER NOT NULL,"
            " max_attempts INTEGER, run_at REAL, created_at REAL NOT NULL, reducer TEXT,"
            " ext BLOB)"
        )
        conn.execute(
            "INSERT INTO jobs VALUES (7, 'H:old:1', 'f', 'f', 'u', x'01', 0, 3, 1, 5, NULL,"
            " 1000.0, NULL, NULL)"
        )
        conn.execute("PRAGMA user_version = 1")
    store = SQLiteStore(path)
    old = next(iter(store.load()))
    assert (old.id, old.unique, old.payload, old.attempts, old.row) == ("H:old:1", "u", b"\1", 1, 7)

    async def main() -> None:
        store.job_saved(make_job(2))  # new rows are keyed after the migrated ones
        assert await committed(store)

    run(main)
    store.close()
    assert [(row.id, row.row) for row in loaded(path)] == [("H:old:1", 7), ("H:test:2", 8)]
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute("PRAGMA index_list(jobs)").fetchall() == []


def test_unknown_schema_version_and_bad_paths_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError, match="schema version"):
        SQLiteStore(path)
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(StoreError, match="cannot open"):
        SQLiteStore(tmp_path / "file" / "jobs.db")
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database" * 1000)
    with pytest.raises(StoreError):
        SQLiteStore(garbage)


# ---------------------------------------------------------------------- redo log, checkpoints


def redo_files(path: Path) -> list[str]:
    return sorted(entry.name for entry in path.parent.iterdir() if "-redo-" in entry.name)


def count_inserts(store: SQLiteStore) -> list[int]:
    """A list whose length counts the rows SQLite inserts into `jobs` from now on."""
    return counted_inserts(store._conn, "jobs")


def counted_inserts(conn: sqlite3.Connection, table: str) -> list[int]:
    """A list whose length counts the rows `conn` inserts into `table` from now on."""
    inserted: list[int] = []
    conn.create_function("counted", 0, lambda: inserted.append(1) or 0)
    trigger = f"CREATE TEMP TRIGGER counted BEFORE INSERT ON {table} BEGIN SELECT counted(); END"
    conn.execute(trigger)
    return inserted


def replay_failing_after_chunks_of_two(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch, table: str
) -> int:
    """Crash `store`, add a log file after its last one that cannot be decoded, and replay
    the log in chunks of two changes as the checkpoint process does: the rows inserted into
    `table` before it failed (and rolled them back). The broken file is removed again."""
    crash(store)
    path = store.path
    written = redo_files(path)
    broken = path.parent / f"{path.name}-redo-{store._generation + 1}"
    broken.write_bytes(redolog.frame(b"not marshal data"))
    monkeypatch.setattr(sqlite_store, "CHECKPOINT_CHUNK", 2)
    conn = sqlite_store.connect(path, "batch")
    inserted = counted_inserts(conn, table)
    with pytest.raises(StoreError, match="redo log"):
        sqlite_store.apply_log(conn, path)
    assert conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone() == (0,)  # rolled back
    conn.close()
    broken.unlink()
    assert redo_files(path) == written  # kept for the next try
    return len(inserted)


def test_acknowledged_jobs_survive_a_crash_through_the_log_alone(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SQLiteStore(path)
    inserted = count_inserts(store)

    async def main() -> None:
        first = make_job(1, unique="u1", max_attempts=2, ext={"k": "v"})
        store.job_saved(first)
        store.job_saved(make_job(2))
        assert await committed(store)
        store.job_removed(first)
        store.job_saved(make_job(3))
        store.kv_put("cron", "nightly", b"{}")
        assert await committed(store)

    run(main)
    assert inserted == []  # SQLite is not on the acknowledgement path
    assert redo_files(path) == ["jobs.db-redo-1"]
    crash(store)

    store = SQLiteStore(path)  # applies the log, checkpoints it and drops it
    assert redo_files(path) == []
    assert [(row.id, row.row) for row in store.load()] == [("H:test:2", 2), ("H:test:3", 3)]
    assert store.kv_load("cron") == {"nightly": b"{}"}
    store.close()


def test_checkpoints_move_the_log_into_sqlite_and_remove_it(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SQLiteStore(path, checkpoint_bytes=2000)
    jobs = [make_job(number) for number in range(1, 201)]

    async def main() -> None:
        for start in range(0, 200, 10):  # 20 batches, each well past a tenth of the limit
            for job in jobs[start : start + 10]:
                store.job_saved(job)
            assert await committed(store)
            while store._checkpoint is not None:  # one runs at a time; let each finish
                await asyncio.sleep(0.01)
        for job in jobs[::2]:
            store.job_removed(job)
        assert await committed(store)
        while store._checkpoint is not None:  # the last one may still be running
            await asyncio.sleep(0.01)

    run(main)
    assert store.checkpoints >= 2
    # At most the current generation's file is left; SQLite has every checkpointed row.
    assert set(redo_files(path)) <= {f"jobs.db-redo-{store._generation}"}
    crash(store)
    assert [row.id for row in loaded(path)] == [job.id for job in jobs[1::2]]
    assert redo_files(path) == []


def test_key_value_writes_are_forgotten_once_a_checkpoint_has_them(tmp_path: Path) -> None:
    """Until its checkpoint, a record is read back from memory; after it, from SQLite: the
    store does not keep every key ever written (a Titanic request's, an event chunk's)."""
    path = tmp_path / "jobs.db"
    store = SQLiteStore(path, checkpoint_bytes=2000)

    async def main() -> None:
        for number in range(200):
            store.kv_put("titanic", f"request-{number}", b"x" * 40)
            if number % 2:
                store.kv_put("titanic", f"request-{number - 1}", None)
            assert await committed(store)
            while store._checkpoint is not None:
                await asyncio.sleep(0.01)

    run(main)
    assert store.checkpoints >= 2
    assert len(store._kv_written) < 50  # the current generation's, not all 200 keys
    wanted = {f"request-{number}": b"x" * 40 for number in range(1, 200, 2)}
    assert store.kv_load("titanic") == wanted
    store.close()
    reopened = SQLiteStore(path)
    try:
        assert reopened.kv_load("titanic") == wanted
    finally:
        reopened.close()


def test_a_file_started_early_for_its_zeros_is_checkpointed_with_the_next_checkpoint(
    tmp_path: Path,
) -> None:
    path = tmp_path / "jobs.db"
    # Log files get 1 MiB and 64 KiB of zeros: three of these jobs fill one, four pass
    # the checkpoint limit.
    store = SQLiteStore(path, checkpoint_bytes=1 << 20)
    jobs = [make_job(number, payload=bytes(300_000)) for number in range(1, 9)]
    generations = []

    async def main() -> None:
        for job in jobs:
            spare = store._log._spare
            if spare is not None:
                await asyncio.to_thread(spare.join)  # the next zero-filled file is ready
            store.job_saved(job)
            assert await committed(store)
            generations.append(store._generation)
            while store._checkpoint is not None:
                await asyncio.sleep(0.01)

    run(main)
    # Switched for zeros after the third job, for the checkpoint after the fourth.
    assert generations[:5] == [1, 1, 2, 3, 3]
    assert store.checkpoints >= 1
    assert set(redo_files(path)) <= {f"jobs.db-redo-{store._generation}"}
    crash(store)
    assert [row.id for row in loaded(path)] == [job.id for job in jobs]


def test_a_job_saved_and_removed_between_checkpoints_never_reaches_sqlite(
    tmp_path: Path,
) -> None:
    path = tmp_path / "jobs.db"
    store = SQLiteStore(path)
    kept = make_job(1)

    async def main() -> None:
        store.job_saved(kept)
        assert await committed(store)
        for number in range(2, 6):  # each in a batch of its own, removed in later ones
            job = make_job(number)
            store.job_saved(job)
            assert await committed(store)
            store.job_removed(job)
            assert await committed(store)

    run(main)
    inserted = count_inserts(store)
    store.close()
    assert len(inserted) == 1
    assert [row.id for row in loaded(path)] == ["H:test:1"]


def test_a_failed_checkpoint_keeps_the_log_and_the_next_one_writes_it_all(
    tmp_path: Path,
) -> None:
    path = tmp_path / "jobs.db"
    store = SQLiteStore(path, checkpoint_bytes=3000)
    store.checkpoint_timeout = 0.05
    # Each frame passes the limit: every batch ends a generation.
    jobs = [make_job(number, payload=bytes(5000)) for number in range(1, 21)]
    # Another writer holds the database: the checkpoint process cannot get its lock.
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")

    async def checkpointed() -> None:
        while store._checkpoint is not None or store._rotated_after is not None:
            await asyncio.sleep(0.01)

    async def main() -> None:
        for job in jobs[:10]:
            store.job_saved(job)
            assert await committed(store)
            await checkpointed()
        assert store.checkpoints == 0
        assert len(redo_files(path)) >= 10  # every failed generation's file is kept
        blocker.execute("ROLLBACK")
        for job in jobs[10:]:
            store.job_saved(job)
            assert await committed(store)
            await checkpointed()
        assert store.checkpoints >= 1
        assert len(redo_files(path)) <= 2

    run(main)
    blocker.close()
    crash(store)
    assert [row.id for row in loaded(path)] == [job.id for job in jobs]


def test_a_log_longer_than_a_chunk_keeps_the_latest_change_across_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "jobs.db"
    store = SQLiteStore(path)
    removed, changed, kept, back = (make_job(number) for number in range(1, 5))

    async def main() -> None:
        # One batch per line: with chunks of two changes, every change below lands in a
        # later chunk than the one it overrides.
        for job in (removed, changed, kept, back):
            store.job_saved(job)
        store.kv_put("cron", "gone", b"1")
        store.kv_put("cron", "kept", b"1")
        assert await committed(store)
        store.job_removed(removed)
        assert await committed(store)
        changed.attempts = 3
        store.job_saved(changed)
        assert await committed(store)
        store.job_removed(back)
        assert await committed(store)
        store.job_saved(back)
        store.kv_put("cron", "gone", None)
        store.kv_put("cron", "kept", b"2")
        assert await committed(store)

    run(main)
    crash(store)
    monkeypatch.setattr(sqlite_store, "CHECKPOINT_CHUNK", 2)
    store = SQLiteStore(path)  # replays the log chunk by chunk, in one transaction
    rows = {row.id: row for row in store.load()}
    assert list(rows) == ["H:test:2", "H:test:3", "H:test:4"]
    assert rows["H:test:2"].attempts == 3
    assert store.kv_load("cron") == {"kept": b"2"}
    assert redo_files(path) == []
    store.close()


def test_a_failure_after_some_chunks_were_written_rolls_them_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "jobs.db"
    store = SQLiteStore(path, checkpoint_bytes=1 << 30)
    jobs = [make_job(number) for number in range(1, 7)]

    async def main() -> None:
        for job in jobs:
            store.job_saved(job)
            assert await committed(store)

    run(main)
    # Written chunk by chunk before the broken file was read, then rolled back.
    assert replay_failing_after_chunks_of_two(store, monkeypatch, "jobs") == len(jobs)
    assert [row.id for row in loaded(path)] == [job.id for job in jobs]


def test_key_value_writes_count_towards_a_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "jobs.db"
    store = SQLiteStore(path, checkpoint_bytes=1 << 30)

    async def main() -> None:
        for number in range(6):  # a log of key-value writes alone
            store.kv_put("cron", f"entry-{number}", b"{}")
            assert await committed(store)

    run(main)
    # Written chunk by chunk before the broken file was read, then rolled back.
    assert replay_failing_after_chunks_of_two(store, monkeypatch, "kv") == 6
    store = SQLiteStore(path)
    assert sorted(store.kv_load("cron")) == [f"entry-{number}" for number in range(6)]
    store.close()


def test_a_torn_frame_at_the_end_of_the_log_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SQLiteStore(path)

    async def main() -> None:
        store.job_saved(make_job(1))
        assert await committed(store)

    run(main)
    crash(store)
    log_file = path.parent / "jobs.db-redo-1"
    end = sum(len(redolog.frame(body)) for body in redolog.read_frames(log_file))
    # A crash in the middle of the next write: half a frame (it was never acknowledged),
    # over the zeros that followed the last frame.
    with log_file.open("r+b") as file:
        file.seek(end)
        file.write(redolog.frame(b"x" * 100)[:60])
    assert [row.id for row in loaded(path)] == ["H:test:1"]


def test_a_log_frame_that_cannot_be_decoded_refuses_to_start(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    SQLiteStore(path).close()  # its checkpoint covers generation 1
    (tmp_path / "jobs.db-redo-1").write_bytes(b"older than the checkpoint: skipped")
    (tmp_path / "jobs.db-redo-2").write_bytes(redolog.frame(b"not marshal data"))
    with pytest.raises(StoreError, match="redo log"):
        SQLiteStore(path)
    assert (tmp_path / "jobs.db-redo-2").exists()  # left for whoever investigates
    (tmp_path / "jobs.db-redo-2").unlink()  # and the file is not left locked
    SQLiteStore(path).close()


def test_a_version_2_file_gains_the_checkpoint_table(tmp_path: Path) -> None:
    path = tmp_path / "v2.db"
    SQLiteStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE checkpoint")
    conn.execute("ALTER TABLE jobs DROP COLUMN origin")  # version 4 added it
    conn.execute("PRAGMA user_version = 2")
    conn.commit()
    conn.close()
    store = SQLiteStore(path)
    assert store._conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
    store.close()


def test_a_version_3_file_gains_the_origin_column_and_its_jobs_load(tmp_path: Path) -> None:
    path = tmp_path / "v3.db"
    store = SQLiteStore(path)

    async def save(job: Job) -> None:
        store.job_saved(job)
        assert await committed(store)

    run(lambda: save(make_job(1, origin=ORIGIN_GEARMAN)))
    store.close()
    assert [(row.id, row.origin) for row in loaded(path)] == [("H:test:1", ORIGIN_GEARMAN)]
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE jobs DROP COLUMN origin")
    conn.execute("PRAGMA user_version = 3")
    conn.commit()
    conn.close()
    assert [(row.id, row.origin) for row in loaded(path)] == [("H:test:1", 0)]  # unknown
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


@pytest.mark.parametrize(("fsync", "synced"), [("batch", True), ("always", True), ("off", False)])
def test_the_log_is_synced_before_the_acknowledgement_unless_fsync_is_off(
    tmp_path: Path, fsync: str, synced: bool
) -> None:
    store = SQLiteStore(tmp_path / "jobs.db", fsync=fsync)

    async def main() -> None:
        store.job_saved(make_job(1))
        assert await committed(store)
        # Already, when the commit is reported: the syncer process answered.
        assert (store._log.syncs > 0) is synced

    run(main)
    store.close()
