# mypy: disable-error-code="comparison-overlap"
# (state assertions follow a job through transitions mypy cannot see)
"""Leases, lost workers, retries with backoff, and scheduled jobs, on a fake clock."""

from __future__ import annotations

import pytest

from jobwire.engine import (
    PRIORITY_HIGH,
    Dispatch,
    IllegalTransition,
    Job,
    JobState,
)
from tests.engine.fakes import START, Harness, RecordingSubscriber, Told

# ---------------------------------------------------------------------- lease expiry


def test_can_do_timeout_sets_a_lease(h: Harness) -> None:
    w = h.worker("f", timeout=5)
    job, _ = h.engine.submit("f", b"")
    assert h.engine.grab(w.session) is job
    assert job.lease_deadline == START + 5
    assert h.engine.timers.next_deadline() == START + 5


def test_lease_expiry_requeues_and_revokes(h: Harness) -> None:
    client = RecordingSubscriber()
    w = h.worker("f", timeout=5)
    job, _ = h.engine.submit("f", b"", background=False, subscriber=client)
    assert h.engine.grab(w.session) is job
    h.advance(4.999)
    assert job.state is JobState.ACTIVE
    assert w.handler.revoked == []
    h.advance(0.001)
    assert job.state is JobState.AVAILABLE
    assert job.error == "lease expired"
    assert job.lease_deadline is None
    assert job.worker is None
    assert w.session.jobs == {}
    assert w.handler.revoked == [(job, "lease expired")]
    assert client.events == []  # gearmand tells clients nothing on CAN_DO_TIMEOUT
    assert h.engine.functions["f"].running == 0
    assert h.engine.grab(w.session) is job
    assert job.attempts == 2


def test_late_result_after_expiry_is_not_held(h: Harness) -> None:
    w = h.worker("f", timeout=1)
    job, _ = h.engine.submit("f", b"")
    assert h.engine.grab(w.session) is job
    h.advance(1)
    with pytest.raises(IllegalTransition):
        h.engine.complete(job, b"late")
    with pytest.raises(Exception, match="not found"):
        h.engine.held_job(w.session, job.id)


def test_expired_job_goes_back_to_the_front(h: Harness) -> None:
    w = h.worker("f", timeout=5)
    first, _ = h.engine.submit("f", b"first")
    assert h.engine.grab(w.session) is first
    h.engine.submit("f", b"second")
    h.advance(5)
    job = h.engine.grab(w.session)
    assert job is first


def test_extend_lease_moves_the_deadline(h: Harness) -> None:
    w = h.worker("f", timeout=5)
    job, _ = h.engine.submit("f", b"")
    assert h.engine.grab(w.session) is job
    h.advance(4)
    h.engine.extend_lease(job, 5)
    assert job.lease_deadline == START + 9
    h.advance(1)  # the old deadline passes harmlessly
    assert job.state is JobState.ACTIVE
    h.advance(4)
    assert job.state is JobState.AVAILABLE


def test_extend_lease_of_a_job_that_is_not_active_is_ignored(h: Harness) -> None:
    job, _ = h.engine.submit("f", b"")
    h.engine.extend_lease(job, 5)
    assert job.lease_deadline is None
    assert len(h.engine.timers) == 0


def test_completed_job_is_untouched_by_its_old_timer(h: Harness) -> None:
    w = h.worker("f", timeout=5)
    job, _ = h.engine.submit("f", b"")
    assert h.engine.grab(w.session) is job
    h.engine.complete(job, b"")
    h.advance(5)
    assert job.state is JobState.COMPLETED
    assert w.handler.revoked == []


def test_regrabbed_job_is_untouched_by_the_first_lease_timer(h: Harness) -> None:
    first_worker = h.worker("f", timeout=5)
    job, _ = h.engine.submit("f", b"")
    assert h.engine.grab(first_worker.session) is job
    h.advance(2)
    h.engine.remove_worker(first_worker.session)
    second = h.worker("f", timeout=5)
    assert h.engine.grab(second.session) is job
    h.advance(3)  # the first lease's deadline
    assert job.state is JobState.ACTIVE
    assert job.worker is second.session
    h.advance(2)
    assert job.state is JobState.AVAILABLE
    assert second.handler.revoked == [(job, "lease expired")]


