"""Test doubles for driving the engine without sockets or wall-clock time."""

from __future__ import annotations

from dataclasses import dataclass, field

from jobwire.engine import (
    Dispatch,
    Engine,
    EngineConfig,
    Job,
    JobEvent,
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


@dataclass(eq=False)  # identity: two clients are never the same subscriber
class RecordingSubscriber:
    """A foreground client: records every job event it is told."""

    name: str = "client"
    events: list[tuple[str, JobEvent, bytes]] = field(default_factory=list)

    def job_event(self, job: Job, event: JobEvent, data: bytes) -> None:
        self.events.append((job.id, event, data))

    def kinds(self) -> list[JobEvent]:
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
            handle_prefix="H:test",
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
