# mypy: disable-error-code="comparison-overlap"
"""Observers, expiry, revive and the event log, on a fake clock."""

from __future__ import annotations

import pytest

from jobwire.engine import Dispatch, IllegalTransition, JobState
from jobwire.engine.events import EventLog
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
