# mypy: disable-error-code="comparison-overlap"
# (state assertions follow a job through transitions mypy cannot see)
"""The engine's job lifecycle: submit, grab, priorities, coalescing, subscribers, cancel,
limits, functions, retention, worker state and replay (engine/engine.py)."""

from __future__ import annotations

import socket
from collections.abc import Iterable

import pytest

from jobwire.engine import (
    PRIORITY_HIGH,
    PRIORITY_LOW,
    PRIORITY_NORMAL,
    Engine,
    IllegalTransition,
    Job,
    JobNotHeld,
    JobState,
    Output,
    QueueFull,
    WorkerSession,
    WorkerState,
)
from jobwire.ports import StoredJob
from tests.engine.fakes import START, Harness, RecordingSubscriber, Told


def drain(h: Harness, worker: WorkerSession) -> list[bytes]:
    """Grab and complete everything the worker can get; return the payloads in order."""
    payloads = []
    while (job := h.engine.grab(worker)) is not None:
        payloads.append(job.payload)
        h.engine.complete(job, b"")
    return payloads


def submit_all(h: Harness, function: str, payloads: Iterable[bytes]) -> None:
    for payload in payloads:
        h.engine.submit(function, payload)


# ---------------------------------------------------------------------- submit and grab


def test_submit_creates_an_available_job(h: Harness) -> None:
    job, created = h.engine.submit("reverse", b"hello")
    assert created
    assert job.id == "H:test:1"
    assert job.state is JobState.AVAILABLE
    assert (job.function, job.queue, job.payload) == ("reverse", "reverse", b"hello")
    assert job.created_at == START
    assert job.attempts == 0
    assert h.engine.jobs[job.id] is job
    fn = h.engine.functions["reverse"]
    assert (fn.available, fn.running, fn.total) == (1, 0, 1)


def test_enqueue_stamps_jobs_with_the_time_of_their_read_or_the_clock(h: Harness) -> None:
    arrived = START - 0.25  # the read that brought the submits, a little earlier
    job, _ = h.engine.enqueue("f", b"", PRIORITY_NORMAL, True, None, None, arrived)
    assert job.created_at == arrived
    job, _ = h.engine.enqueue("f", b"")
    assert job.created_at == START


def test_handles_count_up_globally(h: Harness) -> None:
    ids = [h.engine.submit(name, b"")[0].id for name in ("a", "b", "a")]
    assert ids == ["H:test:1", "H:test:2", "H:test:3"]


def test_handles_are_the_prefix_and_the_number_across_blocks_of_a_thousand(h: Harness) -> None:
    # Numbers from 1000 on are built from a block's head and three digits (`next_id`).
    ids = [h.engine.next_id() for _ in range(3003)]
    assert ids == [f"H:test:{number}" for number in range(1, 3004)]


def test_handles_follow_a_counter_moved_by_a_restore(h: Harness) -> None:
    h.engine.next_id()  # a block head is made for neither of these: below 1000
    h.engine.restore([restored_job("H:test:1999")])
    assert [h.engine.next_id() for _ in range(2)] == ["H:test:2000", "H:test:2001"]
    h.engine.restore([restored_job("H:test:12345")])
    assert h.engine.next_id() == "H:test:12346"
    h.engine.restore([restored_job("H:test:5000999")])
    assert [h.engine.next_id() for _ in range(2)] == ["H:test:5001000", "H:test:5001001"]


def test_default_id_prefix_is_the_hostname() -> None:
    assert Engine().next_id() == f"H:{socket.gethostname()}:1"


def test_explicit_job_id(h: Harness) -> None:
    job, _ = h.engine.submit("f", b"", job_id="custom-1")
    assert job.id == "custom-1"
    assert h.engine.jobs["custom-1"] is job


def test_grab_is_fifo(h: Harness) -> None:
    w = h.worker("f")
    submit_all(h, "f", [b"1", b"2", b"3"])
    assert drain(h, w.session) == [b"1", b"2", b"3"]
    assert h.engine.grab(w.session) is None


def test_grab_leases_the_job(h: Harness) -> None:
    w = h.worker("f")
    submitted, _ = h.engine.submit("f", b"x")
    h.clock.advance(3)
    job = h.engine.grab(w.session)
    assert job is submitted
    assert job.state is JobState.ACTIVE
    assert job.worker is w.session
    assert job.attempts == 1
    assert job.started_at == START + 3
    assert job.lease_deadline is None  # no timeout given
    assert w.session.jobs == {job.id: job}
    fn = h.engine.functions["f"]
    assert (fn.available, fn.running, fn.total) == (0, 1, 1)


