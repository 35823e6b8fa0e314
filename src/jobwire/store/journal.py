"""Where the engine writes each job change: a durable store's hooks, called natively.

A durable store hears of every job the engine creates, takes or finishes. Called through the
`Store` protocol, that is a Python-level method call (a bound method, its argument parsing)
for every job: some 200 instructions of a durable enqueue's 5,400 per job. A store compiled
with the engine (`jobwire.native`) subclasses `Journal`, and the engine's calls go straight
to it; any other store is wrapped in a `StoreJournal`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jobwire.engine.job import Job
    from jobwire.store.base import Store


class Journal:
    """The engine's job hooks (see `jobwire.store.base.Store`)."""

    def job_saved(self, job: Job) -> None:
        raise NotImplementedError

    def job_removed(self, job: Job) -> None:
        raise NotImplementedError


class StoreJournal(Journal):
    """A store that is not a `Journal`: its hooks, bound once."""

    def __init__(self, store: Store) -> None:
        self._saved: Callable[[Job], None] = store.job_saved
        self._removed: Callable[[Job], None] = store.job_removed

    def job_saved(self, job: Job) -> None:
        self._saved(job)

    def job_removed(self, job: Job) -> None:
        self._removed(job)


def journal_of(store: Store) -> Journal:
    return store if isinstance(store, Journal) else StoreJournal(store)
