"""The locks on client-chosen job ids (store/pgids.py), against the local PostgreSQL in a
schema and role of the test's own (tests/pg.py)."""

from __future__ import annotations

import asyncio

import pytest

from jobwire.ports.cluster import HolderUnavailable
from jobwire.store.pgids import ChosenIds
from jobwire.store.postgres import PostgresStore
from tests.pg import Schema, pg_schema
from tests.store.kinds import committed
from tests.store.test_stores import make_job, run

__all__ = ["pg_schema"]

DEADLINE = 30.0


def test_a_second_holder_of_an_id_waits_until_the_first_lets_go_then_sees_its_row(
    pg_schema: Schema,
) -> None:
    store = PostgresStore(pg_schema.dsn)
    first, second = ChosenIds(pg_schema.dsn), ChosenIds(pg_schema.dsn)

    async def main() -> None:
        order: list[str] = []
        async with first.held(["H:test:2", "H:test:1"]) as taken:
            assert taken == set()
            waiting = asyncio.create_task(_hold(second, ["H:test:1", "H:test:9"], order))
            # The second holder is blocked on the lock: its task cannot end while we hold it.
            done, _ = await asyncio.wait([waiting], timeout=0.5)
            assert not done
            store.job_saved(make_job(1))
            assert await committed(store)
            order.append("first let go")
        assert await asyncio.wait_for(waiting, DEADLINE) == {"H:test:1"}
        assert order == ["first let go", "second held"]
        async with first.held(["H:test:9"]) as taken:  # the second let go too
            assert taken == set()

    try:
        run(main)
    finally:
        first.close()
        second.close()
        store.close()


async def _hold(ids: ChosenIds, wanted: list[str], order: list[str]) -> set[str]:
    async with ids.held(wanted) as taken:
        order.append("second held")
        return taken


def test_an_error_inside_the_block_lets_the_ids_go_and_keeps_the_connection(
    pg_schema: Schema,
) -> None:
    PostgresStore(pg_schema.dsn).close()  # the tables
    ids = ChosenIds(pg_schema.dsn)

    async def main() -> None:
        with pytest.raises(KeyError):
            async with ids.held(["a"]):
                raise KeyError("a")
        async with asyncio.timeout(DEADLINE), ids.held(["a"]) as taken:
            assert taken == set()

    try:
        run(main)
        assert len(ids._idle) == 1  # the same connection, its transaction ended
    finally:
        ids.close()


def test_a_database_it_cannot_reach_is_a_clear_error() -> None:
    ids = ChosenIds("postgresql://nobody@127.0.0.1:1/none?connect_timeout=2")

    async def main() -> None:
        with pytest.raises(HolderUnavailable, match="cannot check the job ids"):
            async with ids.held(["a"]):
                pass

    run(main)
