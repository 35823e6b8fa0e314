"""The figures the SQLite store keeps for /metrics and the dashboard: commit latency per
batch, batches and their writes, fsyncs, redo-log bytes, and each checkpoint's time and
size (logged too)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from jobwire.engine import Job
from jobwire.store.sqlite import SQLiteStore


async def committed(store: SQLiteStore) -> bool:
    done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    store.after_commit(done.set_result)
    return await done


def make_job(number: int) -> Job:
    return Job(f"H:test:{number}", "reverse", f"payload {number}".encode(), created_at=1000.0)


def test_commits_and_checkpoints_are_counted_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SQLiteStore(tmp_path / "jobs.db", checkpoint_bytes=2000)
    assert (store.batches, store.write_count, sum(store.commit_times.counts)) == (0, 0, 0)

    async def main() -> None:
        store.start()
        for start in range(0, 200, 10):
            for number in range(start, start + 10):
                store.job_saved(make_job(number + 1))
            assert await committed(store)
            while store._checkpoint is not None:  # one at a time; let each finish
                await asyncio.sleep(0.01)

    with caplog.at_level(logging.INFO, logger="jobwire.store"):
        asyncio.run(main())
    try:
        assert store.write_count == 200
        assert store.batches >= 20
        # Every batch handed to the log was timed once its write was done.
        assert sum(store.commit_times.counts) == store.batches
        assert store.commit_times.total > 0
        assert store.fsyncs() >= 1
        assert store.log_bytes_total > 2000
        assert 0 <= store.redo_log_bytes() < store.log_bytes_total
        assert store.checkpoints >= 2
        assert sum(store.checkpoint_times.counts) == store.checkpoints
        assert store.checkpoint_at > 0 and store.checkpoint_seconds > 0
        assert store.checkpoint_bytes_applied >= 2000
        lines = [r.getMessage() for r in caplog.records if "checkpoint through" in r.getMessage()]
        assert len(lines) == store.checkpoints
        assert "MB of redo log in" in lines[0]
    finally:
        store.close()
