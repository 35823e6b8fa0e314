"""The SQLite store's key-value records: committed with the jobs, back after reopening."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from jobwire.ports import key_value_store
from jobwire.store.base import MemoryStore
from jobwire.store.sqlite import SQLiteStore
from tests.store.test_sqlite import committed, make_job


def test_records_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"

    async def write() -> bool:
        store = SQLiteStore(path)
        try:
            store.kv_put("cron", "nightly", b'{"a":1}')
            store.kv_put("cron", "hourly", b"x")
            store.kv_put("workflow", "w1", b"y")
            store.job_saved(make_job(1))
            assert store.kv_load("cron") == {"nightly": b'{"a":1}', "hourly": b"x"}
            ok = await committed(store)
            store.kv_put("cron", "hourly", None)  # deleted in a later batch
            return ok and await committed(store)
        finally:
            store.close()

    assert asyncio.run(write())
    store = SQLiteStore(path)
    try:
        assert store.kv_load("cron") == {"nightly": b'{"a":1}'}
        assert store.kv_load("workflow") == {"w1": b"y"}
        assert [row.id for row in store.load()] == ["H:test:1"]
    finally:
        store.close()


def test_a_file_without_the_table_gains_it(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    SQLiteStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE kv")
    conn.commit()
    conn.close()
    store = SQLiteStore(path)
    try:
        assert store.kv_load("cron") == {}
    finally:
        store.close()


def test_only_durable_stores_offer_the_api(tmp_path: Path) -> None:
    assert key_value_store(MemoryStore()) is None
    store = SQLiteStore(tmp_path / "x.db")
    try:
        assert key_value_store(store) is store
    finally:
        store.close()