def test_grab_only_what_the_worker_can_do(h: Harness) -> None:
    w = h.worker("f")
    h.engine.submit("g", b"x")
    assert h.engine.grab(w.session) is None
    assert not h.engine.has_work(w.session)
    h.engine.submit("f", b"y")
    assert h.engine.has_work(w.session)


def test_worker_without_abilities_gets_nothing(h: Harness) -> None:
    w = h.worker()
    h.engine.submit("f", b"x")
    assert h.engine.grab(w.session) is None
    assert h.engine.sleep(w.session) is False


def test_complete_finishes_and_forgets(h: Harness) -> None:
    w = h.worker("f")
    client = RecordingSubscriber()
    job, _ = h.engine.submit("f", b"x", background=False, subscriber=client)
    assert h.engine.grab(w.session) is job
    h.clock.advance(1)
    h.engine.complete(job, b"result")
    assert job.state is JobState.COMPLETED
    assert job.result == b"result"
    assert job.finished_at == START + 1
    assert job.worker is None
    assert w.session.jobs == {}
    assert job.id not in h.engine.jobs
    assert client.events == [(job.id, Told.COMPLETE, b"result")]
    assert job.subscribers is None
    fn = h.engine.functions["f"]
    assert (fn.running, fn.total) == (0, 0)


def test_capacity_limits_grabs(h: Harness) -> None:
    w = h.worker("f", capacity=2)
    submit_all(h, "f", [b"1", b"2", b"3"])
    first = h.engine.grab(w.session)
    assert first is not None
    assert h.engine.grab(w.session) is not None
    assert h.engine.grab(w.session) is None
    h.engine.complete(first, b"")
    job = h.engine.grab(w.session)
    assert job is not None
    assert job.payload == b"3"


def test_held_job(h: Harness) -> None:
    w = h.worker("f")
    other = h.worker("f")
    h.engine.submit("f", b"")
    job = h.engine.grab(w.session)
    assert job is not None
    assert h.engine.held_job(w.session, job.id) is job
    with pytest.raises(JobNotHeld, match="Job given in work result not found"):
        h.engine.held_job(other.session, job.id)
    with pytest.raises(JobNotHeld):
        h.engine.held_job(w.session, "H:test:999")


@pytest.mark.parametrize("method", ["complete", "fail", "fail_with_detail"])
def test_results_for_a_job_that_is_not_active_are_illegal(h: Harness, method: str) -> None:
    job, _ = h.engine.submit("f", b"")
    with pytest.raises(IllegalTransition):
        if method == "complete":
            h.engine.complete(job, b"")
        elif method == "fail":
            h.engine.fail(job)
        else:
            h.engine.fail(job, b"", detail=b"")
    assert job.state is JobState.AVAILABLE


def test_second_complete_is_illegal(h: Harness) -> None:
    w = h.worker("f")
    h.engine.submit("f", b"")
    job = h.engine.grab(w.session)
    assert job is not None
    h.engine.complete(job, b"")
    with pytest.raises(IllegalTransition):
        h.engine.complete(job, b"")


# ---------------------------------------------------------------------- priorities


def test_priorities_within_a_function(h: Harness) -> None:
    w = h.worker("f")
    for name, priority in [
        (b"low1", PRIORITY_LOW),
        (b"normal1", PRIORITY_NORMAL),
        (b"high1", PRIORITY_HIGH),
        (b"low2", PRIORITY_LOW),
        (b"normal2", PRIORITY_NORMAL),
        (b"high2", PRIORITY_HIGH),
    ]:
        h.engine.submit("f", name, priority=priority)
    assert drain(h, w.session) == [b"high1", b"high2", b"normal1", b"normal2", b"low1", b"low2"]


def test_priorities_across_all_of_a_workers_functions(h: Harness) -> None:
    # gearmand since PR #431: HIGH of every function before NORMAL of any.
    w = h.worker("f", "g", "h")
    h.engine.submit("f", b"f-normal", priority=PRIORITY_NORMAL)
    h.engine.submit("g", b"g-low", priority=PRIORITY_LOW)
    h.engine.submit("h", b"h-high", priority=PRIORITY_HIGH)
    h.engine.submit("g", b"g-normal", priority=PRIORITY_NORMAL)
    h.engine.submit("f", b"f-high", priority=PRIORITY_HIGH)
    h.engine.submit("f", b"f-low", priority=PRIORITY_LOW)
    h.engine.submit("g", b"g-high", priority=PRIORITY_HIGH)
    assert drain(h, w.session) == [
        b"h-high",
        b"f-high",
        b"g-high",
        b"f-normal",
        b"g-normal",
        b"g-low",
        b"f-low",
    ]


def test_fifo_across_functions_at_one_level(h: Harness) -> None:
    w = h.worker("a", "b")
    for i in range(6):
        h.engine.submit("ab"[i % 2], b"%d" % i)
    assert drain(h, w.session) == [b"0", b"1", b"2", b"3", b"4", b"5"]


