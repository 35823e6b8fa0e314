"""Test doubles for driving the engine without sockets or wall-clock time."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from jobwire.engine import (
    Dispatch,
    Engine,
    EngineConfig,
    Job,
    JobState,
    Output,
    WorkerSession,
)

START = 1_700_000_000.0


class FakeClock:
    """The engine's clock: time moves only when a test says so."""

    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


class RecordingHandler:
    """A WorkerHandler that records every call, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []  # (what, job id or "")
        self.assigned: list[Job] = []
        self.revoked: list[tuple[Job, str]] = []

    @property
    def wakes(self) -> int:
        return sum(1 for what, _ in self.calls if what == "wake")

    def wake(self) -> None:
        self.calls.append(("wake", ""))

    def assign(self, job: Job) -> None:
        self.calls.append(("assign", job.id))
        self.assigned.append(job)

    def revoke(self, job: Job, reason: str) -> None:
        self.calls.append(("revoke", job.id))
        self.revoked.append((job, reason))


class Told(Enum):
    """What a subscriber was told, flattened for assertions."""

    STATUS = "status"  # job_progress: data is b"DONE/TOTAL"
    DATA = "data"  # job_output(Output.DATA)
    WARNING = "warning"  # job_output(Output.WARNING)
    COMPLETE = "complete"  # job_finished(COMPLETED): data is the result
    FAIL = "fail"  # job_finished(not completed, no error detail)
    EXCEPTION = "exception"  # job_finished(DISCARDED) with the worker's detail as data


@dataclass(eq=False)  # identity: two clients are never the same subscriber
class RecordingSubscriber:
    """A foreground client: records every job event it is told."""

    name: str = "client"
    events: list[tuple[str, Told, bytes]] = field(default_factory=list)

    def job_progress(self, job: Job, done: int, total: int) -> None:
        self.events.append((job.id, Told.STATUS, b"%d/%d" % (done, total)))

    def job_output(self, job: Job, kind: Output, data: bytes) -> None:
        told = Told.DATA if kind is Output.DATA else Told.WARNING
        self.events.append((job.id, told, data))

    def job_finished(
        self, job: Job, state: JobState, result: bytes | None, error: bytes | None
    ) -> None:
        if state is JobState.COMPLETED:
            self.events.append((job.id, Told.COMPLETE, result or b""))
        elif error is not None:
            self.events.append((job.id, Told.EXCEPTION, error))
        else:
            self.events.append((job.id, Told.FAIL, b""))

    def kinds(self) -> list[Told]:
        return [event for _, event, _ in self.events]


@dataclass
class FakeWorker:
    session: WorkerSession
    handler: RecordingHandler


class Harness:
    """An engine on a fake clock, and helpers to add workers to it."""

    def __init__(
        self,
        *,
        job_retries: int | None = None,
        worker_wakeup: int = 1,
        retain_finished: float = 0.0,
    ) -> None:
        self.clock = FakeClock()
        config = EngineConfig(
            job_retries=job_retries,
            worker_wakeup=worker_wakeup,
            id_prefix="H:test",
            retain_finished=retain_finished,
        )
        self.engine = Engine(config, clock=self.clock)
        self._ids = 0

    def worker(
        self,
        *functions: str,
        dispatch: Dispatch = Dispatch.WAKE,
        capacity: int | None = None,
        timeout: float | None = None,
    ) -> FakeWorker:
        self._ids += 1
        handler = RecordingHandler()
        session = WorkerSession(
            f"w{self._ids}", handler, protocol="test", dispatch=dispatch, capacity=capacity
        )
        self.engine.add_worker(session)
        for name in functions:
            self.engine.add_ability(session, name, timeout)
        return FakeWorker(session, handler)

    def advance(self, seconds: float) -> float | None:
        """Move the clock and fire what is due; return the next deadline."""
        self.clock.advance(seconds)
        return self.engine.run_timers()
