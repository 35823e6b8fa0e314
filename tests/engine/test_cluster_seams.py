"""The engine's seams for a cluster (jobwire.store.pgcluster): the hooks that tell it a
worker waits for work, and `release`, which lets a queued job go to another node."""

from __future__ import annotations

from jobwire.engine import Dispatch, JobState, WorkerSession
from tests.engine.fakes import Harness


def test_a_worker_that_finds_no_work_is_reported_whether_it_sleeps_or_grabs(h: Harness) -> None:
    idle: list[tuple[str, bool]] = []
    h.engine.on_idle_worker = lambda worker: idle.append((worker.id, worker.waiting))
    sleeper = h.worker("f")
    assert not h.engine.sleep(sleeper.session)
    grabber = h.worker("f")
    assert h.engine.grab(grabber.session) is None
    pusher = h.worker("f", dispatch=Dispatch.PUSH)
    h.engine.request_work(pusher.session, 1)
    assert idle == [
        (sleeper.session.id, True),
        (grabber.session.id, False),
        (pusher.session.id, True),
    ]
    job, _ = h.engine.submit("f", b"x")
    idle.clear()
    assert h.engine.grab(grabber.session) is job  # found work: nothing to report
    assert idle == []


def test_a_fetch_that_comes_back_short_is_reported_with_what_it_missed(h: Harness) -> None:
    short: list[tuple[list[str], int]] = []
    h.engine.on_short_fetch = lambda queues, missing: short.append((list(queues), missing))
    h.engine.submit("f", b"x", queue="q")
    worker = WorkerSession("ojs:w", h.worker().handler, protocol="test", dispatch=Dispatch.PULL)
    assert len(h.engine.fetch(["q", "r"], 3, worker=worker)) == 1
    assert short == [(["q", "r"], 2)]


def test_a_released_job_leaves_the_engine_and_its_lane(h: Harness) -> None:
    kept, _ = h.engine.submit("f", b"kept")
    released, _ = h.engine.submit("f", b"released", unique="u")
    assert h.engine.release(released)
    assert h.engine.jobs.get(released.id) is None
    assert ("f", "u") not in h.engine.uniques
    assert h.engine.functions["f"].available == 1
    assert released.state is JobState.AVAILABLE  # still queued, elsewhere
    worker = h.worker("f")
    assert h.engine.grab(worker.session) is kept
    assert h.engine.grab(worker.session) is None
    assert not h.engine.release(kept)  # running here: it stays
    assert not h.engine.release(released)  # not here any more
