"""How work reaches workers: wake-then-pull, push with credit, and pull by queue."""

from __future__ import annotations

import pytest

from jobwire.engine import PRIORITY_HIGH, Dispatch, JobState, WorkerState
from tests.engine.fakes import START, Harness

# ---------------------------------------------------------------------- WAKE


def test_sleep_returns_true_when_work_is_waiting(h: Harness) -> None:
    w = h.worker("f")
    h.engine.submit("f", b"")
    assert h.engine.sleep(w.session) is True
    assert h.engine.functions["f"].waiters == {}  # told at once, so not a sleeper


def test_sleeper_is_woken_by_new_work(h: Harness) -> None:
    w = h.worker("f")
    assert h.engine.sleep(w.session) is False
    assert w.handler.calls == []
    h.engine.submit("f", b"")
    assert w.handler.calls == [("wake", "")]


def test_sleeper_is_not_woken_for_other_functions(h: Harness) -> None:
    w = h.worker("f")
    h.engine.sleep(w.session)
    h.engine.submit("g", b"")
    assert w.handler.wakes == 0


def test_sleeper_of_several_functions_is_woken_by_any(h: Harness) -> None:
    w = h.worker("f", "g")
    h.engine.sleep(w.session)
    h.engine.submit("g", b"")
    assert w.handler.wakes == 1
    assert h.engine.functions["f"].waiters == {}  # woken means not waiting anywhere
    h.engine.submit("f", b"")
    assert w.handler.wakes == 1


def test_one_job_wakes_exactly_one_sleeper_by_default(h: Harness) -> None:
    workers = [h.worker("f") for _ in range(3)]
    for w in workers:
        assert h.engine.sleep(w.session) is False
    h.engine.submit("f", b"1")
    assert [w.handler.wakes for w in workers] == [1, 0, 0]  # the longest sleeper first
    h.engine.submit("f", b"2")
    assert [w.handler.wakes for w in workers] == [1, 1, 0]
    h.engine.submit("f", b"3")
    assert [w.handler.wakes for w in workers] == [1, 1, 1]
    h.engine.submit("f", b"4")  # everyone is awake already
    assert [w.handler.wakes for w in workers] == [1, 1, 1]


@pytest.mark.parametrize(("wakeup", "woken"), [(1, 1), (2, 2), (3, 3), (4, 4), (0, 4), (9, 4)])
def test_worker_wakeup_sets_how_many_sleepers_one_job_wakes(wakeup: int, woken: int) -> None:
    h = Harness(worker_wakeup=wakeup)
    workers = [h.worker("f") for _ in range(4)]
    for w in workers:
        h.engine.sleep(w.session)
    h.engine.submit("f", b"")
    assert sum(w.handler.wakes for w in workers) == woken
    assert [w.handler.wakes for w in workers] == [1] * woken + [0] * (4 - woken)


def test_woken_worker_is_not_woken_again_until_it_sleeps_again(h: Harness) -> None:
    w = h.worker("f")
    h.engine.sleep(w.session)
    h.engine.submit("f", b"1")
    h.engine.submit("f", b"2")
    assert w.handler.wakes == 1
    first = h.engine.grab(w.session)
    assert first is not None
    h.engine.complete(first, b"")
    assert h.engine.sleep(w.session) is True  # job 2 is waiting: told at once, no wake
    second = h.engine.grab(w.session)
    assert second is not None
    h.engine.complete(second, b"")
    assert h.engine.sleep(w.session) is False
    h.engine.submit("f", b"3")
    assert w.handler.wakes == 2


def test_grab_stops_a_worker_sleeping(h: Harness) -> None:
    w = h.worker("f")
    h.engine.sleep(w.session)
    assert h.engine.grab(w.session) is None  # as gearmand: GRAB clears the sleeping flag
    h.engine.submit("f", b"")
    assert w.handler.wakes == 0


def test_work_is_not_stranded_when_the_woken_worker_leaves(h: Harness) -> None:
    # With one wake per job, the woken worker dying before it grabs must not leave the job
    # queued while other workers sleep.
    woken, sleeper = h.worker("f"), h.worker("f")
    h.engine.sleep(woken.session)
    h.engine.sleep(sleeper.session)
    h.engine.submit("f", b"")
    assert (woken.handler.wakes, sleeper.handler.wakes) == (1, 0)
    h.engine.remove_worker(woken.session)
    assert sleeper.handler.wakes == 1
    assert h.engine.grab(sleeper.session) is not None


