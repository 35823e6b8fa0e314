"""The job record (engine/job.py)."""

from __future__ import annotations

import gc
from collections.abc import Callable

import pytest

from jobwire import native
from jobwire.engine import PRIORITY_HIGH, PRIORITY_LOW, PRIORITY_NORMAL, Engine, Job, JobState
from jobwire.engine.job import TERMINAL_STATES
from tests.engine.fakes import Harness, RecordingSubscriber


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


def test_a_compiled_job_is_not_tracked_by_the_cyclic_gc() -> None:
    """Compiled, queued jobs cost the collector nothing (`@mypyc_attr(acyclic=True)`); the
    interpreted class is an ordinary tracked object."""
    compiled = native.status().startswith("compiled")
    assert gc.is_tracked(Job("H:1", "f", b"")) is not compiled


ENDINGS: dict[str, Callable[[Engine, Job], None]] = {
    "complete": lambda engine, job: engine.complete(job, b"ok"),
    "fail": lambda engine, job: engine.fail(job),
    "exception": lambda engine, job: engine.fail(job, b"boom", detail=b"boom"),
    "cancel": lambda engine, job: engine.cancel(job),
}


@pytest.mark.parametrize("ending", ENDINGS)
def test_an_ended_job_keeps_no_link_back_to_its_worker_or_client(h: Harness, ending: str) -> None:
    """What makes a Job acyclic: the references that lead back to it (its worker's jobs,
    its waiting client) are cut when it ends, so no garbage cycle runs through a job."""
    worker = h.worker("f")
    client = RecordingSubscriber()
    job, _ = h.engine.submit("f", b"", background=False, subscriber=client)
    assert h.engine.grab(worker.session) is job
    assert (job.worker, job.subscribers) == (worker.session, [client])
    ENDINGS[ending](h.engine, job)
    assert (job.worker, job.subscribers) == (None, None)
    assert job.id not in worker.session.jobs


def test_a_job_whose_client_and_worker_left_keeps_no_link_back(h: Harness) -> None:
    worker = h.worker("f")
    client = RecordingSubscriber()
    job, _ = h.engine.submit("f", b"", subscriber=client)  # background: it outlives the client
    assert h.engine.grab(worker.session) is job
    h.engine.unsubscribe(job, client)
    h.engine.remove_worker(worker.session)
    assert (job.worker, job.subscribers) == (None, None)
