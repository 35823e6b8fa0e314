"""The stores the shared suite runs against: memory, SQLite and PostgreSQL, opened, crashed
and reopened the same way (tests/store/test_stores.py)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from jobwire.ports import Store, StoredJob
from jobwire.store.base import MemoryStore
from jobwire.store.postgres import PostgresStore
from jobwire.store.sqlite import SQLiteStore
from tests.pg import new_schema

KINDS = ["memory", "sqlite", "postgresql"]


@dataclass
class Kind:
    name: str
    #: False for the memory store: a reopened store holds nothing.
    keeps: bool
    open: Callable[[], Any]
    #: `jobwire serve --store` of this store.
    spec: str

    def crash(self, store: Any) -> None:
        """Stop `store` as a killed server would: no final commit, no checkpoint."""
        if isinstance(store, SQLiteStore):
            checkpoint = store._checkpoint
            if checkpoint is not None:
                checkpoint.kill()
                checkpoint.wait()
            store._log.stop()
            store._closed = True
            store._conn.close()
            os.close(store._lock)
        elif isinstance(store, PostgresStore):
            for _, _, task in store._flying.values():
                task.cancel()
            store.abandon()  # its node's lock goes with its connection: found dead at once

    def loaded(self) -> list[StoredJob]:
        store = self.open()
        try:
            return list(store.load())
        finally:
            store.close()

    def expect(self, rows: list[Any]) -> list[Any]:
        """What a reopened store of this kind shows of `rows`."""
        return rows if self.keeps else []


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Kind]:
    name = request.param
    if name == "memory":
        yield Kind(name, False, MemoryStore, "memory")
    elif name == "sqlite":
        path = tmp_path / "data" / "jobs.db"
        yield Kind(name, True, lambda: SQLiteStore(path), f"sqlite:{path}")
    else:
        with new_schema() as schema:
            dsn = schema.dsn
            yield Kind(name, True, lambda: PostgresStore(dsn), dsn)


async def committed(store: Store) -> bool:
    """Wait until everything written so far has been committed; return `ok`."""
    done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    store.after_commit(done.set_result)
    return await done
