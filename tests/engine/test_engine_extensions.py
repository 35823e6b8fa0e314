# mypy: disable-error-code="comparison-overlap"
"""Observers, expiry, revive, and the engine-side modules: event log, dead letter, worker
liveness, rate limits. All on a fake clock."""

from __future__ import annotations

import pytest

from jobwire.engine import Dispatch, IllegalTransition, JobState, UnknownJob
from jobwire.engine.deadletter import DeadLetter
from jobwire.engine.events import EventLog
from jobwire.engine.liveness import WorkerLiveness
from jobwire.engine.ratelimit import QueueRateLimits
from tests.engine.fakes import START, Harness


def record(h: Harness) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    h.engine.observers.append(lambda event, job: seen.append((event, job.id)))
    return seen


def test_observers_see_every_transition(h: Harness) -> None:
    seen = record(h)
    w = h.worker("f", dispatch=Dispatch.PULL)
    job, _ = h.engine.submit("f", b"", max_attempts=2)
    assert h.engine.grab(w.session) is job
    h.engine.fail(job, "boom", retry=True)
    assert h.engine.grab(w.session) is job
    h.engine.complete(job, b"ok")
    later, _ = h.engine.submit("f", b"", run_at=START + 10)
    h.engine.cancel(later)
    assert [e for e, _ in seen] == [
        "job.enqueued",
        "job.started",
        "job.retrying",
        "job.started",
        "job.completed",
        "job.scheduled",
        "job.cancelled",
    ]


def test_a_failing_observer_does_not_undo_the_transition(h: Harness) -> None:
    def broken(event: str, job: object) -> None:
        raise RuntimeError("observer bug")

    h.engine.observers.append(broken)
    job, _ = h.engine.submit("f", b"")
    assert job.state is JobState.AVAILABLE


def test_expire_discards_a_waiting_job_but_not_a_running_one(h: Harness) -> None:
    w = h.worker("f", dispatch=Dispatch.PULL)
    waiting, _ = h.engine.submit("f", b"a")
    running, _ = h.engine.submit("f", b"b")
    scheduled, _ = h.engine.submit("f", b"c", run_at=START + 60)
    assert h.engine.grab(w.session) is waiting  # oldest first
    h.engine.expire(running)
    h.engine.expire(scheduled)
    assert running.state is JobState.DISCARDED
    assert scheduled.state is JobState.DISCARDED
    assert h.engine.functions["f"].total == 1  # only the held one is counted
    with pytest.raises(IllegalTransition):
        h.engine.expire(waiting)
    assert h.engine.grab(w.session) is None
    h.advance(61)
    assert h.engine.grab(w.session) is None


def test_revive_puts_a_discarded_job_back_with_attempts_from_zero() -> None:
    h = Harness(retain_finished=10)
    w = h.worker("f", dispatch=Dispatch.PULL)
    job, _ = h.engine.submit("f", b"x", max_attempts=1)
    assert h.engine.grab(w.session) is job
    h.engine.fail(job, "boom", retry=True)
    assert job.state is JobState.DISCARDED
    fresh = h.engine.revive(job)
    assert fresh.id == job.id
    assert fresh.state is JobState.AVAILABLE
    assert fresh.attempts == 0
    assert h.engine.jobs[job.id] is fresh
    h.advance(11)  # the finished record's retention ends: the live job stays
    assert h.engine.jobs[job.id] is fresh
    assert h.engine.grab(w.session) is fresh
    with pytest.raises(IllegalTransition):
        h.engine.revive(fresh)


def test_event_log_keeps_the_newest_and_filters(h: Harness) -> None:
    log = EventLog(3, clock=h.clock)
    h.engine.observers.append(log.observe)
    for queue in ("a", "b", "a"):
        h.engine.submit("f", b"", queue=queue)
    log.record("cron.triggered", "nightly", "a", {})
    events = log.query()
    assert len(events) == 3  # the first was dropped
    assert [e.type for e in log.query(types={"job.enqueued"})] == ["job.enqueued"] * 2
    assert [e.queue for e in log.query(queues={"a"})] == ["a", "a"]
    first = events[0].seq
    assert [e.seq for e in log.query(after=first, limit=1)] == [first + 1]
    assert events[0].data["job_type"] == "f"


def test_dead_letter_keeps_wanted_discards_and_retries_them(h: Harness) -> None:
    dead = DeadLetter(h.engine, wants=lambda job: job.queue == "dlq")
    h.engine.observers.append(dead.observe)
    w = h.worker("f", dispatch=Dispatch.PULL)
    kept, _ = h.engine.submit("f", b"", queue="dlq", max_attempts=1)
    other, _ = h.engine.submit("f", b"", queue="plain", max_attempts=1)
    for job in (kept, other):
        assert h.engine.fetch([job.queue], 1, worker=w.session) == [job]
        h.engine.fail(job, "boom")
    assert [j.id for j in dead.jobs()] == [kept.id]
    revived = dead.retry(kept.id)
    assert revived.state is JobState.AVAILABLE
    assert len(dead) == 0
    with pytest.raises(UnknownJob):
        dead.delete(kept.id)


def test_dead_letter_delete_forgets_the_job() -> None:
    h = Harness(retain_finished=60)
    dead = DeadLetter(h.engine, wants=lambda job: True)
    h.engine.observers.append(dead.observe)
    job, _ = h.engine.submit("f", b"")
    h.engine.expire(job)
    assert job.id in dead
    dead.delete(job.id)
    assert job.id not in h.engine.jobs


def test_a_worker_that_stops_beating_is_removed_and_its_jobs_requeued(h: Harness) -> None:
    dead = []
    liveness = WorkerLiveness(h.engine, 30, on_dead=dead.append)
    w = h.worker("f", dispatch=Dispatch.PULL)
    job, _ = h.engine.submit("f", b"")
    assert h.engine.grab(w.session) is job
    liveness.beat(w.session)
    h.advance(20)
    liveness.beat(w.session)  # pushes the deadline to START + 50
    h.advance(20)
    assert job.state is JobState.ACTIVE
    h.advance(10)
    assert dead == [w.session]
    assert job.state is JobState.AVAILABLE
    assert job.attempts == 1  # the lost attempt counts
    assert job.error == "worker lost"


def test_rate_limit_window() -> None:
    limits = QueueRateLimits()
    assert limits.allowance("q", 0.0) is None
    limits.set("q", 2)
    assert limits.allowance("q", 0.0) == 2
    limits.taken("q", 2, 0.0)
    assert limits.allowance("q", 0.5) == 0
    assert limits.allowance("q", 1.0) == 2
    limits.set("q", None)
    assert limits.allowance("q", 1.0) is None