def test_submit_lease_timeout_beats_the_ability_timeout(h: Harness) -> None:
    w = h.worker("f", timeout=60)
    job, _ = h.engine.submit("f", b"", lease_timeout=2)
    assert h.engine.grab(w.session) is job
    assert job.lease_deadline == START + 2


def test_no_timeout_means_no_lease(h: Harness) -> None:
    w = h.worker("f")
    job, _ = h.engine.submit("f", b"")
    assert h.engine.grab(w.session) is job
    assert job.lease_deadline is None
    assert h.advance(10**6) is None
    assert job.state is JobState.ACTIVE


def test_job_retries_exhausted_by_lease_expiry_discards() -> None:
    h = Harness(job_retries=2)
    client = RecordingSubscriber()
    w = h.worker("f", timeout=1)
    job, _ = h.engine.submit("f", b"", background=False, subscriber=client)
    assert job.max_attempts == 2
    assert h.engine.grab(w.session) is job
    h.advance(1)
    assert job.state is JobState.AVAILABLE
    assert h.engine.grab(w.session) is job
    h.advance(1)
    assert job.state is JobState.DISCARDED
    assert client.events == [(job.id, Told.FAIL, b"")]
    assert job.id not in h.engine.jobs
    assert h.engine.functions["f"].total == 0
    assert [reason for _, reason in w.handler.revoked] == ["lease expired", "lease expired"]


def test_revoke_comes_before_the_job_is_offered_again() -> None:
    # A push worker with spare credit must not be handed its expired job before the revoke.
    h = Harness()
    w = h.worker("f", dispatch=Dispatch.PUSH)
    job, _ = h.engine.submit("f", b"", lease_timeout=5)
    h.engine.request_work(w.session, 2)
    assert w.handler.calls == [("assign", job.id)]
    h.advance(5)
    assert w.handler.calls == [("assign", job.id), ("revoke", job.id), ("assign", job.id)]
    assert job.state is JobState.ACTIVE
    assert job.worker is w.session
    assert job.attempts == 2


# ---------------------------------------------------------------------- lost workers


def test_remove_worker_requeues_held_jobs_at_the_front(h: Harness) -> None:
    w = h.worker("f")
    a, _ = h.engine.submit("f", b"a")
    h.engine.submit("f", b"b")
    h.engine.submit("f", b"c")
    assert h.engine.grab(w.session) is a
    h.engine.remove_worker(w.session)
    assert a.state is JobState.AVAILABLE
    assert a.error == "worker lost"
    assert a.attempts == 1
    other = h.worker("f")
    order = []
    while (job := h.engine.grab(other.session)) is not None:
        order.append(job.payload)
        h.engine.complete(job, b"")
    assert order == [b"a", b"b", b"c"]
    assert a.attempts == 2


def test_remove_worker_keeps_the_order_of_several_held_jobs(h: Harness) -> None:
    w = h.worker("f")
    for name in (b"a", b"b", b"c", b"d"):
        h.engine.submit("f", name)
    assert h.engine.grab(w.session) is not None
    assert h.engine.grab(w.session) is not None
    assert h.engine.grab(w.session) is not None
    h.engine.remove_worker(w.session)
    other = h.worker("f")
    order = []
    while (job := h.engine.grab(other.session)) is not None:
        order.append(job.payload)
    assert order == [b"a", b"b", b"c", b"d"]


@pytest.mark.parametrize("first_lost", [0, 1])
def test_jobs_of_two_lost_workers_keep_their_order(h: Harness, first_lost: int) -> None:
    workers = [h.worker("f"), h.worker("f")]
    for name in (b"a", b"b", b"c"):
        h.engine.submit("f", name)
    assert h.engine.grab(workers[0].session) is not None
    assert h.engine.grab(workers[1].session) is not None
    h.engine.remove_worker(workers[first_lost].session)
    h.engine.remove_worker(workers[1 - first_lost].session)
    other = h.worker("f")
    order = []
    while (job := h.engine.grab(other.session)) is not None:
        order.append(job.payload)
    assert order == [b"a", b"b", b"c"]


