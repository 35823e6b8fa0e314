"""The timer heap behind every deadline (engine/timers.py)."""

from __future__ import annotations

from jobwire.engine.timers import TimerHeap


class Recorder:
    def __init__(self) -> None:
        self.fired: list[tuple[object, float]] = []

    def __call__(self, owner: object, when: float) -> None:
        self.fired.append((owner, when))


def test_empty_heap() -> None:
    heap = TimerHeap()
    assert len(heap) == 0
    assert heap.next_deadline() is None
    assert heap.run_due(100.0) is None


def test_fires_due_entries_in_time_order() -> None:
    heap, rec = TimerHeap(), Recorder()
    heap.add(30.0, rec, "c")
    heap.add(10.0, rec, "a")
    heap.add(20.0, rec, "b")
    assert heap.next_deadline() == 10.0
    assert heap.run_due(9.999) == 10.0
    assert rec.fired == []
    assert heap.run_due(20.0) == 30.0
    assert rec.fired == [("a", 10.0), ("b", 20.0)]
    assert len(heap) == 1
    assert heap.run_due(1000.0) is None
    assert rec.fired[-1] == ("c", 30.0)


def test_same_deadline_fires_in_insertion_order() -> None:
    heap, rec = TimerHeap(), Recorder()
    for owner in "xyz":
        heap.add(5.0, rec, owner)
    heap.run_due(5.0)
    assert [owner for owner, _ in rec.fired] == ["x", "y", "z"]


def test_owners_need_not_be_comparable() -> None:
    heap, rec = TimerHeap(), Recorder()
    a, b = object(), object()
    heap.add(1.0, rec, a)
    heap.add(1.0, rec, b)
    heap.run_due(1.0)
    assert [owner for owner, _ in rec.fired] == [a, b]


def test_callback_may_add_timers_and_due_ones_fire_in_the_same_run() -> None:
    heap = TimerHeap()
    fired: list[float] = []

    def chain(owner: object, when: float) -> None:
        fired.append(when)
        if when < 3:
            heap.add(when + 1, chain, owner)

    heap.add(1.0, chain, None)
    assert heap.run_due(2.5) == 3.0
    assert fired == [1.0, 2.0]
    assert heap.run_due(10.0) is None
    assert fired == [1.0, 2.0, 3.0]


def test_on_earlier_is_told_only_about_a_new_earliest_entry() -> None:
    heap, rec = TimerHeap(), Recorder()
    told: list[float] = []
    heap.on_earlier = told.append
    heap.add(10.0, rec, None)
    heap.add(20.0, rec, None)
    heap.add(10.0, rec, None)  # not earlier than the earliest
    heap.add(5.0, rec, None)
    assert told == [10.0, 5.0]
    heap.run_due(100.0)
    heap.add(50.0, rec, None)  # the heap was empty
    assert told == [10.0, 5.0, 50.0]
