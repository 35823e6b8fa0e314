"""Lanes: per-(queue, function) FIFO levels with lazy removal (engine/lanes.py)."""

from __future__ import annotations

import collections
import itertools
import sys

from jobwire.engine import PRIORITY_HIGH, PRIORITY_LOW, PRIORITY_NORMAL, Job, JobState
from jobwire.engine.lanes import FunctionInfo, Lane

_seq = itertools.count(1)


def make(name: str, priority: int = PRIORITY_NORMAL) -> Job:
    job = Job(name, "f", name.encode(), priority=priority)
    job.seq = next(_seq)
    return job


def lane() -> Lane:
    return FunctionInfo("f").lane("q")


def drain(target: Lane) -> list[str]:
    out = []
    while (job := target.pop()) is not None:
        out.append(job.id)
    return out


def entries(target: Lane) -> int:
    return sum(len(level.jobs) for level in target.levels)


def cancel(target: Lane, job: Job) -> None:
    """What the engine does for a queued job that is cancelled."""
    target.discard()
    job.state = JobState.CANCELLED


def test_empty_lane() -> None:
    target = lane()
    assert target.count == 0
    assert target.head() is None
    assert target.pop() is None
    assert target.count_by_level() == (0, 0, 0)


def test_fifo_within_a_level() -> None:
    target = lane()
    for name in "abc":
        target.push(make(name))
    assert target.count == 3
    head = target.head()
    assert head is not None and head.id == "a"
    assert target.count == 3  # head does not remove
    assert drain(target) == ["a", "b", "c"]
    assert target.count == 0


def test_higher_priority_first() -> None:
    target = lane()
    target.push(make("low", PRIORITY_LOW))
    target.push(make("normal", PRIORITY_NORMAL))
    target.push(make("high", PRIORITY_HIGH))
    target.push(make("low2", PRIORITY_LOW))
    target.push(make("very", 10))
    assert [level.priority for level in target.levels] == [
        10,
        PRIORITY_HIGH,
        PRIORITY_NORMAL,
        PRIORITY_LOW,
    ]
    assert drain(target) == ["very", "high", "normal", "low", "low2"]


def test_push_front() -> None:
    target = lane()
    first = make("first")
    target.push(make("second"))
    target.push(first, front=True)
    assert drain(target) == ["first", "second"]


def test_push_front_keeps_requeued_jobs_in_their_original_order() -> None:
    target = lane()
    a, b, c, d = (make(name) for name in "abcd")
    for job in (a, b, c, d):
        target.push(job)
    taken = [target.pop(), target.pop(), target.pop()]
    assert taken == [a, b, c]
    # Put back in any order: they line up again by when they were first queued.
    target.push(b, front=True)
    target.push(c, front=True)
    target.push(a, front=True)
    assert drain(target) == ["a", "b", "c", "d"]


def test_requeued_jobs_line_up_by_seq_in_a_deep_level_without_moving_it() -> None:
    # More requeues than the room a level makes at its front at a time (1,024), into a
    # level where nothing was taken yet, and then into one where some were.
    target = lane()
    jobs = [make(f"j{number}") for number in range(6000)]
    for job in jobs[3000:]:
        target.push(job)
    for job in reversed(jobs[:3000]):  # the youngest first: each goes to the very front
        target.push(job, front=True)
    assert target.count == entries(target) == 6000
    taken = [target.pop() for _ in range(2000)]
    for job in taken[1::2]:  # every other one back, the oldest first
        target.push(job, front=True)
    expected = [job.id for job in taken[1::2]] + [job.id for job in jobs[2000:]]
    assert drain(target) == expected


def test_cancelled_entries_are_skipped() -> None:
    target = lane()
    a, b, c = make("a"), make("b"), make("c")
    for job in (a, b, c):
        target.push(job)
    cancel(target, a)
    cancel(target, c)
    assert target.count == 1
    head = target.head()
    assert head is b
    assert drain(target) == ["b"]
    assert target.head() is None


def test_count_by_level_counts_live_jobs_in_gearman_bands() -> None:
    target = lane()
    jobs = [
        make("h1", PRIORITY_HIGH),
        make("h2", 7),
        make("n1"),
        make("n2"),
        make("l1", PRIORITY_LOW),
        make("l2", -9),
    ]
    for job in jobs:
        target.push(job)
    assert target.count_by_level() == (2, 2, 2)
    cancel(target, jobs[2])
    assert target.count_by_level() == (2, 1, 2)


def test_cancelled_entries_do_not_pile_up_while_nothing_is_taken() -> None:
    # Clients that submit and leave while no worker takes anything must not leak memory.
    target = lane()
    keeper = make("keeper")
    target.push(keeper)
    for i in range(1000):
        job = make(f"j{i}")
        target.push(job)
        cancel(target, job)
    assert target.count == 1
    assert entries(target) <= 3
    assert drain(target) == ["keeper"]


def test_cancelled_entries_do_not_pile_up_in_an_empty_lane() -> None:
    target = lane()
    for i in range(1000):
        job = make(f"j{i}")
        target.push(job)
        cancel(target, job)
    assert target.count == 0
    assert entries(target) <= 2


def test_function_info_totals() -> None:
    fn = FunctionInfo("f")
    assert fn.lane("a") is fn.lane("a")
    fn.lane("a").push(make("x"))
    fn.lane("b").push(make("y"))
    fn.running = 2
    fn.scheduled = 3
    assert fn.available == 2
    assert fn.total == 7
    assert fn.queue_limits is None


def test_a_level_stays_fifo_as_it_is_cut_down_while_jobs_come_and_go() -> None:
    # A backlog, then one job in and one or two out per step: the level's list passes its
    # 1,024 taken entries several times and is cut down each time, never running empty.
    target = lane()
    queued: collections.deque[str] = collections.deque()

    def push(name: str) -> None:
        target.push(make(name))
        queued.append(name)

    for number in range(3000):
        push(f"b{number}")
    for step in range(5000):
        push(f"s{step}")
        for _ in range(1 + step % 2 if len(queued) > 1 else 1):
            job = target.pop()
            assert job is not None and job.id == queued.popleft()
        assert target.count == len(queued) == entries(target)
    assert drain(target) == list(queued)
    assert target.count == entries(target) == 0


def test_a_taken_job_is_no_longer_held_by_its_level() -> None:
    target = lane()
    jobs = [make(name) for name in ("a", "b", "c")]
    for job in jobs:
        target.push(job)
    held = sys.getrefcount(jobs[0])
    # Not in an assert: pytest keeps the values an assert compares.
    first_taken = target.pop() is jobs[0]
    assert (first_taken, sys.getrefcount(jobs[0])) == (True, held - 1)
    # The same when the level runs empty and is cleared, and for a stale entry dropped.
    cancel(target, jobs[1])
    stale_held, last_held = sys.getrefcount(jobs[1]), sys.getrefcount(jobs[2])
    last_taken = target.pop() is jobs[2]
    after = sys.getrefcount(jobs[1]), sys.getrefcount(jobs[2])
    assert (last_taken, after) == (True, (stale_held - 1, last_held - 1))
