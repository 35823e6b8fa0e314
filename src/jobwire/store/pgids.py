"""Job ids clients choose, one job per id in the whole cluster.

An OJS client may name its job (`"id"` in a push). On one node the engine refuses an id it
knows; on a cluster two nodes may take the same id in the same moment, each knowing nothing
of the other's job yet (a client that timed out and pushes again through another node does
just that). The jobs' ids are not a unique index: a row's id is written by the group commit
with hundreds of others, and one violation would fail them all.

So a push with chosen ids holds, while it runs, one transaction's advisory lock per id
(taken in sorted order, so two batches never deadlock) and looks for a live job's row with
each. The push's own row is committed before its reply, so before the lock is let go: a
second push of the id, on any node, waits for the lock and then finds that row. Pushes
without a chosen id never come here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from typing import Any

import psycopg

from jobwire.ports.cluster import HolderUnavailable
from jobwire.store.postgres import _LOCK_CLASS, CONNECT_TIMEOUT, SESSION_SQL, _reason

#: The advisory locks' class (two-key locks: apart from the nodes' one-key locks). The
#: migration lock is `_LOCK_CLASS + 1`.
ID_LOCK_CLASS = _LOCK_CLASS + 2
#: Lock each id, in the array's order. The schema's name is in the lock's key: the tests'
#: schemas share a database.
LOCK_IDS_SQL = f"""
SELECT count(pg_advisory_xact_lock({ID_LOCK_CLASS}, hashtext(current_schema() || chr(31) || id)))
FROM unnest(%s::text[]) AS id
"""
#: Of these ids, those a job's row has (once they are locked: a separate statement, so that
#: no plan can look before it locks).
TAKEN_IDS_SQL = "SELECT DISTINCT id FROM jobs WHERE id = ANY(%s::text[])"
#: Seconds a push waits for another push of the same id to commit, at most.
LOCK_TIMEOUT = 10.0
#: Idle connections kept for the next push with chosen ids.
IDLE_KEPT = 4


class ChosenIds:
    """The locks on chosen ids, on a few connections of their own."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._idle: list[psycopg.AsyncConnection[Any]] = []

    @contextlib.asynccontextmanager
    async def held(self, ids: Iterable[str]) -> AsyncIterator[set[str]]:
        """Hold `ids` until the block ends; yields those a job's row already has (a job
        on a node, or in the shared queue). Raises HolderUnavailable when the database
        cannot be asked."""
        wanted = sorted(set(ids))
        conn: psycopg.AsyncConnection[Any] | None = None
        try:
            conn = await self._connection()
            async with asyncio.timeout(LOCK_TIMEOUT):
                await conn.execute("BEGIN")
                await conn.execute(LOCK_IDS_SQL, (wanted,))
                cur = await conn.execute(TAKEN_IDS_SQL, (wanted,))
                taken = {str(row[0]) for row in await cur.fetchall()}
        except (psycopg.Error, OSError, TimeoutError) as exc:
            if conn is not None:
                conn.pgconn.finish()
            raise HolderUnavailable(
                f"cannot check the job ids in the database: {_reason(exc)}"
            ) from None
        try:
            yield taken
        finally:
            with contextlib.suppress(psycopg.Error, OSError, TimeoutError):
                async with asyncio.timeout(LOCK_TIMEOUT):
                    await conn.execute("ROLLBACK")  # nothing written: the locks go
            self._put_back(conn)

    def _put_back(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Keep `conn` for the next push if its transaction ended (its locks are free);
        otherwise (a timeout midway, a broken connection) close it."""
        idle = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        if idle and not conn.broken and len(self._idle) < IDLE_KEPT:
            self._idle.append(conn)
        else:
            conn.pgconn.finish()

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        while self._idle:
            conn = self._idle.pop()
            if not conn.broken and not conn.closed:
                return conn
        conn = await psycopg.AsyncConnection.connect(
            self.dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT, prepare_threshold=0
        )
        await conn.execute(SESSION_SQL)
        return conn

    def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.pgconn.finish()
