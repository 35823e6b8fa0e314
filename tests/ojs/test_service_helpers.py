"""The OJS binding's helpers beside the engine: dead letter queue, worker liveness, rate
limits, the event log's snapshots (server/ojs/deadletter_queue.py, liveness.py,
ratelimit.py, eventkeeper.py), on a fake clock."""

from __future__ import annotations

import json

import pytest

from jobwire.engine import Dispatch, JobState, UnknownJob
from jobwire.engine.events import EventLog
from jobwire.server.ojs import eventkeeper
from jobwire.server.ojs.deadletter_queue import DeadLetter
from jobwire.server.ojs.eventkeeper import EventKeeper
from jobwire.server.ojs.liveness import WorkerLiveness
from jobwire.server.ojs.ratelimit import QueueRateLimits
from tests.engine.fakes import Harness


@pytest.fixture
def h() -> Harness:
    return Harness()


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


class DictKV:
    """A key-value store in a dict (what a durable store keeps)."""

    def __init__(self) -> None:
        self.records: dict[tuple[str, str], bytes] = {}

    def kv_load(self, namespace: str) -> dict[str, bytes]:
        return {k: v for (ns, k), v in self.records.items() if ns == namespace}

    def kv_put(self, namespace: str, key: str, value: bytes | None) -> None:
        if value is None:
            self.records.pop((namespace, key), None)
        else:
            self.records[(namespace, key)] = value


def _held(events: EventLog) -> list[tuple[int, str, str, dict[str, object]]]:
    return [(e.seq, e.type, e.subject, e.data) for e in events.snapshot()]


def _reloaded(kv: DictKV, capacity: int) -> EventLog:
    """The event log a new start would restore from `kv`."""
    events = EventLog(capacity, clock=lambda: 1.0)
    EventKeeper(events, kv).load()
    return events


def test_event_snapshots_write_new_events_and_restore_the_ring(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each snapshot writes the events since the one before as a chunk, deletes the chunks
    that left the ring, merges them past MAX_CHUNKS; what a start restores is the ring as
    it was at the latest snapshot, through wrap-arounds, merges and a reset."""
    monkeypatch.setattr(eventkeeper, "MAX_CHUNKS", 3)
    kv = DictKV()
    events = EventLog(5, clock=lambda: 1.0)
    keeper = EventKeeper(events, kv)
    keeper.load()
    keeper.save()
    assert kv.records == {}
    n = 0
    for batch in (2, 1, 1, 1, 4, 9, 0, 3, 1, 1, 1, 1):
        for _ in range(batch):
            n += 1
            events.record("cron.triggered", f"s{n}", "q", {"n": n, "name": "f\udcff"})
        written = dict(kv.records)
        keeper.save()
        if batch:
            new = set(kv.records) - set(written)
            assert len(new) <= 1  # the new events, or the whole ring merged
        else:
            assert kv.records == written
        assert _held(_reloaded(kv, 5)) == _held(events)
        assert len(kv.records) <= 3
        assert len(kv.records) == len(keeper.chunks)
    assert _held(_reloaded(kv, 2)) == _held(events)[-2:]  # a smaller ring: the newest
    events.clear()
    keeper.forget()
    keeper.save()
    assert kv.records == {}
    events.record("cron.triggered", "after", None, {})
    keeper.save()
    restored = _reloaded(kv, 5)
    assert _held(restored) == _held(events) != []
    assert restored.last_seq == events.last_seq == n + 1


def test_the_whole_ring_record_of_before_chunks_is_restored_then_deleted() -> None:
    kv = DictKV()
    old = [
        {"seq": seq, "type": "cron.triggered", "time": 1.0, "subject": f"s{seq}"}
        | {"queue": None, "data": {}}
        for seq in (7, 8, 9)
    ]
    kv.kv_put(eventkeeper.NAMESPACE, "log", json.dumps(old).encode())
    kv.kv_put(eventkeeper.NAMESPACE, "broken", b"{not json")
    events = EventLog(3, clock=lambda: 1.0)
    keeper = EventKeeper(events, kv)
    keeper.load()
    assert [e.seq for e in events.snapshot()] == [7, 8, 9]
    events.record("cron.triggered", "s10", None, {})
    keeper.save()
    assert sorted(kv.kv_load(eventkeeper.NAMESPACE)) == ["10", "log"]  # 8 and 9 still held
    for seq in (11, 12):
        events.record("cron.triggered", f"s{seq}", None, {})
    keeper.save()
    assert sorted(kv.kv_load(eventkeeper.NAMESPACE)) == ["10", "11"]
    assert [e.seq for e in _reloaded(kv, 3).snapshot()] == [10, 11, 12]
