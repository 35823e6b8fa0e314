"""asyncpg against psycopg 3 on the PostgreSQL store's hot path, in one run.

The store commits each batch of the event loop's writes as ONE statement (data-modifying
CTEs over `unnest` of column arrays: upsert the changed jobs, delete the finished ones), in
autocommit: one round trip and one commit per batch. This script times exactly that
statement with each driver, interleaved A/B, for a batch size, and prints rows/s per round:

    .venv/bin/python bench/pg_drivers.py --dsn postgresql://jobwire@127.0.0.1:5432/jobwire_test

It works in a schema of its own (created and dropped). Both drivers are required
(`pip install asyncpg 'psycopg[binary]'`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from typing import Any

import asyncpg
import psycopg

from jobwire.store.postgres import BATCH_SQL, MIGRATIONS, SCHEMA_VERSION, Row, batch_parameters

SCHEMA = f"jobwire_bench_{os.getpid()}"
#: The client's CPU seconds of the latest run (the event loop's share of a commit).
CPU: list[float] = []


PLAIN = (0, 0, 0, None, None)  # priority, state, attempts, max_attempts, run_at
NONE = (None, None)  # reducer, ext
NODE = 1  # the node writing: every row is its own (owner), none waits elsewhere (client_node)
OWNED = (NODE, None)


def changes(first: int, count: int, delete_from: int, deletes: int) -> dict[int, Row | None]:
    """A batch of `count` new plain jobs and `deletes` finished ones, as the store has it."""
    now = time.time()
    rows: dict[int, Row | None] = {
        key: (
            key,
            f"H:bench:{key}",
            "reverse",
            "default",
            None,
            b"x" * 100,
            *PLAIN,
            now,
            *NONE,
            0,  # origin
            *OWNED,
        )
        for key in range(first, first + count)
    }
    for key in range(delete_from, delete_from + deletes):
        rows[key] = None
    return rows


def typed_parameters(rows: dict[int, Row | None]) -> list[Any]:
    """The parameters as the store sends them: column arrays it encoded (psycopg only)."""
    return batch_parameters(rows, {}, NODE, f"jobwire.{SCHEMA}")


def list_parameters(rows: dict[int, Row | None]) -> list[Any]:
    """The same as Python lists, for a driver to encode."""
    live = [row for row in rows.values() if row is not None]
    deleted = [key for key, row in rows.items() if row is None]
    return [
        *map(list, zip(*live, strict=True)),
        NODE,
        deleted,
        NODE,
        *[[] for _ in range(5)],  # no key-value records written or deleted
        f"jobwire.{SCHEMA}",
        [],
    ]


def _numbered(sql: str) -> str:
    """psycopg's `%s` placeholders as asyncpg's `$1`, `$2`, ..."""
    parts = sql.split("%b")
    return "".join(f"{part}${i}" for i, part in enumerate(parts[:-1], 1)) + parts[-1]


async def run_asyncpg(dsn: str, batches: list[list[Any]]) -> float:
    conn = await asyncpg.connect(dsn, server_settings={"search_path": SCHEMA})
    try:
        statement = await conn.prepare(_numbered(BATCH_SQL))
        started, cpu = time.perf_counter(), time.process_time()
        for args in batches:
            await statement.fetch(*args)
        CPU.append(time.process_time() - cpu)
        return time.perf_counter() - started
    finally:
        await conn.close()


async def run_psycopg(dsn: str, batches: list[list[Any]], sql: str = BATCH_SQL) -> float:
    """psycopg as the store uses it: parameters in binary (`%b`), the arrays encoded by the
    store (`jobwire.store.pgarrays`)."""
    conn = await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, options=f"-c search_path={SCHEMA}", prepare_threshold=0
    )
    try:
        started, cpu = time.perf_counter(), time.process_time()
        async with conn.cursor() as cur:
            for args in batches:
                await cur.execute(sql, args)
        CPU.append(time.process_time() - cpu)
        return time.perf_counter() - started
    finally:
        await conn.close()


async def run_psycopg_text(dsn: str, batches: list[list[Any]]) -> float:
    """psycopg with its parameters sent as text (`%s`)."""
    return await run_psycopg(dsn, batches, BATCH_SQL.replace("%b", "%s"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", default="postgresql://jobwire@127.0.0.1:5432/jobwire_test")
    parser.add_argument("--batch", type=int, default=500, help="rows per batch")
    parser.add_argument("--batches", type=int, default=100, help="batches per round")
    parser.add_argument("--rounds", type=int, default=5, help="A/B rounds")
    args = parser.parse_args()
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {SCHEMA}")
        admin.execute(f"SET search_path = {SCHEMA}")
        for version in range(SCHEMA_VERSION):
            for statement in MIGRATIONS[version]:
                admin.execute(statement)
    runners = (
        ("asyncpg", run_asyncpg),
        ("psycopg", run_psycopg),
        ("psycopg-text", run_psycopg_text),
    )
    results: dict[str, list[float]] = {name: [] for name, _ in runners}
    cpu: dict[str, list[float]] = {name: [] for name, _ in runners}
    next_key = 1
    try:
        for _ in range(args.rounds):
            for name, runner in runners:
                batches = []
                for _ in range(args.batches):
                    # Each batch inserts new jobs and deletes as many finished ones.
                    deletes = args.batch if next_key > args.batch else 0
                    rows = changes(next_key, args.batch, next_key - args.batch, deletes)
                    encode = typed_parameters if name == "psycopg" else list_parameters
                    batches.append(encode(rows))
                    next_key += args.batch
                seconds = asyncio.run(runner(args.dsn, batches))
                results[name].append(args.batch * args.batches / seconds)
                cpu[name].append(CPU[-1] / (args.batch * args.batches) * 1e6)
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA {SCHEMA} CASCADE")
    print(f"load: {os.getloadavg()[0]:.2f}; {args.batch} inserts + deletes per batch")
    for name, rates in results.items():
        print(
            f"{name:14} median {statistics.median(rates):9,.0f} jobs/s"
            f"  (min {min(rates):,.0f}, max {max(rates):,.0f}, {len(rates)} rounds);"
            f" client CPU {statistics.median(cpu[name]):.2f} us/job"
        )
    ratio = [a / p for a, p in zip(results["asyncpg"], results["psycopg"], strict=True)]
    print(f"asyncpg/psycopg (binary) per round: {', '.join(f'{r:.2f}' for r in ratio)}")


if __name__ == "__main__":
    main()