def test_work_is_not_stranded_when_the_woken_worker_drops_the_function(h: Harness) -> None:
    woken, sleeper = h.worker("f", "g"), h.worker("f")
    h.engine.sleep(woken.session)
    h.engine.sleep(sleeper.session)
    h.engine.submit("f", b"")
    assert (woken.handler.wakes, sleeper.handler.wakes) == (1, 0)
    h.engine.remove_ability(woken.session, "f")
    assert sleeper.handler.wakes == 1


def test_work_is_not_stranded_when_the_woken_worker_goes_quiet(h: Harness) -> None:
    woken, sleeper = h.worker("f"), h.worker("f")
    h.engine.sleep(woken.session)
    h.engine.sleep(sleeper.session)
    h.engine.submit("f", b"")
    h.engine.set_worker_state(woken.session, WorkerState.QUIET)
    assert sleeper.handler.wakes == 1


def test_a_sleeper_dropping_a_function_wakes_nobody(h: Harness) -> None:
    a, b, c, d = (h.worker("f") for _ in range(4))
    for w in (a, b, c, d):
        h.engine.sleep(w.session)
    h.engine.submit("f", b"1")
    h.engine.submit("f", b"2")
    assert [w.handler.wakes for w in (a, b, c, d)] == [1, 1, 0, 0]
    h.engine.remove_ability(c.session, "f")  # it was asleep: it owed nobody a wake-up
    h.engine.set_worker_state(d.session, WorkerState.QUIET)
    assert [w.handler.wakes for w in (a, b, c, d)] == [1, 1, 0, 0]


def test_leaving_worker_does_not_wake_sleepers_when_there_is_no_work(h: Harness) -> None:
    leaving, sleeper = h.worker("f"), h.worker("f")
    h.engine.sleep(sleeper.session)
    h.engine.remove_worker(leaving.session)
    assert sleeper.handler.wakes == 0


def test_wake_skips_workers_that_left(h: Harness) -> None:
    gone, stays = h.worker("f"), h.worker("f")
    h.engine.sleep(gone.session)
    h.engine.sleep(stays.session)
    h.engine.remove_worker(gone.session)
    h.engine.submit("f", b"")
    assert (gone.handler.wakes, stays.handler.wakes) == (0, 1)


def test_wake_skips_workers_that_dropped_the_function(h: Harness) -> None:
    w = h.worker("f")
    h.engine.sleep(w.session)
    h.engine.remove_ability(w.session, "f")
    h.engine.submit("f", b"")
    assert w.handler.wakes == 0


def test_wake_honours_queue_restrictions(h: Harness) -> None:
    picky = h.worker("f")
    picky.session.queues = frozenset({"other"})
    anyone = h.worker("f")
    h.engine.sleep(picky.session)
    h.engine.sleep(anyone.session)
    h.engine.submit("f", b"")
    assert (picky.handler.wakes, anyone.handler.wakes) == (0, 1)


def test_queue_restricted_worker_grabs_only_its_queues(h: Harness) -> None:
    w = h.worker("f")
    w.session.queues = frozenset({"fast"})
    h.engine.submit("f", b"default")
    h.engine.submit("f", b"fast", queue="fast")
    job = h.engine.grab(w.session)
    assert job is not None
    assert job.payload == b"fast"
    assert h.engine.grab(w.session) is None


def test_a_worker_sees_a_queue_made_after_its_last_grab(h: Harness) -> None:
    """Workers keep the list of lanes they take from: a new lane must reach it."""
    w = h.worker("f")
    assert h.engine.grab(w.session) is None  # its lanes worked out: none yet
    h.engine.submit("f", b"default")
    first = h.engine.grab(w.session)
    assert first is not None and first.payload == b"default"
    h.engine.submit("f", b"fast", queue="fast")  # a second lane of `f`
    second = h.engine.grab(w.session)
    assert second is not None and second.payload == b"fast"


def test_a_worker_sees_its_new_queues_and_abilities_at_the_next_grab(h: Harness) -> None:
    w = h.worker("f")
    h.engine.submit("f", b"fast", queue="fast")
    h.engine.submit("g", b"g")
    w.session.queues = frozenset({"slow"})
    assert h.engine.grab(w.session) is None
    w.session.queues = frozenset({"fast"})
    job = h.engine.grab(w.session)
    assert job is not None and job.payload == b"fast"
    w.session.queues = None
    assert h.engine.grab(w.session) is None  # `g` is not among its abilities yet
    h.engine.add_ability(w.session, "g")
    job = h.engine.grab(w.session)
    assert job is not None and job.payload == b"g"
    h.engine.submit("g", b"g2")
    h.engine.remove_ability(w.session, "g")
    assert h.engine.grab(w.session) is None


# ---------------------------------------------------------------------- PUSH