def test_other_integer_priorities_order_too(h: Harness) -> None:
    w = h.worker("f")
    for priority in (0, 5, -3, 2, 5):
        h.engine.submit("f", b"%d" % priority, priority=priority)
    assert drain(h, w.session) == [b"5", b"5", b"2", b"0", b"-3"]


# ---------------------------------------------------------------------- coalescing


def test_same_unique_returns_the_same_job(h: Harness) -> None:
    first, created = h.engine.submit("f", b"a", unique="u1")
    again, created_again = h.engine.submit("f", b"different payload", unique="u1")
    assert created and not created_again
    assert again is first
    assert h.engine.functions["f"].total == 1
    assert h.engine.uniques[("f", "u1")] is first


def test_dash_coalesces_on_payload(h: Harness) -> None:
    a, _ = h.engine.submit("f", b"same", unique="-")
    b, created = h.engine.submit("f", b"same", unique="-")
    c, _ = h.engine.submit("f", b"other", unique="-")
    assert b is a and not created
    assert c is not a
    assert h.engine.functions["f"].total == 2


@pytest.mark.parametrize("unique", ["", None])
def test_empty_unique_never_coalesces(h: Harness, unique: str | None) -> None:
    a, _ = h.engine.submit("f", b"same", unique=unique)
    b, created = h.engine.submit("f", b"same", unique=unique)
    assert created
    assert a is not b
    assert h.engine.uniques == {}


def test_same_unique_different_function_is_a_different_job(h: Harness) -> None:
    a, _ = h.engine.submit("f", b"x", unique="u")
    b, created = h.engine.submit("g", b"x", unique="u")
    assert created and a is not b


def test_unique_is_free_again_once_the_job_finished(h: Harness) -> None:
    w = h.worker("f")
    first, _ = h.engine.submit("f", b"", unique="u")
    job = h.engine.grab(w.session)
    assert job is first
    running_dup, created = h.engine.submit("f", b"", unique="u")
    assert running_dup is first and not created  # coalesces onto the running job
    h.engine.complete(first, b"")
    second, created = h.engine.submit("f", b"", unique="u")
    assert created and second is not first


def test_coalesced_foreground_clients_all_get_every_event(h: Harness) -> None:
    w = h.worker("f")
    c1, c2 = RecordingSubscriber("c1"), RecordingSubscriber("c2")
    job, _ = h.engine.submit("f", b"x", unique="u", background=False, subscriber=c1)
    same, _ = h.engine.submit("f", b"x", unique="u", background=False, subscriber=c2)
    assert same is job
    assert job.subscribers == [c1, c2]
    assert h.engine.grab(w.session) is job
    h.engine.output(job, Output.DATA, b"d\0ata")
    h.engine.output(job, Output.WARNING, b"w")
    h.engine.progress(job, 1, 2)
    h.engine.complete(job, b"done")
    expected = [
        (job.id, Told.DATA, b"d\0ata"),
        (job.id, Told.WARNING, b"w"),
        (job.id, Told.STATUS, b"1/2"),
        (job.id, Told.COMPLETE, b"done"),
    ]
    assert c1.events == expected
    assert c2.events == expected
    assert job.progress == (1, 2)


def test_same_subscriber_is_not_added_twice(h: Harness) -> None:
    client = RecordingSubscriber()
    job, _ = h.engine.submit("f", b"", unique="u", background=False, subscriber=client)
    h.engine.submit("f", b"", unique="u", background=False, subscriber=client)
    assert job.subscribers == [client]


def test_background_submit_onto_a_foreground_job_makes_it_background(h: Harness) -> None:
    client = RecordingSubscriber()
    job, _ = h.engine.submit("f", b"", unique="u", background=False, subscriber=client)
    assert not job.background
    same, created = h.engine.submit("f", b"", unique="u", background=True)
    assert same is job and not created
    assert job.background
    assert job.subscribers == [client]


def test_foreground_submit_onto_a_background_job_subscribes(h: Harness) -> None:
    job, _ = h.engine.submit("f", b"", unique="u", background=True)
    client = RecordingSubscriber()
    same, _ = h.engine.submit("f", b"", unique="u", background=False, subscriber=client)
    assert same is job
    assert job.background
    assert job.subscribers == [client]


# ---------------------------------------------------------------------- subscribers


def active_job(h: Harness, client: RecordingSubscriber) -> tuple[Job, WorkerSession]:
    w = h.worker("f")
    job, _ = h.engine.submit("f", b"x", background=False, subscriber=client)
    assert h.engine.grab(w.session) is job
    return job, w.session


