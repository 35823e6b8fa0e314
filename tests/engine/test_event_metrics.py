"""The event log's counters for /metrics: job events by type, queue and function, and the
wait and run time histograms, fed by the engine's transitions."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from jobwire.engine.events import TIME_BUCKETS, EventLog, Histogram, TimeHistogram
from tests.engine.fakes import Harness


def test_histogram_counts_each_value_in_its_bucket() -> None:
    hist = Histogram((1.0, 2.0))
    for value in (0.5, 1.0, 1.5, 7.0):
        hist.observe(value)
    assert hist.counts == [2, 1, 1]  # <= 1, <= 2, the rest
    assert hist.total == 10.0
    assert len(Histogram().counts) == len(TIME_BUCKETS) + 1


@given(
    st.lists(
        st.sampled_from(TIME_BUCKETS)
        | st.floats(min_value=0.0, max_value=10_000.0)
        | st.floats(min_value=0.0, max_value=0.01),
        max_size=30,
    )
)
def test_the_time_histogram_counts_as_the_general_one(values: list[float]) -> None:
    """`TimeHistogram` writes the bounds out as constants: it must bucket as `Histogram`
    over `TIME_BUCKETS` does, values on a bound included."""
    fast, general = TimeHistogram(), Histogram(TIME_BUCKETS)
    for value in values:
        fast.observe(value)
        general.observe(value)
    assert fast.counts == general.counts
    assert fast.total == general.total
    assert fast.bounds == general.bounds


def test_events_are_counted_by_queue_and_function_with_wait_and_run_times() -> None:
    harness = Harness()
    engine = harness.engine
    log = EventLog(100, clock=harness.clock)
    engine.event_log = log
    worker = harness.worker("resize").session
    job, _ = engine.submit("resize", b"x", queue="images")
    engine.submit("other", b"y")
    harness.clock.advance(2.0)  # waits two seconds
    assert engine.grab(worker) is job
    harness.clock.advance(0.3)  # runs 0.3 seconds
    engine.complete(job, b"done")
    assert log.counts["job.enqueued"] == {"images": {"resize": 1}, "other": {"other": 1}}
    assert log.counts["job.started"] == {"images": {"resize": 1}}
    assert log.counts["job.completed"] == {"images": {"resize": 1}}
    assert log.started_by_protocol == {"test": 1}
    assert sum(log.wait_times.counts) == 1 and abs(log.wait_times.total - 2.0) < 1e-6
    assert sum(log.run_times.counts) == 1 and abs(log.run_times.total - 0.3) < 1e-6


def test_a_job_discarded_before_it_ran_counts_as_expired() -> None:
    harness = Harness()
    engine = harness.engine
    log = EventLog(100, clock=harness.clock)
    engine.event_log = log
    job, _ = engine.submit("late", b"x")
    engine.expire(job)
    assert log.counts["job.expired"] == {"late": {"late": 1}}
    assert log.counts["job.discarded"] == {}
    assert [e.type for e in log.query()][-1] == "job.discarded"  # the log keeps its name


def test_throughput_adds_up_the_tallies_of_every_origin() -> None:
    harness = Harness()
    engine = harness.engine
    log = EventLog(100, clock=harness.clock)
    engine.event_log = log
    worker = harness.worker("resize").session
    job, _ = engine.submit("resize", b"x", queue="images", origin=1)
    engine.submit("resize", b"y", queue="images", origin=2)
    late, _ = engine.submit("late", b"z")
    engine.expire(late)  # expired: not a failure
    assert engine.grab(worker) is job
    engine.complete(job, b"done")
    assert log.throughput() == (3, 1, 0, {"images": 1})
    assert log.counts["job.enqueued"] == {"images": {"resize": 2}, "late": {"late": 1}}
