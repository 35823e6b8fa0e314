"""A small durable key-value API beside the jobs: cron registrations, workflow records.

Stores that can keep such records implement `KeyValueStore` (the SQLite store does, in its
`kv` table, through the same group commit as jobs, so `after_commit` covers them too). The
memory store does not: with it, nothing outlives the process anyway. Values are bytes owned
by their namespace (JSON in practice).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class KeyValueStore(Protocol):
    def kv_load(self, namespace: str) -> dict[str, bytes]:
        """Every record of `namespace`; call at start-up, before the first write."""

    def kv_put(self, namespace: str, key: str, value: bytes | None) -> None:
        """Insert or replace a record (None deletes it); durable with the next commit."""


def key_value_store(store: object) -> KeyValueStore | None:
    """The store's key-value API, or None when it has none (the memory store)."""
    return store if isinstance(store, KeyValueStore) else None