def test_fail_tells_subscribers(h: Harness) -> None:
    client = RecordingSubscriber()
    job, worker = active_job(h, client)
    h.engine.fail(job, "WORK_FAIL")
    assert job.state is JobState.DISCARDED
    assert job.error == "WORK_FAIL"
    assert client.events == [(job.id, Told.FAIL, b"")]
    assert worker.jobs == {}
    assert job.id not in h.engine.jobs


def test_exception_tells_subscribers_with_the_data(h: Harness) -> None:
    client = RecordingSubscriber()
    job, _ = active_job(h, client)
    h.engine.fail(job, b"Traceback\0", detail=b"Traceback\0")
    assert job.state is JobState.DISCARDED
    assert job.error == b"Traceback\0"
    assert client.events == [(job.id, Told.EXCEPTION, b"Traceback\0")]
    assert h.engine.functions["f"].running == 0


def test_updates_without_subscribers_are_harmless(h: Harness) -> None:
    w = h.worker("f")
    job, _ = h.engine.submit("f", b"")
    assert h.engine.grab(w.session) is job
    h.engine.output(job, Output.DATA, b"d")
    h.engine.progress(job, 3, 4)
    assert job.progress == (3, 4)
    h.engine.complete(job, b"")


def test_subscriber_that_leaves_stops_getting_events(h: Harness) -> None:
    c1, c2 = RecordingSubscriber("c1"), RecordingSubscriber("c2")
    job, _ = active_job(h, c1)
    h.engine.subscribe(job, c2)
    h.engine.unsubscribe(job, c1)
    h.engine.complete(job, b"r")
    assert c1.events == []
    assert c2.events == [(job.id, Told.COMPLETE, b"r")]


def test_every_subscriber_hears_of_an_event_even_if_one_leaves_while_told(h: Harness) -> None:
    class Leaving(RecordingSubscriber):
        def job_output(self, job: Job, kind: Output, data: bytes) -> None:
            super().job_output(job, kind, data)
            h.engine.unsubscribe(job, self)  # as a client that disconnects meanwhile

    first, second = Leaving("first"), RecordingSubscriber("second")
    job, _ = active_job(h, first)
    h.engine.subscribe(job, second)
    h.engine.output(job, Output.DATA, b"d")
    assert first.events == second.events == [(job.id, Told.DATA, b"d")]
    assert job.subscribers == [second]
    # A lone subscriber that leaves while it is told hears of it once too.
    lone = Leaving("lone")
    other, _ = active_job(h, lone)
    h.engine.output(other, Output.DATA, b"e")
    assert lone.events == [(other.id, Told.DATA, b"e")]


def test_unsubscribe_of_a_stranger_is_ignored(h: Harness) -> None:
    client = RecordingSubscriber()
    job, _ = h.engine.submit("f", b"", background=False, subscriber=client)
    h.engine.unsubscribe(job, RecordingSubscriber("stranger"))
    assert job.state is JobState.AVAILABLE
    bg, _ = h.engine.submit("f", b"")
    h.engine.unsubscribe(bg, client)  # no subscribers at all
    assert bg.state is JobState.AVAILABLE


def test_foreground_job_whose_only_client_leaves_is_dropped(h: Harness) -> None:
    w = h.worker("f")
    client = RecordingSubscriber()
    job, _ = h.engine.submit("f", b"orphan", background=False, subscriber=client)
    h.engine.submit("f", b"next")
    h.engine.unsubscribe(job, client)
    assert job.state is JobState.CANCELLED
    assert job.id not in h.engine.jobs
    assert client.events == []  # it left; nobody to tell
    assert h.engine.functions["f"].total == 1
    assert drain(h, w.session) == [b"next"]


def test_foreground_job_with_a_background_submit_is_kept(h: Harness) -> None:
    w = h.worker("f")
    client = RecordingSubscriber()
    job, _ = h.engine.submit("f", b"keep", unique="u", background=False, subscriber=client)
    h.engine.submit("f", b"keep", unique="u", background=True)
    h.engine.unsubscribe(job, client)
    assert job.state is JobState.AVAILABLE
    assert job.subscribers is None
    assert drain(h, w.session) == [b"keep"]


def test_foreground_job_kept_while_another_client_waits(h: Harness) -> None:
    c1, c2 = RecordingSubscriber("c1"), RecordingSubscriber("c2")
    job, _ = h.engine.submit("f", b"", unique="u", background=False, subscriber=c1)
    h.engine.submit("f", b"", unique="u", background=False, subscriber=c2)
    h.engine.unsubscribe(job, c1)
    assert job.state is JobState.AVAILABLE
    h.engine.unsubscribe(job, c2)
    assert job.state is JobState.CANCELLED
    assert ("f", "u") not in h.engine.uniques


