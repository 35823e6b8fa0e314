"""The event log's ring of columns, against a plain list of events as the model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from jobwire.engine import JobState
from jobwire.engine.events import JOB_EVENTS, Event, EventLog
from jobwire.engine.job import Job
from tests.engine.fakes import Harness


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        self.now += 0.5
        return self.now


def as_tuple(event: Event) -> tuple[Any, ...]:
    return (event.seq, event.type, event.time, event.subject, event.queue, event.data)


class Model:
    """What the log must answer: every event kept whole, in a list."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.events: list[tuple[Any, ...]] = []
        self.seq = 0

    def add(self, event: Event) -> None:
        self.seq += 1
        assert event.seq == self.seq
        if self.capacity:
            self.events = [*self.events, as_tuple(event)][-self.capacity :]

    def query(self, types: set[str], queues: set[str], after: int, limit: int) -> list[Any]:
        found = [
            e
            for e in self.events
            if e[0] > after and (not types or e[1] in types) and (not queues or e[4] in queues)
        ]
        if limit <= 0:
            return []
        return found[:limit] if after else found[-limit:]


def job_event(kind: str, number: int, queue: str, attempts: int, seq: int, now: float) -> Event:
    """The event the log must report for a job event (as the snapshot it took)."""
    state = JobState.COMPLETED if kind == "job.completed" else JobState.ACTIVE
    data: dict[str, Any] = {
        "job_id": f"j{number}",
        "job_type": "f",
        "queue": queue,
        "attempt": attempts,
        "state": state.name.lower(),
    }
    if kind in ("job.completed", "job.discarded"):
        data["duration_ms"] = 1500
    return Event(seq, kind, now, f"j{number}", queue, data)


FINISHED = ("job.completed", "job.discarded", "job.cancelled")

operations = st.lists(
    st.one_of(
        st.tuples(st.just("job"), st.sampled_from(JOB_EVENTS), st.sampled_from(["a", "b"])),
        st.tuples(st.just("record"), st.just("cron.triggered"), st.just("a")),
        st.tuples(st.just("clear"), st.just(""), st.just("")),
        st.tuples(
            st.just("query"),
            st.sampled_from(["", "job.started", "cron.triggered"]),
            st.sampled_from(["", "a", "b"]),
            st.integers(0, 12),  # after
            st.integers(-1, 6),  # limit
        ),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(capacity=st.sampled_from([0, 1, 2, 5]), ops=operations)
def test_the_ring_answers_as_a_list_of_events_would(
    capacity: int, ops: list[tuple[Any, ...]]
) -> None:
    clock = Clock()
    log = EventLog(capacity, clock=clock)
    model = Model(capacity)
    for number, (op, kind, queue, *query) in enumerate(ops):
        if op == "job":
            job = Job(f"j{number}", "f", b"", queue)
            job.attempts = number % 3
            job.state = JobState.COMPLETED if kind == "job.completed" else JobState.ACTIVE
            job.started_at, job.finished_at = 10.0, 11.5
            log.observe(kind, job)
            job.attempts += 7  # later changes must not show in the recorded event
            job.state = JobState.DISCARDED
            # When: the start or end the engine set on the job, else the clock.
            at = {"job.started": 10.0}.get(kind, 11.5 if kind in FINISHED else clock.now)
            model.add(job_event(kind, number, queue, number % 3, model.seq + 1, at))
        elif op == "record":
            entry = log.record(kind, f"c{number}", queue, {"n": number})
            if capacity:
                assert entry is not None
                model.add(entry)
            else:
                assert entry is None
                model.seq += 1
        elif op == "clear":
            log.clear()
            model.events = []
        else:
            types = {kind} if kind else set()
            queues = {queue} if queue else set()
            after, limit = query
            got = log.query(types=types, queues=queues, after=after, limit=limit)
            assert [as_tuple(e) for e in got] == model.query(types, queues, after, limit)
        everything = [as_tuple(e) for e in log.query(limit=10)]
        assert everything == model.query(set(), set(), 0, 10)
        assert len(log) == len(model.events)


def test_a_started_event_names_its_worker_and_others_do_not(h: Harness) -> None:
    log = EventLog(10, clock=h.clock)
    h.engine.event_log = log
    w = h.worker("f")
    job, _ = h.engine.submit("f", b"")
    assert h.engine.grab(w.session) is job
    h.engine.complete(job, b"ok")
    workers = {e.type: e.data.get("worker_id") for e in log.query()}
    assert workers == {"job.enqueued": None, "job.started": w.session.name, "job.completed": None}


def test_finish_observers_hear_only_finished_jobs_after_the_observers(h: Harness) -> None:
    heard: list[tuple[str, str]] = []
    h.engine.observers.append(lambda event, job: heard.append(("every", event)))
    h.engine.finish_observers.append(lambda event, job: heard.append(("finish", event)))
    job, _ = h.engine.submit("f", b"", ext={"ojs": True})
    h.engine.cancel(job)
    assert heard == [
        ("every", "job.enqueued"),
        ("every", "job.cancelled"),
        ("finish", "job.cancelled"),
    ]


def test_finish_observers_hear_only_of_jobs_with_adapter_options(h: Harness) -> None:
    """A plain job (no `Job.ext`: a Gearman job, say) costs the finish observers nothing."""
    heard: list[str] = []
    h.engine.finish_observers.append(lambda event, job: heard.append(job.id))
    plain, _ = h.engine.submit("f", b"")
    h.engine.cancel(plain)
    with_options, _ = h.engine.submit("f", b"", ext={"ojs": True})
    h.engine.cancel(with_options)
    assert heard == [with_options.id]


def test_the_event_log_comes_first_and_its_failure_undoes_nothing(h: Harness) -> None:
    log = EventLog(10, clock=h.clock)
    # Makes observing a job.started raise (the harness's workers' protocol is "test").
    log._started_by_protocol["test"] = "broken"  # type: ignore[assignment]
    h.engine.event_log = log
    heard: list[tuple[str, int]] = []  # (event, the log's last sequence number by then)
    h.engine.observers.append(lambda event, job: heard.append((event, log.last_seq)))
    worker = h.worker("f").session
    job, _ = h.engine.submit("f", b"")
    assert h.engine.grab(worker) is job
    assert job.state is JobState.ACTIVE
    h.engine.complete(job, b"done")
    assert job.state is JobState.COMPLETED
    # Logged before the observers hear of it; the failed one is not logged, and is heard.
    assert heard == [("job.enqueued", 1), ("job.started", 1), ("job.completed", 2)]
