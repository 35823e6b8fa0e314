"""Dead-worker detection for workers that promise heartbeats (OJS worker protocol).

A watched worker must beat within `timeout` seconds of its last beat. When it does not, it is
dead: `Engine.remove_worker` requeues every job it held (the attempt counts, so a job that
keeps killing its workers is eventually discarded) and marks it TERMINATED. Deadlines live on
the engine's timer heap; an entry whose worker has beaten since is stale and ignored.

Workers that never registered or beat (a runner that only fetches) are not watched: their
jobs come back through the visibility timeout alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from jobwire.engine.worker import WorkerSession, WorkerState

if TYPE_CHECKING:
    from jobwire.engine.engine import Engine

#: The reason dead workers' jobs are requeued with; shown as error `worker_death`.
WORKER_DEATH = "worker lost"


class WorkerLiveness:
    def __init__(
        self,
        engine: Engine,
        timeout: float,
        *,
        on_dead: Callable[[WorkerSession], None] | None = None,
    ) -> None:
        self.engine = engine
        self.timeout = timeout
        self.on_dead = on_dead
        self._deadlines: dict[WorkerSession, float] = {}

    def __contains__(self, worker: object) -> bool:
        return worker in self._deadlines

    def beat(self, worker: WorkerSession) -> float:
        """The worker is alive now; returns its new deadline."""
        self.engine.touch(worker)
        deadline = worker.last_seen + self.timeout
        self._deadlines[worker] = deadline
        self.engine.timers.add(deadline, self._check, worker)
        return deadline

    def forget(self, worker: WorkerSession) -> None:
        """Stop watching (the worker deregistered or was removed otherwise)."""
        self._deadlines.pop(worker, None)

    def clear(self) -> None:
        self._deadlines.clear()

    def _check(self, worker: WorkerSession, when: float) -> None:
        if self._deadlines.get(worker) != when:
            return  # it beat since this entry was set, or is no longer watched
        del self._deadlines[worker]
        if worker.state is WorkerState.TERMINATED:
            return
        self.engine.remove_worker(worker, WORKER_DEATH)
        if self.on_dead is not None:
            self.on_dead(worker)