def test_running_foreground_job_keeps_running_when_its_client_leaves(h: Harness) -> None:
    client = RecordingSubscriber()
    job, worker = active_job(h, client)
    h.engine.unsubscribe(job, client)
    assert job.state is JobState.ACTIVE
    assert worker.jobs == {job.id: job}
    h.engine.complete(job, b"late")
    assert job.state is JobState.COMPLETED
    assert client.events == []


@pytest.mark.parametrize("state", ["scheduled", "pending"])
def test_waiting_foreground_job_is_dropped_when_its_client_leaves(h: Harness, state: str) -> None:
    client = RecordingSubscriber()
    if state == "scheduled":
        job, _ = h.engine.submit("f", b"", background=False, subscriber=client, run_at=START + 1)
    else:
        job, _ = h.engine.submit("f", b"", background=False, subscriber=client, pending=True)
    h.engine.unsubscribe(job, client)
    assert job.state is JobState.CANCELLED
    assert h.engine.functions["f"].total == 0


# ---------------------------------------------------------------------- pending jobs


def test_pending_job_waits_for_activate(h: Harness) -> None:
    w = h.worker("f")
    job, _ = h.engine.submit("f", b"", pending=True)
    assert job.state is JobState.PENDING
    assert h.engine.grab(w.session) is None
    h.engine.activate(job)
    assert job.state is JobState.AVAILABLE
    assert h.engine.grab(w.session) is job
    with pytest.raises(IllegalTransition):
        h.engine.activate(job)


def test_activate_wakes_a_sleeper(h: Harness) -> None:
    w = h.worker("f")
    job, _ = h.engine.submit("f", b"", pending=True)
    assert h.engine.sleep(w.session) is False
    h.engine.activate(job)
    assert w.handler.wakes == 1


# ---------------------------------------------------------------------- cancel


def test_cancel_available_job(h: Harness) -> None:
    w = h.worker("f")
    client = RecordingSubscriber()
    job, _ = h.engine.submit("f", b"gone", background=False, subscriber=client)
    h.engine.submit("f", b"stays")
    h.engine.cancel(job)
    assert job.state is JobState.CANCELLED
    assert client.events == [(job.id, Told.FAIL, b"")]
    assert job.id not in h.engine.jobs
    fn = h.engine.functions["f"]
    assert (fn.available, fn.total) == (1, 1)
    assert drain(h, w.session) == [b"stays"]


def test_cancel_scheduled_job(h: Harness) -> None:
    w = h.worker("f")
    job, _ = h.engine.submit("f", b"", run_at=START + 10)
    assert h.engine.functions["f"].scheduled == 1
    h.engine.cancel(job)
    assert job.state is JobState.CANCELLED
    assert h.engine.functions["f"].total == 0
    h.advance(10)
    assert job.state is JobState.CANCELLED
    assert h.engine.grab(w.session) is None
    assert h.engine.functions["f"].scheduled == 0


def test_cancel_retryable_job(h: Harness) -> None:
    w = h.worker("f")
    job, _ = h.engine.submit("f", b"")
    assert h.engine.grab(w.session) is job
    h.engine.fail(job, "boom", retry=True, retry_after=5.0)
    assert job.state is JobState.RETRYABLE
    h.engine.cancel(job)
    assert job.state is JobState.CANCELLED
    assert h.engine.functions["f"].total == 0
    h.advance(5)
    assert h.engine.grab(w.session) is None


def test_cancel_pending_job(h: Harness) -> None:
    job, _ = h.engine.submit("f", b"", pending=True)
    h.engine.cancel(job)
    assert job.state is JobState.CANCELLED
    with pytest.raises(IllegalTransition):
        h.engine.activate(job)


def test_cancel_active_job_revokes_it(h: Harness) -> None:
    client = RecordingSubscriber()
    w = h.worker("f")
    job, _ = h.engine.submit("f", b"", background=False, subscriber=client)
    assert h.engine.grab(w.session) is job
    h.engine.cancel(job)
    assert job.state is JobState.CANCELLED
    assert w.handler.revoked == [(job, "cancelled")]
    assert w.session.jobs == {}
    assert h.engine.functions["f"].running == 0
    assert client.events == [(job.id, Told.FAIL, b"")]
    with pytest.raises(IllegalTransition):
        h.engine.complete(job, b"late")


def test_cancel_finished_job_is_illegal() -> None:
    h = Harness(retain_finished=10)
    w = h.worker("f")
    job, _ = h.engine.submit("f", b"")
    assert h.engine.grab(w.session) is job
    h.engine.complete(job, b"")
    with pytest.raises(IllegalTransition, match="completed"):
        h.engine.cancel(job)
    cancelled, _ = h.engine.submit("f", b"")
    h.engine.cancel(cancelled)
    with pytest.raises(IllegalTransition, match="cancelled"):
        h.engine.cancel(cancelled)


