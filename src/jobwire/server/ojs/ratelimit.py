"""Delivery rate limits. Per queue (`rate_limit.max_per_second`): at most N jobs handed
out per queue in any one second. Per key (the rate-limiting extension, `KeyedLimits`).

A sliding one-second window of delivery times per limited queue; fetches ask how many jobs
they may take (`allowance`) and report what they took (`taken`). Unlimited queues cost one
dict look-up. On a cluster the limits are the nodes' (`jobwire.store.pgrates`), and a fetch
also takes from the budget they share.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Any

from jobwire.engine.job import Job, JobState

if TYPE_CHECKING:
    from jobwire.engine.engine import JobObserver
    from jobwire.ports.cluster import ClusterView

WINDOW = 1.0


class QueueRateLimits:
    def __init__(self) -> None:
        self._limits: dict[str, int] = {}
        self._recent: dict[str, deque[float]] = {}

    def set(self, queue: str, per_second: int | None) -> None:
        """Limit `queue` to `per_second` deliveries per second; None lifts the limit."""
        if per_second is None:
            self._limits.pop(queue, None)
            self._recent.pop(queue, None)
        else:
            self._limits[queue] = per_second
            self._recent.setdefault(queue, deque())

    def limit(self, queue: str) -> int | None:
        return self._limits.get(queue)

    def allowance(self, queue: str, now: float) -> int | None:
        """Jobs `queue` may still hand out now; None when it is not limited."""
        limit = self._limits.get(queue)
        if limit is None:
            return None
        recent = self._recent[queue]
        while recent and recent[0] <= now - WINDOW:
            recent.popleft()
        return max(0, limit - len(recent))

    def taken(self, queue: str, count: int, now: float) -> None:
        recent = self._recent.get(queue)
        if recent is not None:
            recent.extend([now] * count)

    def clear(self) -> None:
        self._limits.clear()
        self._recent.clear()


#: The rate-limiting extension's periods, in seconds.
PERIODS = {"second": 1.0, "minute": 60.0, "hour": 3600.0, "day": 86400.0}


class Partition:
    """One key's limits (the latest a submitted job declared) and what it holds now."""

    __slots__ = ("active", "concurrency", "key", "period", "rate", "started")

    def __init__(self, key: str) -> None:
        self.key = key
        self.concurrency: int | None = None
        self.rate: int | None = None
        self.period = "second"
        self.active: set[Job] = set()  # jobs of the key handed out, pruned when looked at
        self.started: deque[float] = deque()  # start times within the period

    @property
    def window(self) -> float:
        return PERIODS[self.period]

    def prune(self, now: float) -> None:
        self.active = {job for job in self.active if job.state is JobState.ACTIVE}
        window = PERIODS[self.period]
        started = self.started
        while started and started[0] <= now - window:
            started.popleft()

    def admits(self, now: float) -> bool:
        self.prune(now)
        if self.concurrency is not None and len(self.active) >= self.concurrency:
            return False
        return self.rate is None or len(self.started) < self.rate

    def as_json(self, now: float) -> dict[str, Any]:
        self.prune(now)
        return {
            "key": self.key,
            "concurrency": self.concurrency,
            "rate": self.rate,
            "period": self.period if self.rate is not None else None,
            "active": len(self.active),
            "started_in_period": len(self.started),
            "available": self.admits(now),
        }


class KeyedLimits:
    """The rate-limiting extension's partitions by key (`options.rate_limit.key`): at most
    `concurrency` jobs of a key active at once and at most `rate` started per `period`,
    across queues. Checked when a fetch takes a job of a limited key; a job over its key's
    limit waits in its queue (`on_limit: "wait"`). Jobs without a key cost nothing."""

    def __init__(self) -> None:
        self._keys: dict[str, Partition] = {}
        self._cluster: ClusterView | None = None
        self._observers: list[JobObserver] | None = None  # the engine's, until watched
        self._slots: set[str] = set()  # jobs holding a slot of the cluster's, by id
        self._stopped: list[str] = []  # of those, the ones that stopped running here

    def declare(self, limit: dict[str, Any]) -> None:
        """A job was submitted with this keyed limit: the key's limits are the latest."""
        key = limit["key"]
        part = self._keys.get(key)
        if part is None:
            part = self._keys[key] = Partition(key)
        part.concurrency = limit.get("concurrency")
        part.rate = limit.get("rate")
        part.period = limit.get("period") or "second"

    def partition(self, key: str) -> Partition | None:
        return self._keys.get(key)

    def take(self, job: Job, now: float) -> bool:
        """May the fetch hand `job` out? If so it counts against its key from now."""
        limit = (job.ext or {}).get("rate_limit")
        if not isinstance(limit, dict):
            return True
        part = self._keys.get(limit["key"])
        if part is None:  # restored after a restart: its limits come back with the job
            self.declare(limit)
            part = self._keys[limit["key"]]
        if not part.admits(now):
            return False
        part.active.add(job)
        part.started.append(now)
        return True

    def untake(self, job: Job) -> None:
        """Undo `take`: the cluster's shared limits refused the job."""
        part = self._keys.get(job.ext["rate_limit"]["key"]) if job.ext else None
        if part is not None:
            part.active.discard(job)
            if part.started:
                part.started.pop()

    def share(self, cluster: ClusterView, observers: list[JobObserver]) -> None:
        """A cluster node: keys' limits hold across the nodes (`take_shared`)."""
        self._cluster = cluster
        self._observers = observers

    async def take_shared(self, jobs: list[Job]) -> list[Job]:
        """Of the jobs a fetch took on this node's limits, those the cluster's shared
        limits of their keys also let run now (the others are untaken). One statement for
        all of them; none for a fetch without keyed jobs."""
        asked: list[tuple[str, str, int | None, int | None, float]] = []
        keyed: list[Job] = []
        for job in jobs:
            limit = (job.ext or {}).get("rate_limit")
            if isinstance(limit, dict):
                part = self._keys[limit["key"]]
                asked.append((part.key, job.id, part.concurrency, part.rate, part.window))
                keyed.append(job)
        cluster = self._cluster
        if not keyed or cluster is None:
            return jobs
        if self._observers is not None:  # watch jobs end from the first keyed job on
            self._observers.append(self._observed)
            self._observers = None
        granted = await cluster.take_keyed(asked)
        refused: set[Job] = set()
        for job, ask, ok in zip(keyed, asked, granted, strict=True):
            if not ok:
                refused.add(job)
                self.untake(job)
            elif ask[2] is not None:
                self._slots.add(job.id)
        return [job for job in jobs if job not in refused]

    def _observed(self, _event: str, job: Job) -> None:
        """A keyed job holding a cluster slot that stopped running here frees it (batched
        per turn of the loop)."""
        if job.id in self._slots and job.state is not JobState.ACTIVE:
            self._slots.discard(job.id)
            if not self._stopped:
                asyncio.get_running_loop().call_soon(self._release)
            self._stopped.append(job.id)

    def _release(self) -> None:
        stopped, self._stopped = self._stopped, []
        if self._cluster is not None and stopped:
            self._cluster.release_keyed(stopped)

    def clear(self) -> None:
        self._keys.clear()
        self._slots.clear()