def test_request_work_assigns_what_is_there_up_to_the_credit(h: Harness) -> None:
    w = h.worker("f", dispatch=Dispatch.PUSH)
    jobs = [h.engine.submit("f", b"%d" % i)[0] for i in range(3)]
    h.engine.request_work(w.session, 2)
    assert w.handler.assigned == jobs[:2]
    assert all(job.state is JobState.ACTIVE and job.worker is w.session for job in jobs[:2])
    assert jobs[2].state is JobState.AVAILABLE
    assert w.session.credit == 0
    assert h.engine.functions["f"].waiters == {}


def test_request_work_assigns_the_rest_as_jobs_arrive(h: Harness) -> None:
    w = h.worker("f", dispatch=Dispatch.PUSH)
    first, _ = h.engine.submit("f", b"1")
    h.engine.request_work(w.session, 3)
    assert w.handler.assigned == [first]
    assert w.session.credit == 2
    second, _ = h.engine.submit("f", b"2")
    assert w.handler.assigned == [first, second]
    third, _ = h.engine.submit("f", b"3")
    fourth, _ = h.engine.submit("f", b"4")
    assert w.handler.assigned == [first, second, third]
    assert fourth.state is JobState.AVAILABLE
    assert w.session.credit == 0
    assert w.handler.wakes == 0


def test_request_work_replaces_the_credit(h: Harness) -> None:
    w = h.worker("f", dispatch=Dispatch.PUSH)
    h.engine.request_work(w.session, 5)
    h.engine.request_work(w.session, 1)
    for i in range(3):
        h.engine.submit("f", b"%d" % i)
    assert len(w.handler.assigned) == 1


@pytest.mark.parametrize("count", [0, -3])
def test_request_work_for_nothing(h: Harness, count: int) -> None:
    w = h.worker("f", dispatch=Dispatch.PUSH)
    h.engine.submit("f", b"")
    h.engine.request_work(w.session, count)
    assert w.session.credit == 0
    assert w.handler.assigned == []
    h.engine.submit("f", b"")
    assert w.handler.assigned == []


def test_push_respects_priorities(h: Harness) -> None:
    w = h.worker("f", "g", dispatch=Dispatch.PUSH)
    h.engine.submit("f", b"normal")
    h.engine.submit("g", b"high", priority=PRIORITY_HIGH)
    h.engine.request_work(w.session, 2)
    assert [job.payload for job in w.handler.assigned] == [b"high", b"normal"]


def test_push_respects_capacity(h: Harness) -> None:
    w = h.worker("f", dispatch=Dispatch.PUSH, capacity=1)
    for i in range(3):
        h.engine.submit("f", b"%d" % i)
    h.engine.request_work(w.session, 3)
    assert len(w.handler.assigned) == 1
    assert w.session.credit == 2


def test_push_and_wake_workers_share_one_job(h: Harness) -> None:
    pusher = h.worker("f", dispatch=Dispatch.PUSH)
    sleeper = h.worker("f")
    h.engine.request_work(pusher.session, 1)
    h.engine.sleep(sleeper.session)
    job, _ = h.engine.submit("f", b"")
    assert pusher.handler.assigned == [job]
    assert sleeper.handler.wakes == 0  # the job is gone: nobody else is told
    h.engine.submit("f", b"")
    assert sleeper.handler.wakes == 1


def test_quiet_push_worker_gets_nothing(h: Harness) -> None:
    w = h.worker("f", dispatch=Dispatch.PUSH)
    h.engine.set_worker_state(w.session, WorkerState.QUIET)
    h.engine.submit("f", b"")
    h.engine.request_work(w.session, 2)
    h.engine.submit("f", b"")
    assert w.handler.assigned == []


# ---------------------------------------------------------------------- PULL by queue


def queued(h: Harness) -> None:
    h.engine.submit("email", b"a1", queue="a")
    h.engine.submit("email", b"b1", queue="b")
    h.engine.submit("sms", b"a2", queue="a")
    h.engine.submit("email", b"b2", queue="b")
    h.engine.submit("sms", b"a3", queue="a")


def test_fetch_takes_queues_in_the_given_order(h: Harness) -> None:
    queued(h)
    w = h.worker(dispatch=Dispatch.PULL)
    jobs = h.engine.fetch(["b", "a"], 10, worker=w.session)
    assert [job.payload for job in jobs] == [b"b1", b"b2", b"a1", b"a2", b"a3"]
    assert all(job.state is JobState.ACTIVE and job.worker is w.session for job in jobs)
    assert set(w.session.jobs) == {job.id for job in jobs}