def test_requeued_job_keeps_its_priority(h: Harness) -> None:
    w = h.worker("f")
    h.engine.submit("f", b"normal")
    high, _ = h.engine.submit("f", b"high", priority=PRIORITY_HIGH)
    assert h.engine.grab(w.session) is high
    h.engine.submit("f", b"high2", priority=PRIORITY_HIGH)
    h.engine.remove_worker(w.session)
    other = h.worker("f")
    order = []
    while (job := h.engine.grab(other.session)) is not None:
        order.append(job.payload)
    assert order == [b"high", b"high2", b"normal"]


def test_requeue_wakes_a_sleeper(h: Harness) -> None:
    w = h.worker("f")
    sleeper = h.worker("f")
    h.engine.submit("f", b"")
    assert h.engine.grab(w.session) is not None
    assert h.engine.sleep(sleeper.session) is False
    h.engine.remove_worker(w.session)
    assert sleeper.handler.wakes == 1


def test_lost_worker_with_retries_exhausted_fails_the_job() -> None:
    h = Harness(job_retries=1)
    client = RecordingSubscriber()
    w = h.worker("f")
    job, _ = h.engine.submit("f", b"", background=False, subscriber=client)
    assert h.engine.grab(w.session) is job
    h.engine.remove_worker(w.session)
    assert job.state is JobState.DISCARDED
    assert job.error == "worker lost"
    assert client.events == [(job.id, Told.FAIL, b"")]
    assert h.engine.functions["f"].total == 0


def test_job_retries_zero_means_no_retry() -> None:
    h = Harness(job_retries=0)
    w = h.worker("f")
    job, _ = h.engine.submit("f", b"")
    assert h.engine.grab(w.session) is job
    h.engine.remove_worker(w.session)
    assert job.state is JobState.DISCARDED


def test_max_attempts_per_job_beats_the_server_default() -> None:
    h = Harness(job_retries=1)
    w = h.worker("f")
    job, _ = h.engine.submit("f", b"", max_attempts=3)
    assert job.max_attempts == 3
    for _ in range(2):
        assert h.engine.grab(w.session) is job
        h.engine.remove_worker(w.session)
        w = h.worker("f")
        assert job.state is JobState.AVAILABLE
    assert h.engine.grab(w.session) is job
    h.engine.remove_worker(w.session)
    assert job.state is JobState.DISCARDED


def test_unlimited_attempts_by_default(h: Harness) -> None:
    job, _ = h.engine.submit("f", b"")
    for _ in range(50):
        w = h.worker("f")
        assert h.engine.grab(w.session) is job
        h.engine.remove_worker(w.session)
    assert job.state is JobState.AVAILABLE
    assert job.attempts == 50


# ---------------------------------------------------------------------- retries with backoff


def test_fail_without_retry_discards(h: Harness) -> None:
    w = h.worker("f")
    job, _ = h.engine.submit("f", b"")
    assert h.engine.grab(w.session) is job
    h.engine.fail(job, "nope")
    assert job.state is JobState.DISCARDED


def test_fail_with_retry_and_no_backoff_requeues_at_once(h: Harness) -> None:
    w = h.worker("f")
    job, _ = h.engine.submit("f", b"")
    assert h.engine.grab(w.session) is job
    h.engine.fail(job, "transient", retry=True)
    assert job.state is JobState.AVAILABLE
    assert job.error == "transient"
    assert h.engine.grab(w.session) is job


