"""The SQLite store's key-value records: committed with the jobs, back after reopening."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from jobwire.ports import key_value_store
from jobwire.store.base import MemoryStore
from jobwire.store.sqlite import SQLiteStore


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
