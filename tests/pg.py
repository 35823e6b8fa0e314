"""The local PostgreSQL the tests use: a schema (and a login role) of their own per test.

`.ci/run` creates the role `jobwire` and the database `jobwire_test` (idempotently). Each
test makes a schema there, owned by a role made for it, points its store at that schema
(`?options=-csearch_path%3D...`), and drops both at the end: no test touches another
database or another test's tables. Set JOBWIRE_TEST_PG to use another database; the
admin connection (creating roles, killing backends) is the superuser `postgres` on it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

#: The database the tests work in, as the role `jobwire`.
BASE = os.environ.get("JOBWIRE_TEST_PG", "postgresql://jobwire@127.0.0.1:5432/jobwire_test")


def _as_user(dsn: str, user: str) -> str:
    parts = urlsplit(dsn)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}@{host}"))


ADMIN = _as_user(BASE, "postgres")


def admin(sql: str, *args: object) -> list[tuple[object, ...]]:
    """Run one statement as the superuser, in the tests' database; its rows."""
    with psycopg.connect(ADMIN, autocommit=True, connect_timeout=10) as conn:
        cur = conn.execute(sql.encode(), args or None)  # type: ignore[call-overload]
        return cur.fetchall() if cur.description else []


@dataclass
class Schema:
    """A schema and its owner role; `dsn` points a store at it as that role."""

    name: str
    role: str

    @property
    def dsn(self) -> str:
        return f"{_as_user(BASE, self.role)}?options=-csearch_path%3D{self.name}"

    def terminate(self) -> int:
        """Kill every backend of this schema's role (`pg_terminate_backend`), waiting until they
        are gone: how many."""
        rows = admin(
            "SELECT count(pg_terminate_backend(pid, 10000)) FROM pg_stat_activity"
            " WHERE usename = %s",
            self.role,
        )
        return int(rows[0][0])  # type: ignore[call-overload]

    def go_away(self) -> None:
        """As if PostgreSQL went away for this role: no new login, every backend killed."""
        admin(f"ALTER ROLE {self.role} NOLOGIN")
        self.terminate()

    def come_back(self) -> None:
        admin(f"ALTER ROLE {self.role} LOGIN")

    def rows(self, sql: str) -> list[tuple[object, ...]]:
        return admin(sql.replace("{schema}", self.name))


def reachable() -> str | None:
    """None, or why the tests' PostgreSQL cannot be used."""
    try:
        admin("SELECT 1")
    except psycopg.Error as exc:
        return f"PostgreSQL for the tests ({ADMIN}) is not reachable: {exc}"
    return None


@contextmanager
def new_schema() -> Iterator[Schema]:
    problem = reachable()
    if problem is not None:
        pytest.fail(f"{problem}; .ci/run sets it up")
    tag = uuid.uuid4().hex[:12]
    schema = Schema(f"jwt_{tag}", f"jwt_{tag}")
    admin(f"CREATE ROLE {schema.role} LOGIN")
    admin(f"CREATE SCHEMA {schema.name} AUTHORIZATION {schema.role}")
    try:
        yield schema
    finally:
        admin(f"ALTER ROLE {schema.role} NOLOGIN")
        schema.terminate()
        admin(f"DROP SCHEMA {schema.name} CASCADE")
        admin(f"DROP ROLE {schema.role}")


@pytest.fixture
def pg_schema() -> Iterator[Schema]:
    with new_schema() as schema:
        yield schema
