"""The CPU the PostgreSQL store spends turning a batch into its statement's parameters.

    .venv/bin/python bench/pg_params.py                 # 1,000 new jobs per batch
    .venv/bin/python bench/pg_params.py --batch 200 --repeat 200

In process, no database: `batch_parameters` (changed rows into the 17 column arrays of
`BATCH_SQL`) and psycopg's conversion of those parameters to the wire format (binary, as the
store sends them: `PostgresQuery.convert` + `dump`, what `cursor.execute` does before it
sends), each in CPU microseconds per job (`time.process_time`, so other load on the machine
moves it little). Then the top functions of the dump under cProfile.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from typing import Any

from psycopg._queries import PostgresQuery
from psycopg.adapt import Transformer

from jobwire.store.postgres import BATCH_SQL, Row, batch_parameters


def new_jobs(count: int) -> dict[int, Row | None]:
    """`count` plain new jobs with empty payloads, as the store's rows."""
    now = time.time()
    plain = (0, 0, 0, None, None)  # priority, state, attempts, max_attempts, run_at
    tail = (None, None, 0, 1, None)  # reducer, ext, origin, owner, client's node
    return {
        key: (key, f"H:bench:{key}", "noop", "default", None, b"x" * 100, *plain, now, *tail)
        for key in range(1, count + 1)
    }


def dump(params: list[list[Any]]) -> None:
    query = PostgresQuery(Transformer())
    query.convert(BATCH_SQL, params)
    query.dump(params)


def per_job(run: Any, repeat: int, jobs: int) -> float:
    run()  # warm: psycopg caches its dumpers
    start = time.process_time()
    for _ in range(repeat):
        run()
    return (time.process_time() - start) / repeat / jobs * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=1000, help="new jobs per batch")
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    rows = new_jobs(args.batch)
    params = batch_parameters(rows, {})
    build = per_job(lambda: batch_parameters(rows, {}), args.repeat, args.batch)
    wire = per_job(lambda: dump(params), args.repeat, args.batch)
    print(f"{args.batch} new jobs per batch, CPU per job:")
    print(f"  batch_parameters        {build:6.2f} us")
    print(f"  psycopg convert + dump  {wire:6.2f} us")
    profile = cProfile.Profile()
    profile.runcall(lambda: [dump(params) for _ in range(10)])
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(6)
    print(out.getvalue().split("\n\n", 2)[-1].rstrip())


if __name__ == "__main__":
    main()