def test_fetch_returns_at_most_count(h: Harness) -> None:
    queued(h)
    w = h.worker(dispatch=Dispatch.PULL)
    assert [job.payload for job in h.engine.fetch(["a", "b"], 2, worker=w.session)] == [
        b"a1",
        b"a2",
    ]
    assert [job.payload for job in h.engine.fetch(["a", "b"], 2, worker=w.session)] == [
        b"a3",
        b"b1",
    ]
    assert h.engine.fetch(["a", "b"], 0, worker=w.session) == []


def test_fetch_skips_paused_and_unknown_queues(h: Harness) -> None:
    queued(h)
    w = h.worker(dispatch=Dispatch.PULL)
    h.engine.queue("b").paused = True
    jobs = h.engine.fetch(["nope", "b", "a"], 10, worker=w.session)
    assert [job.payload for job in jobs] == [b"a1", b"a2", b"a3"]
    h.engine.queue("b").paused = False
    assert len(h.engine.fetch(["b"], 10, worker=w.session)) == 2


def test_fetch_orders_by_priority_within_a_queue(h: Harness) -> None:
    h.engine.submit("x", b"normal", queue="q")
    h.engine.submit("y", b"high", queue="q", priority=PRIORITY_HIGH)
    w = h.worker(dispatch=Dispatch.PULL)
    assert [job.payload for job in h.engine.fetch(["q"], 2, worker=w.session)] == [
        b"high",
        b"normal",
    ]


def test_fetch_respects_capacity(h: Harness) -> None:
    queued(h)
    w = h.worker(dispatch=Dispatch.PULL, capacity=2)
    assert len(h.engine.fetch(["a", "b"], 10, worker=w.session)) == 2
    assert h.engine.fetch(["a", "b"], 10, worker=w.session) == []


def test_fetch_by_a_quiet_worker_gets_nothing(h: Harness) -> None:
    queued(h)
    w = h.worker(dispatch=Dispatch.PULL)
    h.engine.set_worker_state(w.session, WorkerState.QUIET)
    assert h.engine.fetch(["a"], 10, worker=w.session) == []


def test_fetch_with_a_lease_timeout(h: Harness) -> None:
    h.engine.submit("email", b"", queue="a")
    w = h.worker(dispatch=Dispatch.PULL)
    (job,) = h.engine.fetch(["a"], 1, worker=w.session, lease_timeout=30)
    assert job.lease_deadline == START + 30
    h.advance(30)
    assert job.state is JobState.AVAILABLE
    assert w.handler.revoked == [(job, "lease expired")]
    assert w.session.jobs == {}
    (again,) = h.engine.fetch(["a"], 1, worker=w.session)
    assert again is job
    assert job.attempts == 2


def test_queue_counts(h: Harness) -> None:
    queued(h)
    assert h.engine.queues["a"].available == 3
    assert h.engine.queues["b"].available == 2
    w = h.worker(dispatch=Dispatch.PULL)
    h.engine.fetch(["a"], 1, worker=w.session)
    assert h.engine.queues["a"].available == 2


# ---------------------------------------------------------------------- wake-up fallback


def test_fallback_wakes_another_sleeper_when_the_woken_one_does_not_grab(h: Harness) -> None:
    a, b = h.worker("f"), h.worker("f")
    assert h.engine.sleep(a.session) is False
    assert h.engine.sleep(b.session) is False
    job, _ = h.engine.submit("f", b"x")
    assert (a.handler.wakes, b.handler.wakes) == (1, 0)
    # `a` is busy elsewhere and never grabs: after the fallback delay `b` is woken too.
    h.advance(h.engine.config.wakeup_fallback)
    assert (a.handler.wakes, b.handler.wakes) == (1, 1)
    assert h.engine.grab(b.session) is job


def test_fallback_wakes_nobody_once_the_work_is_taken(h: Harness) -> None:
    a, b = h.worker("f"), h.worker("f")
    h.engine.sleep(a.session)
    h.engine.sleep(b.session)
    job, _ = h.engine.submit("f", b"x")
    assert h.engine.grab(a.session) is job
    assert h.advance(h.engine.config.wakeup_fallback) is None
    assert b.handler.wakes == 0


def test_fallback_wakes_as_many_sleepers_as_jobs_still_wait(h: Harness) -> None:
    workers = [h.worker("f") for _ in range(4)]
    for w in workers:
        h.engine.sleep(w.session)
    h.engine.submit("f", b"1")
    h.engine.submit("f", b"2")
    assert [w.handler.wakes for w in workers] == [1, 1, 0, 0]
    h.advance(h.engine.config.wakeup_fallback)
    assert [w.handler.wakes for w in workers] == [1, 1, 1, 1]