def test_cancelled_job_frees_its_unique(h: Harness) -> None:
    job, _ = h.engine.submit("f", b"", unique="u")
    h.engine.cancel(job)
    again, created = h.engine.submit("f", b"", unique="u")
    assert created and again is not job


# ---------------------------------------------------------------------- maxqueue


def test_maxqueue_refuses_beyond_the_limit(h: Harness) -> None:
    h.engine.function("f")
    h.engine.set_queue_limits("f", 2, 2, 2)
    h.engine.submit("f", b"1")
    h.engine.submit("f", b"2")
    with pytest.raises(QueueFull, match="Job queue is full"):
        h.engine.submit("f", b"3")
    assert h.engine.functions["f"].total == 2
    assert len(h.engine.jobs) == 2


def test_maxqueue_counts_running_and_scheduled_jobs(h: Harness) -> None:
    w = h.worker("f")
    h.engine.set_queue_limits("f", 3, 3, 3)
    h.engine.submit("f", b"running")
    assert h.engine.grab(w.session) is not None
    h.engine.submit("f", b"later", run_at=START + 100)
    h.engine.submit("f", b"queued")
    with pytest.raises(QueueFull):
        h.engine.submit("f", b"one too many")


def test_maxqueue_per_priority_band(h: Harness) -> None:
    h.engine.function("f")
    h.engine.set_queue_limits("f", 1, 0, 3)  # 0: unlimited
    h.engine.submit("f", b"", priority=PRIORITY_HIGH)
    with pytest.raises(QueueFull):
        h.engine.submit("f", b"", priority=PRIORITY_HIGH)
    for _ in range(5):
        h.engine.submit("f", b"", priority=PRIORITY_NORMAL)
    with pytest.raises(QueueFull):  # total is 6 >= 3
        h.engine.submit("f", b"", priority=PRIORITY_LOW)


def test_maxqueue_negative_is_unlimited(h: Harness) -> None:
    h.engine.function("f")
    h.engine.set_queue_limits("f", -1, -1, -1)
    submit_all(h, "f", [b""] * 10)
    assert h.engine.functions["f"].total == 10


def test_maxqueue_does_not_refuse_a_coalescing_submit(h: Harness) -> None:
    h.engine.function("f")
    h.engine.set_queue_limits("f", 1, 1, 1)
    job, _ = h.engine.submit("f", b"", unique="u")
    again, created = h.engine.submit("f", b"", unique="u")
    assert again is job and not created


def test_maxqueue_on_an_unknown_function_is_a_no_op(h: Harness) -> None:
    h.engine.set_queue_limits("nope", 1, 1, 1)
    assert "nope" not in h.engine.functions
    submit_all(h, "nope", [b"", b""])


def test_maxqueue_frees_up_as_jobs_finish(h: Harness) -> None:
    w = h.worker("f")
    h.engine.set_queue_limits("f", 1, 1, 1)
    h.engine.submit("f", b"")
    job = h.engine.grab(w.session)
    assert job is not None
    with pytest.raises(QueueFull):
        h.engine.submit("f", b"")
    h.engine.complete(job, b"")
    h.engine.submit("f", b"")


# ---------------------------------------------------------------------- functions


def test_functions_are_created_on_first_mention(h: Harness) -> None:
    fn = h.engine.function("f")
    assert h.engine.function("f") is fn
    assert (fn.name, fn.total, fn.running) == ("f", 0, 0)


def test_drop_unknown_function(h: Harness) -> None:
    with pytest.raises(KeyError):
        h.engine.drop_function("nope")


def test_drop_function_with_a_worker_is_refused(h: Harness) -> None:
    h.worker("f")
    with pytest.raises(IllegalTransition, match="still connected workers"):
        h.engine.drop_function("f")
    assert "f" in h.engine.functions


def test_drop_function_with_jobs_is_refused(h: Harness) -> None:
    h.engine.submit("f", b"")
    with pytest.raises(IllegalTransition):
        h.engine.drop_function("f")
    h.engine.submit("g", b"", run_at=START + 5)
    with pytest.raises(IllegalTransition):
        h.engine.drop_function("g")


def test_drop_function_with_a_running_job_is_refused(h: Harness) -> None:
    w = h.worker("f")
    h.engine.submit("f", b"")
    job = h.engine.grab(w.session)
    assert job is not None
    h.engine.remove_ability(w.session, "f")
    assert h.engine.functions["f"].workers == {}
    with pytest.raises(IllegalTransition):
        h.engine.drop_function("f")
    h.engine.complete(job, b"")
    h.engine.drop_function("f")
    assert "f" not in h.engine.functions


