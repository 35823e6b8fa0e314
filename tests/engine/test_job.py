"""The job record (engine/job.py)."""

from __future__ import annotations

from jobwire.engine import PRIORITY_HIGH, PRIORITY_LOW, PRIORITY_NORMAL, Job, JobState
from jobwire.engine.job import TERMINAL_STATES
from tests.engine.fakes import Harness


def test_defaults() -> None:
    job = Job("H:1", "reverse", b"data")
    assert (job.id, job.function, job.queue, job.payload) == ("H:1", "reverse", "reverse", b"data")
    assert job.state is JobState.AVAILABLE
    assert job.priority == PRIORITY_NORMAL
    assert job.background
    assert job.attempts == 0
    assert job.max_attempts is None
    assert job.subscribers is None
    assert job.ext is None
    assert repr(job) == "<Job H:1 reverse AVAILABLE attempts=0>"


def test_explicit_queue() -> None:
    assert Job("H:1", "email", b"", queue="mail").queue == "mail"
    assert Job("H:1", "email", b"", queue="").queue == ""


def test_priority_levels() -> None:
    assert PRIORITY_HIGH > PRIORITY_NORMAL > PRIORITY_LOW


def test_terminal_states() -> None:
    assert {state for state in JobState if state.terminal} == TERMINAL_STATES
    assert {JobState.COMPLETED, JobState.CANCELLED, JobState.DISCARDED} == TERMINAL_STATES


def test_retries_count_returns_to_the_queue(h: Harness) -> None:
    worker = h.worker("f")
    job, _ = h.engine.submit("f", b"")
    assert job.retries == 0  # never handed out
    assert h.engine.grab(worker.session) is job
    assert job.retries == 0  # first attempt running
    h.engine.remove_worker(worker.session)
    assert job.state is JobState.AVAILABLE
    assert job.retries == 1  # went back once
    worker = h.worker("f")
    assert h.engine.grab(worker.session) is job
    assert job.retries == 1  # second attempt running
    h.engine.complete(job, b"")
    assert job.retries == 1  # finished on its second attempt
