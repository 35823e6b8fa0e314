"""The `kind` fixture: each test of test_stores.py runs on memory, SQLite and PostgreSQL."""

from tests.store.kinds import kind

__all__ = ["kind"]
