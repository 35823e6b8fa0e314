"""The OJS binding's helpers beside the engine: dead letter queue, worker liveness, rate
limits (server/ojs/deadletter_queue.py, liveness.py, ratelimit.py), on a fake clock."""

from __future__ import annotations

import pytest

from jobwire.engine import Dispatch, JobState, UnknownJob
from jobwire.server.ojs.deadletter_queue import DeadLetter
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


def test_event_snapshots_encode_each_event_once_and_hold_the_ring() -> None:
    """The event log's snapshot keeps each event's text between snapshots; what it writes is
    always the whole ring as it is, through wrap-arounds and a reset."""
    import asyncio
    import json

    from jobwire.engine import Engine
    from jobwire.protocols.ojs.envelope import parse_push
    from jobwire.server.ojs.app import OJSOptions, OJSService
    from jobwire.server.runtime import Runtime

    def whole(service: OJSService) -> list[dict[str, object]]:
        return [
            {"seq": e.seq, "type": e.type, "time": e.time, "subject": e.subject}
            | {"queue": e.queue, "data": e.data}
            for e in service.events.snapshot()
        ]

    async def run() -> None:
        runtime = Runtime(Engine(), asyncio.get_running_loop())
        service = OJSService(runtime, OJSOptions(event_log_size=5))
        assert json.loads(service._events_json()) == []
        for batch in (2, 1, 4, 9, 0, 3):
            for n in range(batch):
                service.submit(parse_push({"type": "t", "args": [n], "queue": "q"}))
            assert json.loads(service._events_json()) == whole(service)
            assert len(service._event_texts) == len(service.events) <= 5
        service.reset()
        assert json.loads(service._events_json()) == []
        service.submit(parse_push({"type": "t", "args": ["after"]}))
        assert json.loads(service._events_json()) == whole(service) != []

    asyncio.run(run())
