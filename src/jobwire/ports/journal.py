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
    from jobwire.ports.store import Store


class Journal:
    """The engine-facing half of a store: told of every job change (see `jobwire.ports`)."""

    #: The engine calls nothing of a journal that is not durable.
    durable = True

    def job_saved(self, job: Job) -> None:
        raise NotImplementedError

    def job_removed(self, job: Job) -> None:
        raise NotImplementedError

    def numbers_reserved(self, ceiling: int) -> None:
        """Job numbers up to `ceiling` may be given out: keep it, for the engine's replay
        (`Engine.replay`), so that no id is given twice. Durable with the next commit."""


class StoreJournal(Journal):
    """A store that is not a `Journal`: its hooks, bound once."""

    def __init__(self, store: Store) -> None:
        self._saved: Callable[[Job], None] = store.job_saved
        self._removed: Callable[[Job], None] = store.job_removed
        self._store = store

    def job_saved(self, job: Job) -> None:
        self._saved(job)

    def job_removed(self, job: Job) -> None:
        self._removed(job)

    def numbers_reserved(self, ceiling: int) -> None:
        self._store.numbers_reserved(ceiling)


def journal_of(store: Journal | Store) -> Journal:
    return store if isinstance(store, Journal) else StoreJournal(store)