def test_retry_after_schedules_the_next_attempt(h: Harness) -> None:
    delays: list[int] = []

    def backoff(job: Job) -> float:  # a protocol's retry policy, as OJS's
        delays.append(job.attempts)
        return 2.0**job.attempts

    client = RecordingSubscriber()
    w = h.worker("f")
    job, _ = h.engine.submit("f", b"", max_attempts=3, background=False, subscriber=client)
    assert h.engine.grab(w.session) is job
    h.engine.fail(job, retry=True, retry_after=backoff(job))
    assert job.state is JobState.RETRYABLE
    assert job.error == "failed"
    assert job.run_at == START + 2
    fn = h.engine.functions["f"]
    assert (fn.scheduled, fn.available, fn.running, fn.total) == (1, 0, 0, 1)
    assert h.engine.grab(w.session) is None
    assert h.advance(1.999) == START + 2
    assert job.state is JobState.RETRYABLE
    h.advance(0.001)
    assert job.state is JobState.AVAILABLE
    assert job.run_at is None
    assert fn.scheduled == 0
    assert h.engine.grab(w.session) is job
    h.engine.fail(job, "again", retry=True, retry_after=backoff(job))
    assert job.run_at == h.clock.now + 4
    h.advance(4)
    assert h.engine.grab(w.session) is job
    assert job.attempts == 3
    h.engine.fail(job, "last", retry=True, retry_after=backoff(job))  # attempts exhausted
    assert job.state is JobState.DISCARDED
    assert delays == [1, 2, 3]
    assert client.events == [(job.id, Told.FAIL, b"")]


def test_retry_due_wakes_a_sleeper(h: Harness) -> None:
    w = h.worker("f")
    job, _ = h.engine.submit("f", b"")
    assert h.engine.grab(w.session) is job
    h.engine.fail(job, retry=True, retry_after=10.0)
    assert h.engine.sleep(w.session) is False
    h.advance(10)
    assert w.handler.wakes == 1


def test_lease_expiry_requeues_at_once_at_the_front(h: Harness) -> None:
    w = h.worker("f", timeout=1)
    job, _ = h.engine.submit("f", b"")
    h.engine.submit("f", b"")  # queued after `job`
    assert h.engine.grab(w.session) is job
    h.advance(1)
    assert job.state is JobState.AVAILABLE
    assert job.run_at is None
    assert h.engine.grab(w.session) is job  # it keeps its place ahead of `later`


# ---------------------------------------------------------------------- scheduled jobs


def test_scheduled_job_becomes_available_exactly_at_run_at(h: Harness) -> None:
    w = h.worker("f")
    job, _ = h.engine.submit("f", b"later", run_at=START + 10)
    assert job.state is JobState.SCHEDULED
    assert job.run_at == START + 10
    fn = h.engine.functions["f"]
    assert (fn.scheduled, fn.available, fn.total) == (1, 0, 1)
    assert h.engine.sleep(w.session) is False  # nothing runnable yet: no busy loop
    assert h.advance(9.999) == START + 10
    assert job.state is JobState.SCHEDULED
    assert w.handler.wakes == 0
    # What remains is the check that the woken worker took the job (wake-up fallback).
    assert h.advance(0.001) == START + 10 + h.engine.config.wakeup_fallback
    assert job.state is JobState.AVAILABLE
    assert w.handler.wakes == 1
    assert h.engine.grab(w.session) is job


def test_scheduled_jobs_fire_in_time_order(h: Harness) -> None:
    w = h.worker("f")
    h.engine.submit("f", b"30", run_at=START + 30)
    h.engine.submit("f", b"10", run_at=START + 10)
    h.engine.submit("f", b"20", run_at=START + 20)
    assert h.engine.run_timers() == START + 10
    assert h.advance(100) is None
    order = []
    while (job := h.engine.grab(w.session)) is not None:
        order.append(job.payload)
    assert order == [b"10", b"20", b"30"]


def test_run_at_now_or_past_is_available_at_once(h: Harness) -> None:
    now, _ = h.engine.submit("f", b"", run_at=START)
    past, _ = h.engine.submit("f", b"", run_at=START - 100)
    assert now.state is JobState.AVAILABLE
    assert past.state is JobState.AVAILABLE
    assert len(h.engine.timers) == 0


def test_scheduled_job_coalesces(h: Harness) -> None:
    job, _ = h.engine.submit("f", b"", unique="u", run_at=START + 10)
    same, created = h.engine.submit("f", b"", unique="u")
    assert same is job and not created
    assert job.state is JobState.SCHEDULED


def test_run_timers_without_timers(h: Harness) -> None:
    assert h.engine.run_timers() is None
