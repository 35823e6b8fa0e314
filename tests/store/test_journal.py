"""The engine's job hooks: a durable store's own, or any store's through a wrapper."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobwire.engine.engine import Engine
from jobwire.engine.job import Job
from jobwire.ports import Journal, StoreJournal, journal_of
from jobwire.store.base import MemoryStore
from jobwire.store.sqlite import SQLiteStore


class RecordingStore(MemoryStore):
    """A store that is not a Journal: it only records what the engine tells it."""

    durable = True

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def job_saved(self, job: Job) -> None:
        self.events.append(("saved", job.id))

    def job_removed(self, job: Job) -> None:
        self.events.append(("removed", job.id))


def test_a_store_compiled_with_the_engine_is_its_own_journal(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "jobs.db", fsync="off")
    try:
        assert journal_of(store) is store
    finally:
        store.close()


def test_any_other_store_hears_of_each_job_through_a_wrapper() -> None:
    store = RecordingStore()
    assert isinstance(journal_of(store), StoreJournal)
    engine = Engine(journal=store)
    job, _ = engine.enqueue("resize", b"x")
    engine.cancel(job)
    assert store.events == [("saved", job.id), ("removed", job.id)]


def test_the_base_journal_has_no_hooks_of_its_own() -> None:
    job = Job("H:1", "resize", b"", None, None, 0, True, 0.0)
    with pytest.raises(NotImplementedError):
        Journal().job_saved(job)
    with pytest.raises(NotImplementedError):
        Journal().job_removed(job)
