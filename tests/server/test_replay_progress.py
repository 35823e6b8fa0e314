"""Start-up with a large store says what it is doing: the jobs to replay, then progress
lines (jobs replayed, rate, time left) while it replays."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from jobwire.engine import Job
from jobwire.server.app import REPLAY_PROGRESS_FROM, replay_progress
from jobwire.store.sqlite import SQLiteStore
from tests.servers import start_jobwire


def test_replay_progress_passes_every_row_and_logs_rate_and_time_left(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rows = list(range(20_000))
    with caplog.at_level(logging.INFO, logger="jobwire"):
        seen = list(replay_progress(iter(rows), total=40_000, every=0.0))  # type: ignore[arg-type]
    assert seen == rows
    lines = [r.getMessage() for r in caplog.records]
    # Checked once per 8,192 rows: two lines for 20,000 rows.
    assert len(lines) == 2, lines
    assert lines[0].startswith("replaying the store: 8192 of 40000 jobs (20%)")
    assert "jobs/s, about" in lines[0] and lines[0].endswith("s left")


def test_a_server_with_a_large_store_logs_its_replay(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    count = REPLAY_PROGRESS_FROM + 1000
    store = SQLiteStore(path)

    async def fill() -> None:
        store.start()
        for number in range(1, count + 1):
            store.job_saved(Job(f"H:fill:{number}", "big", b"x", created_at=1000.0))
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        store.after_commit(done.set_result)
        assert await done

    asyncio.run(fill())
    store.close()
    server = start_jobwire(
        ["--verbose", "INFO", "--log-file", "stderr"], store=f"sqlite:{path}", workdir=tmp_path
    )
    try:
        log = server.log()
    finally:
        server.stop()
    assert f"replaying the store: {count} jobs" in log, log
    assert f"restored {count} jobs from the store" in log, log