def test_drop_idle_function(h: Harness) -> None:
    w = h.worker("f")
    h.engine.submit("f", b"")
    assert drain(h, w.session) == [b""]
    h.engine.remove_worker(w.session)
    assert h.engine.functions["f"].total == 0
    h.engine.drop_function("f")
    assert "f" not in h.engine.functions
    assert "f" not in h.engine.queues["f"].lanes
    # A later submit starts afresh.
    h.engine.submit("f", b"again")
    assert h.engine.functions["f"].total == 1


def test_abilities_register_workers_per_function(h: Harness) -> None:
    w = h.worker("f", "g")
    assert list(h.engine.functions["f"].workers) == [w.session]
    h.engine.remove_ability(w.session, "f")
    assert h.engine.functions["f"].workers == {}
    assert list(w.session.abilities) == ["g"]
    h.engine.remove_ability(w.session, "never-had")
    h.engine.reset_abilities(w.session)
    assert w.session.abilities == {}
    assert h.engine.functions["g"].workers == {}


def test_remove_ability_with_a_zero_timeout(h: Harness) -> None:
    w = h.worker()
    h.engine.add_ability(w.session, "f", 0.0)
    h.engine.remove_ability(w.session, "f")
    assert w.session.abilities == {}
    assert h.engine.functions["f"].workers == {}


# ---------------------------------------------------------------------- retention


def test_finished_jobs_are_forgotten_at_once_by_default(h: Harness) -> None:
    w = h.worker("f")
    job, _ = h.engine.submit("f", b"")
    assert h.engine.grab(w.session) is job
    h.engine.complete(job, b"")
    assert len(h.engine.jobs) == 0
    assert len(h.engine.timers) == 0


def test_retain_finished_keeps_jobs_visible_until_the_timer_forgets_them() -> None:
    h = Harness(retain_finished=10)
    w = h.worker("f")
    first, _ = h.engine.submit("f", b"1")
    second, _ = h.engine.submit("f", b"2")
    assert h.engine.grab(w.session) is first
    h.engine.complete(first, b"r1")
    h.clock.advance(4)
    assert h.engine.grab(w.session) is second
    h.engine.fail(second)
    assert h.engine.jobs[first.id].state is JobState.COMPLETED
    assert h.engine.jobs[first.id].result == b"r1"
    assert h.engine.jobs[second.id].state is JobState.DISCARDED
    assert h.advance(5.999) == START + 10
    assert first.id in h.engine.jobs
    assert h.advance(0.001) == START + 14
    assert first.id not in h.engine.jobs
    assert second.id in h.engine.jobs
    assert h.advance(4) is None
    assert len(h.engine.jobs) == 0


def test_retained_job_does_not_block_its_unique() -> None:
    h = Harness(retain_finished=10)
    w = h.worker("f")
    job, _ = h.engine.submit("f", b"", unique="u")
    assert h.engine.grab(w.session) is job
    h.engine.complete(job, b"")
    again, created = h.engine.submit("f", b"", unique="u")
    assert created and again is not job


def test_retention_timer_rearms_after_draining() -> None:
    h = Harness(retain_finished=1)
    for _ in range(2):
        job, _ = h.engine.submit("f", b"")
        h.engine.cancel(job)
        assert job.id in h.engine.jobs
        h.advance(1)
        assert job.id not in h.engine.jobs


# ---------------------------------------------------------------------- worker state


def test_quiet_worker_takes_nothing_new(h: Harness) -> None:
    w = h.worker("f")
    h.engine.submit("f", b"")
    h.engine.set_worker_state(w.session, WorkerState.QUIET)
    assert h.engine.grab(w.session) is None
    assert not h.engine.has_work(w.session)
    assert h.engine.sleep(w.session) is False
    h.engine.submit("f", b"")
    assert w.handler.wakes == 0  # a quiet worker is not a sleeper
    h.engine.set_worker_state(w.session, WorkerState.RUNNING)
    assert h.engine.grab(w.session) is not None


def test_going_quiet_stops_waiting(h: Harness) -> None:
    w = h.worker("f")
    assert h.engine.sleep(w.session) is False
    h.engine.set_worker_state(w.session, WorkerState.QUIET)
    h.engine.submit("f", b"")
    assert w.handler.wakes == 0


def test_quiet_worker_finishes_what_it_holds(h: Harness) -> None:
    w = h.worker("f")
    h.engine.submit("f", b"")
    job = h.engine.grab(w.session)
    assert job is not None
    h.engine.set_worker_state(w.session, WorkerState.QUIET)
    h.engine.complete(job, b"ok")
    assert job.state is JobState.COMPLETED


def test_touch_records_the_last_heartbeat(h: Harness) -> None:
    w = h.worker("f")
    assert w.session.last_seen == START
    h.clock.advance(7)
    h.engine.touch(w.session)
    assert w.session.last_seen == START + 7


def test_remove_worker_forgets_it(h: Harness) -> None:
    w = h.worker("f", "g")
    assert h.engine.sleep(w.session) is False
    h.engine.remove_worker(w.session)
    assert w.session.id not in h.engine.workers
    assert w.session.state is WorkerState.TERMINATED
    assert h.engine.functions["f"].workers == {}
    assert h.engine.functions["f"].waiters == {}
    h.engine.submit("f", b"")
    assert w.handler.wakes == 0


# ---------------------------------------------------------------------- restore


def restored_job(
    job_id: str,
    payload: bytes = b"",
    *,
    unique: str | None = None,
    attempts: int = 0,
    run_at: float | None = None,
) -> Job:
    job = Job(job_id, "f", payload, unique=unique)
    job.attempts = attempts
    job.run_at = run_at
    return job


def test_restore_requeues_jobs_in_order(h: Harness) -> None:
    w = h.worker("f")
    jobs = [restored_job(f"H:old:{i}", b"%d" % i, attempts=i) for i in range(3)]
    assert h.engine.restore(jobs) == 3
    assert all(job.state is JobState.AVAILABLE for job in jobs)
    assert dict(h.engine.jobs.items()) == {job.id: job for job in jobs}
    grabbed = h.engine.grab(w.session)
    assert grabbed is jobs[0]
    assert grabbed.attempts == 1  # attempts carry over: 0 + this one
    assert drain(h, w.session) == [b"1", b"2"]
    assert jobs[2].attempts == 3


def test_restore_registers_uniques(h: Harness) -> None:
    job = restored_job("H:old:1", unique="u")
    h.engine.restore([job])
    same, created = h.engine.submit("f", b"", unique="u")
    assert same is job and not created


def test_restore_schedules_future_jobs_and_releases_due_ones(h: Harness) -> None:
    w = h.worker("f")
    future = restored_job("H:old:1", b"future", run_at=START + 30)
    past = restored_job("H:old:2", b"past", run_at=START - 30)
    h.engine.restore([future, past])
    assert future.state is JobState.SCHEDULED
    assert past.state is JobState.AVAILABLE
    assert h.engine.functions["f"].scheduled == 1
    assert drain(h, w.session) == [b"past"]
    h.advance(30)
    assert drain(h, w.session) == [b"future"]


def test_new_handles_do_not_collide_with_restored_ones(h: Harness) -> None:
    restored = [restored_job(f"H:test:{i}") for i in (1, 2, 7)]
    h.engine.restore(restored)
    job, _ = h.engine.submit("f", b"new")
    assert job.id not in {r.id for r in restored}
    assert all(h.engine.jobs[r.id] is r for r in restored)
    assert len(h.engine.jobs) == 4


def test_replay_of_stored_rows(h: Harness) -> None:
    rows = [
        StoredJob(
            id="H:test:4",
            function="f",
            queue="q",
            unique="u",
            payload=b"p",
            priority=PRIORITY_HIGH,
            state=int(JobState.ACTIVE),
            attempts=2,
            max_attempts=5,
            run_at=None,
            created_at=START - 100,
            reducer="sum",
        )
    ]
    assert h.engine.replay(rows) == 1
    job = h.engine.jobs["H:test:4"]
    assert (job.queue, job.unique, job.payload, job.priority) == ("q", "u", b"p", PRIORITY_HIGH)
    assert (job.attempts, job.max_attempts, job.reducer) == (2, 5, "sum")
    assert job.background
    assert job.created_at == START - 100
    assert job.state is JobState.AVAILABLE
    new, _ = h.engine.submit("f", b"")
    assert new.id != "H:test:4"


def test_a_restored_pending_job_stays_staged_until_activated(h: Harness) -> None:
    w = h.worker("f")
    staged = restored_job("H:old:1", b"staged")
    staged.state = JobState.PENDING
    h.engine.restore([staged, restored_job("H:old:2", b"ready")])
    assert staged.state is JobState.PENDING
    assert drain(h, w.session) == [b"ready"]
    h.engine.activate(staged)
    assert drain(h, w.session) == [b"staged"]


def test_retained_finished_jobs_are_capped_oldest_first() -> None:
    h = Harness(retain_finished=3600)
    h.engine.config.retain_finished_max = 2
    w = h.worker("f")
    ids = []
    for n in range(3):
        job, _ = h.engine.submit("f", str(n).encode())
        assert h.engine.grab(w.session) is job
        h.engine.complete(job, b"ok")
        ids.append(job.id)
    # Long before the hour is up, only the newest two are still known.
    assert [job_id in h.engine.jobs for job_id in ids] == [False, True, True]
