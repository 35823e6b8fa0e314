"""The engine: the one owner of jobs, queues, workers, leases and timers.

It knows nothing of bytes or sockets. Adapters call one method per request; the engine
changes state, tells its journal (the store's engine-facing port, `jobwire.ports`) of every
durable change, and tells the affected parties through their callbacks
(`Subscriber.job_progress/job_output/job_finished`, `WorkerHandler.wake/assign/revoke`).
Everything runs on the event loop thread, so there are no locks. It imports nothing from
`jobwire.store` or `jobwire.server`, and none of its names is a protocol's.
"""

from __future__ import annotations

import logging
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from mypy_extensions import i64

from jobwire.engine.errors import IllegalTransition, JobNotHeld, QueueFull
from jobwire.engine.events import EventLog
from jobwire.engine.job import (
    PRIORITY_HIGH,
    PRIORITY_LOW,
    PRIORITY_NORMAL,
    Job,
    JobState,
    Output,
    Subscriber,
)
from jobwire.engine.jobindex import JobIndex
from jobwire.engine.lanes import FunctionInfo, Lane
from jobwire.engine.timers import TimerHeap
from jobwire.engine.worker import Dispatch, WorkerSession, WorkerState
from jobwire.ports import Store, StoredJob, decode_ext
from jobwire.ports.journal import Journal, journal_of

_AVAILABLE: Final = JobState.AVAILABLE
_ACTIVE: Final = JobState.ACTIVE
_WAITING_STATES: Final = (JobState.SCHEDULED, JobState.RETRYABLE)
# Enum member lookups cost ~0.1 us each in Python 3.11: the per-job paths use these.
_COMPLETED: Final = JobState.COMPLETED
_DISCARDED: Final = JobState.DISCARDED
_RUNNING: Final = WorkerState.RUNNING
_PUSH: Final = Dispatch.PUSH

UniqueKey = tuple[str, str | bytes]
#: Told of every job transition as `observer(event, job)`; events: `jobwire.engine.events`.
JobObserver = Callable[[str, Job], None]

log = logging.getLogger("jobwire.engine")


@dataclass(slots=True)
class EngineConfig:
    #: Attempts before a job whose worker keeps vanishing is failed; None: unlimited.
    job_retries: int | None = None
    #: Sleeping workers woken per job that becomes available; 0 wakes all of them.
    worker_wakeup: int = 1
    #: Seconds after a wake-up before more sleepers are woken if the work still waits (a
    #: woken worker may be busy elsewhere, or its link dead); 0 disables the fallback.
    wakeup_fallback: float = 0.5
    #: Ids the engine gives are PREFIX:N (`jobwire.engine.jobindex`), as gearmand's handles
    #: H:<host>:N are; PREFIX defaults to H:<host>.
    id_prefix: str = ""
    #: Seconds a finished job stays visible to status queries; 0 forgets it at once.
    retain_finished: float = 0.0
    #: At most this many finished jobs are kept (oldest forgotten first), whatever their
    #: age, so a busy server's memory stays bounded.
    retain_finished_max: int = 100_000

    def __post_init__(self) -> None:
        if not self.id_prefix:
            # H:<host>, cut so that PREFIX:N (N up to 19 digits) stays within 64 bytes.
            self.id_prefix = f"H:{socket.gethostname()}"[:44]


class QueueInfo:
    """A named queue (OJS queue; Gearman functions each have the queue of their own name)."""

    __slots__ = ("lanes", "name", "paused")

    def __init__(self, name: str) -> None:
        self.name = name
        self.lanes: dict[str, Lane] = {}  # function -> lane
        self.paused = False

    @property
    def available(self) -> int:
        return sum(lane.count for lane in self.lanes.values())


_FINISH_EVENTS = {
    JobState.COMPLETED: "job.completed",
    JobState.CANCELLED: "job.cancelled",
    JobState.DISCARDED: "job.discarded",
}


def _background_copy(source: Job | StoredJob) -> Job:
    """A new, queued background job with the identity and settings of `source` (a job being
    revived, or a stored row being replayed)."""
    job = Job(
        source.id,
        source.function,
        source.payload,
        source.queue,
        source.unique,
        source.priority,
        True,
        source.created_at,
        source.origin,
    )
    job.max_attempts = source.max_attempts
    job.reducer = source.reducer
    return job


def _each(subscribers: list[Subscriber]) -> list[Subscriber]:
    """The subscribers to tell: the list itself when it holds one (the common case), else a
    copy, because a subscriber may unsubscribe itself or another while it is told."""
    return subscribers if len(subscribers) == 1 else list(subscribers)


def _better(job: Job, best: Job | None) -> bool:
    """Higher priority first, then the older job."""
    return (
        best is None
        or job.priority > best.priority
        or (job.priority == best.priority and job.seq < best.seq)
    )


def _best_of(lanes: list[Lane]) -> Lane | None:
    """The lane whose head job goes first (see `_better`), or None if all are empty."""
    if len(lanes) == 1:  # most workers: nothing to compare (a lane's count is of live jobs)
        lane = lanes[0]
        return lane if lane.count else None
    best_lane: Lane | None = None
    best: Job | None = None
    for lane in lanes:
        if lane.count:
            head = lane.head()
            if head is not None and _better(head, best):
                best, best_lane = head, lane
    return best_lane


#: Job numbers reserved at a time (`Engine._reserve_numbers`): one journal write per block.
NUMBER_BLOCK: Final = 100_000
#: "000" to "999": the last three digits of a job id (`Engine.next_id`).
_LAST_DIGITS: Final = [f"{low:03d}" for low in range(1000)]


class Engine:
    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        clock: Callable[[], float] = time.time,
        journal: Journal | Store | None = None,
    ) -> None:
        """`journal`: the store's engine-facing port, told of every change of a background
        job; None, or a store that is not durable (the memory store), keeps nothing."""
        self.config = config or EngineConfig()
        self.clock = clock
        self._durable = journal is not None and journal.durable
        # A durable store is told of every job: natively, where it is compiled with us.
        self._journal: Journal = journal_of(journal) if journal is not None else Journal()
        self._id_prefix = self.config.id_prefix + ":"
        self.jobs = JobIndex(self._id_prefix)
        self.uniques: dict[UniqueKey, Job] = {}
        self.functions: dict[str, FunctionInfo] = {}
        # Grows when a lane is made or a function dropped: workers then find their lanes
        # again (`_find_lanes`); 0 is never current.
        self._lanes_version = 1
        self.queues: dict[str, QueueInfo] = {}
        self.workers: dict[str, WorkerSession] = {}
        self.timers = TimerHeap()
        # Plain integers, not itertools.count: next() is a generic call in compiled code.
        self._last_seq = 0
        self._last_number = 0
        # The ids of one thousand numbers share their head (`next_id`): the block of
        # numbers it is for, and the head, `PREFIX:` and the number without its last three
        # digits.
        self._id_block: i64 = 0
        self._id_head = ""
        # Numbers up to this one may have been given out before a restart: the journal
        # keeps it, raised a block at a time (`_reserve_numbers`), so no id is ever reused.
        self._numbers_reserved = 0
        #: Finished jobs kept for status queries (`retain_finished`), oldest first: each
        #: is forgotten `retain_finished` seconds after its `finished_at`.
        self._finished: deque[Job] = deque()
        #: Recorded first after each job transition; a direct call, as it runs for every job.
        self.event_log: EventLog | None = None
        #: Anything else to call after each job transition.
        self.observers: list[JobObserver] = []
        #: Dead letter, workflows, Titanic: called after the observers when a job that
        #: carries an adapter's options (`Job.ext`) finishes (completed, cancelled,
        #: discarded), so they cost the other transitions, and plain jobs, nothing.
        self.finish_observers: list[JobObserver] = []
        #: A cluster (`jobwire.store.pgcluster`): told when a worker waits for work of its
        #: functions, and when a fetch by queue found fewer jobs than asked for, so that it
        #: claims shared jobs for them (`replay` loads what it claims). None: no cluster.
        self.on_idle_worker: Callable[[WorkerSession], None] | None = None
        self.on_short_fetch: Callable[[Sequence[str], int], None] | None = None
        #: A cluster with other nodes: claims up to `missing` shared jobs of the queues into
        #: this engine now, answering how many; a fetch that came back short awaits it and
        #: takes again before it answers. None: no cluster, the fetch answers at once.
        self.claim_for_fetch: Callable[[Sequence[str], int], Awaitable[int]] | None = None
        #: A cluster with other nodes: asked of each new job with a unique key that would be
        #: available at once; True: another node may hold its key, so the job stays PENDING
        #: until the store has settled it (`activate`, or `withdraw_pending` if it lost).
        self.hold_unique: Callable[[Job], bool] | None = None

    # ------------------------------------------------------------------ ids and registry

    def next_id(self) -> str:
        """The id of the next job the engine numbers (`_last_number` is its number).

        `PREFIX:N` is the head of N's block of a thousand numbers and N's last three digits,
        each made once: formatting N and joining it to the prefix cost 2.5 times more.
        """
        number: i64 = self._last_number + 1
        self._last_number = number
        if number > self._numbers_reserved:
            self._reserve_numbers(number)
        if number < 1000:
            return f"{self._id_prefix}{number}"
        block = number // 1000
        if block != self._id_block:  # also after `_last_number` moved (replay)
            self._id_block = block
            self._id_head = f"{self._id_prefix}{block}"
        return self._id_head + _LAST_DIGITS[number % 1000]

    def _reserve_numbers(self, number: int) -> None:
        """Numbers up to a block past `number` may be given out: a durable journal keeps the
        ceiling, and a replay starts above it (`replay`), so ids are never reused even when
        every job numbered before a restart has finished."""
        self._numbers_reserved = number + NUMBER_BLOCK
        if self._durable:
            self._journal.numbers_reserved(self._numbers_reserved)

    def function(self, name: str) -> FunctionInfo:
        """The function's record, created on first mention (as gearmand's are)."""
        fn = self.functions.get(name)
        if fn is None:
            fn = self.functions[name] = FunctionInfo(name)
        return fn

    def queue(self, name: str) -> QueueInfo:
        info = self.queues.get(name)
        if info is None:
            info = self.queues[name] = QueueInfo(name)
        return info

    def _lane(self, fn: FunctionInfo, queue: str) -> Lane:
        lane = fn.lanes.get(queue)
        if lane is None:
            lane = fn.lane(queue)
            self.queue(queue).lanes[fn.name] = lane
            self._lanes_version += 1  # workers of `fn` may take from it
        return lane

    def drop_function(self, name: str) -> None:
        """Forget an idle function. Raises KeyError if unknown, IllegalTransition if busy."""
        fn = self.functions[name]
        if fn.workers or fn.total:
            raise IllegalTransition("there are still connected workers or executing clients")
        del self.functions[name]
        self._lanes_version += 1
        for queue_name in fn.lanes:
            info = self.queues.get(queue_name)
            if info is not None:
                info.lanes.pop(name, None)

    def set_queue_limits(self, name: str, high: int, normal: int, low: int) -> None:
        fn = self.functions.get(name)
        if fn is not None:
            fn.queue_limits = (high, normal, low)

    # ------------------------------------------------------------------ submission

    @staticmethod
    def unique_key(function: str, unique: str | None, payload: bytes) -> UniqueKey | None:
        """Coalescing key: none for an empty unique; `-` coalesces on identical payloads."""
        if not unique:
            return None
        if unique == "-":
            return (function, payload)
        return (function, unique)

    def submit(
        self,
        function: str,
        payload: bytes,
        *,
        unique: str | None = None,
        priority: int = PRIORITY_NORMAL,
        background: bool = True,
        subscriber: Subscriber | None = None,
        run_at: float | None = None,
        queue: str | None = None,
        job_id: str | None = None,
        reducer: str | None = None,
        max_attempts: int | None = None,
        lease_timeout: float | None = None,
        pending: bool = False,
        ext: dict[str, Any] | None = None,
        origin: int = 0,
    ) -> tuple[Job, bool]:
        """Add a job, or join the live job with the same unique key.

        `origin`: the `Origin` of the listener it came through. Returns the job and whether
        it was created. Raises QueueFull.
        """
        key = self.unique_key(function, unique, payload) if unique else None
        if key is not None:
            existing = self.uniques.get(key)
            if existing is not None:
                self._join(existing, background, subscriber)
                return existing, False
        fn = self.functions.get(function) or self.function(function)
        if fn.queue_limits is not None:
            self._check_queue_limits(fn, priority)
        now = self.clock()
        numbered = job_id is None
        if job_id is None:
            job_id = self.next_id()
        job = Job(
            job_id,
            function,
            payload,
            queue,
            unique,
            priority,
            background,
            now,
            origin,
        )
        job.max_attempts = max_attempts if max_attempts is not None else self.config.job_retries
        job.lease_timeout = lease_timeout
        job.reducer = reducer
        job.ext = ext
        if numbered:
            job.number = self._last_number
        self.jobs.add(job)
        if key is not None:
            self.uniques[key] = job
        if subscriber is not None:
            job.subscribers = [subscriber]
        if run_at is not None and run_at > now:
            self._schedule(job, fn, run_at, JobState.SCHEDULED)
        elif pending or (
            key is not None and self.hold_unique is not None and self.hold_unique(job)
        ):
            job.state = JobState.PENDING
        else:
            self._make_available(job, fn)
        self._accepted(job)
        return job, True

    def enqueue(
        self,
        function: str,
        payload: bytes,
        priority: int = PRIORITY_NORMAL,
        background: bool = True,
        subscriber: Subscriber | None = None,
        unique: str | None = None,
        now: float = 0.0,
        origin: int = 0,
    ) -> tuple[Job, bool]:
        """`submit` without options other than a unique key: the hot path of every protocol.

        Positional arguments only, because keyword arguments cost more than the rest of
        the call. `now`: when the request arrived (the clock's time, which it reads if 0);
        the submits of one read share it, and with it their jobs' `created_at`. `origin`:
        the `Origin` of the listener it came through. Returns
        the job and whether it was created. Raises QueueFull.
        """
        key = None
        if unique:
            key = self.unique_key(function, unique, payload)
            existing = self.uniques.get(key) if key is not None else None
            if existing is not None:
                self._join(existing, background, subscriber)
                return existing, False
        fn = self.functions.get(function) or self.function(function)
        if fn.queue_limits is not None:
            self._check_queue_limits(fn, priority)
        job = Job(
            self.next_id(),
            function,
            payload,
            None,
            unique,
            priority,
            background,
            now or self.clock(),
            origin,
        )
        if self.config.job_retries is not None:
            job.max_attempts = self.config.job_retries
        job.number = self._last_number
        self.jobs.add(job)
        if key is not None:
            self.uniques[key] = job
        if subscriber is not None:
            job.subscribers = [subscriber]
        if key is not None and self.hold_unique is not None and self.hold_unique(job):
            job.state = JobState.PENDING
        else:
            self._make_available(job, fn)
        if self._durable or self.event_log is not None or self.observers:
            self._accepted(job)
        return job, True

    def _join(self, existing: Job, background: bool, subscriber: Subscriber | None) -> None:
        """A submission with the unique key of a live job joins that job."""
        if subscriber is not None:
            self.subscribe(existing, subscriber)
        if background and not existing.background:
            # A background submit makes the job outlive its foreground clients.
            existing.background = True
            if self._durable:
                self._journal.job_saved(existing)

    def _accepted(self, job: Job) -> None:
        """Log a new job to the store and tell the observers."""
        if job.background and self._durable:
            self._journal.job_saved(job)
        if self.event_log is not None or self.observers:
            scheduled = job.state is JobState.SCHEDULED
            self._observe("job.scheduled" if scheduled else "job.enqueued", job)

    def _check_queue_limits(self, fn: FunctionInfo, priority: int) -> None:
        assert fn.queue_limits is not None
        high, normal, low = fn.queue_limits
        if priority >= PRIORITY_HIGH:
            limit = high
        elif priority <= PRIORITY_LOW:
            limit = low
        else:
            limit = normal
        if limit > 0 and fn.total >= limit:
            raise QueueFull("Job queue is full")

    def activate(self, job: Job) -> None:
        """PENDING -> AVAILABLE."""
        if job.state is not JobState.PENDING:
            raise IllegalTransition(f"cannot activate a {job.state.name.lower()} job")
        self._make_available(job, self.function(job.function))
        if self._durable and job.background:
            self._journal.job_saved(job)  # a restart must not stage it again

    # ------------------------------------------------------------------ queueing

    def _make_available(self, job: Job, fn: FunctionInfo, *, front: bool = False) -> None:
        job.state = _AVAILABLE
        if not front:
            self._last_seq += 1
            job.seq = self._last_seq
        lane = fn.lanes.get(job.queue) or self._lane(fn, job.queue)
        lane.push(job, front)
        if fn.waiters:
            self._notify(fn, job)

    def _schedule(self, job: Job, fn: FunctionInfo, when: float, state: JobState) -> None:
        job.state = state
        job.run_at = when
        fn.scheduled += 1
        self.timers.add(when, self._on_due, job)

    def _on_due(self, job: Job, when: float) -> None:
        if job.state in _WAITING_STATES and job.run_at == when:
            fn = self.function(job.function)
            fn.scheduled -= 1
            job.run_at = None
            self._make_available(job, fn)
            if self.observers:  # not an event of the log: it says nothing a client asked
                self._tell_observers(self.observers, "job.due", job)

    def _notify(self, fn: FunctionInfo, job: Job) -> None:
        """Tell waiting workers about a job that became available: wake or push."""
        limit = self.config.worker_wakeup
        told = 0
        for worker in list(fn.waiters):
            if not worker.accepts_queue(job.queue):
                continue
            if worker.dispatch is _PUSH:
                self._push_work(worker)
            else:
                self._stop_waiting(worker)
                worker.handler.wake()
                if limit and not fn.fallback_armed and self.config.wakeup_fallback > 0:
                    fn.fallback_armed = True
                    when = self.clock() + self.config.wakeup_fallback
                    self.timers.add(when, self._on_wake_fallback, fn)
            told += 1
            if (limit and told >= limit) or job.state is not _AVAILABLE:
                return

    def _on_wake_fallback(self, fn: FunctionInfo, _when: float) -> None:
        """Work still waits after its wake-ups: the woken may never grab, so wake others.

        Waking only as many sleepers as there are jobs avoids gearmand's NOOP storm, but a
        woken worker that is busy elsewhere or silently gone would otherwise strand the job
        while its peers sleep (gearmand #343). One timer per function, armed on demand.
        """
        fn.fallback_armed = False
        if self.functions.get(fn.name) is not fn or not fn.waiters:
            return
        for lane in list(fn.lanes.values()):
            for _ in range(min(lane.count, len(fn.waiters))):
                head = lane.head()
                if head is None:
                    break
                self._notify(fn, head)

    def _wait(self, worker: WorkerSession) -> None:
        worker.waiting = True
        for name in worker.abilities:
            self.function(name).waiters[worker] = None
        if self.on_idle_worker is not None:
            self.on_idle_worker(worker)

    def _is_waiting(self, worker: WorkerSession) -> bool:
        """Asleep (WAKE) or holding push credit: in every waiter list of its functions."""
        name = next(iter(worker.abilities), None)
        fn = self.functions.get(name) if name is not None else None
        return fn is not None and worker in fn.waiters

    def _pass_on_wake(self, names: Iterable[str]) -> None:
        """An awake worker will not take work of these functions: it may have been woken
        for some of it, so wake sleepers for what is queued (no job is left stranded)."""
        for name in names:
            fn = self.functions.get(name)
            if fn is not None and fn.waiters:
                for lane in list(fn.lanes.values()):
                    head = lane.head()
                    if head is not None:
                        self._notify(fn, head)

    def _stop_waiting(self, worker: WorkerSession) -> None:
        if not worker.waiting:  # called on every grab: most often there is nothing to undo
            return
        worker.waiting = False
        functions = self.functions
        for name in worker.abilities:
            fn = functions.get(name)
            # `in` and `del` compile to native dict operations; pop(key, default) does not.
            if fn is not None and worker in fn.waiters:
                del fn.waiters[worker]

    # ------------------------------------------------------------------ workers

    def add_worker(self, worker: WorkerSession) -> None:
        worker.last_seen = self.clock()
        self.workers[worker.id] = worker

    def remove_worker(self, worker: WorkerSession, reason: str = "worker lost") -> None:
        """The worker is gone: forget it and requeue what it held."""
        awake = not self._is_waiting(worker)
        self._stop_waiting(worker)
        for name in worker.abilities:
            fn = self.functions.get(name)
            if fn is not None:
                fn.workers.pop(worker, None)
        self.workers.pop(worker.id, None)
        for job in list(worker.jobs.values()):
            self._requeue(job, reason)
        worker.state = WorkerState.TERMINATED
        if awake:
            self._pass_on_wake(worker.abilities)

    def add_ability(
        self, worker: WorkerSession, function: str, timeout: float | None = None
    ) -> None:
        worker.abilities[function] = timeout
        worker.lanes_version = 0
        fn = self.function(function)
        fn.workers[worker] = None

    def remove_ability(self, worker: WorkerSession, function: str) -> None:
        if function not in worker.abilities:
            return
        del worker.abilities[function]
        worker.lanes_version = 0
        fn = self.functions.get(function)
        if fn is not None:
            fn.workers.pop(worker, None)
            if worker in fn.waiters:
                del fn.waiters[worker]
            else:
                self._pass_on_wake((function,))

    def reset_abilities(self, worker: WorkerSession) -> None:
        for name in list(worker.abilities):
            self.remove_ability(worker, name)

    def set_worker_state(self, worker: WorkerSession, state: WorkerState) -> None:
        worker.state = state
        if state is not WorkerState.RUNNING:
            if not self._is_waiting(worker):
                self._pass_on_wake(worker.abilities)
            self._stop_waiting(worker)
        elif worker.dispatch is _PUSH:
            if worker.credit > 0:  # resumed: what it asked for while quiet, if there is any
                self._push_work(worker)
        elif worker.dispatch is Dispatch.WAKE and self._best_lane(worker) is not None:
            worker.handler.wake()  # resumed while work waits: it may be asleep

    def has_work(self, worker: WorkerSession) -> bool:
        return self._best_lane(worker) is not None

    def _best_lane(self, worker: WorkerSession) -> Lane | None:
        capacity = worker.capacity
        if worker.state is not _RUNNING or (capacity is not None and len(worker.jobs) >= capacity):
            return None
        if worker.lanes_version != self._lanes_version:
            self._find_lanes(worker)
        return _best_of(worker.lanes)

    def _find_lanes(self, worker: WorkerSession) -> None:
        """Work out the lanes `worker` may take jobs from, in the order of its abilities.

        Every grab and sleep looks at them: walking the worker's abilities and each one's
        lanes (two dicts) every time cost more than the rest of a grab. They change only
        when a lane is made or a function dropped (`_lanes_version`), or when the worker's
        abilities or queues change (which reset its own version).
        """
        functions = self.functions
        queues = worker.queues
        lanes: list[Lane] = []
        for name in worker.abilities:
            fn = functions.get(name)
            if fn is not None:
                for lane in fn.lanes.values():
                    if queues is None or lane.queue in queues:
                        lanes.append(lane)
        worker.lanes = lanes
        worker.lanes_version = self._lanes_version

    def grab(self, worker: WorkerSession) -> Job | None:
        """PULL: lease the best job the worker can do, or None."""
        if worker.abilities:
            self._stop_waiting(worker)
        lane = self._best_lane(worker)
        if lane is None:
            if self.on_idle_worker is not None:
                self.on_idle_worker(worker)
            return None
        job = lane.pop()
        assert job is not None
        self._lease(job, lane.function, worker, None)
        return job

    def sleep(self, worker: WorkerSession) -> bool:
        """WAKE: the worker wants to sleep. True means work is waiting: wake it at once."""
        if self._best_lane(worker) is not None:
            return True
        if worker.state is WorkerState.RUNNING:
            self._wait(worker)
        return False

    def request_work(self, worker: WorkerSession, count: int) -> None:
        """PUSH: the worker wants `count` more jobs; assign what is there now, the rest later."""
        worker.credit = max(0, count)
        self._push_work(worker)

    def _push_work(self, worker: WorkerSession) -> None:
        while worker.credit > 0:
            lane = self._best_lane(worker)
            if lane is None:
                if worker.state is WorkerState.RUNNING and worker.has_room:
                    self._wait(worker)
                return
            job = lane.pop()
            assert job is not None
            worker.credit -= 1
            self._lease(job, lane.function, worker, None)
            worker.handler.assign(job)
        self._stop_waiting(worker)

    def fetch(
        self,
        queues: Sequence[str],
        count: int,
        *,
        worker: WorkerSession,
        lease_timeout: float | None = None,
    ) -> list[Job]:
        """PULL by queue (OJS fetch): up to `count` jobs, queues in the given order."""
        leased: list[Job] = []
        if worker.state is not WorkerState.RUNNING:
            return leased  # quiet: finish what you hold, take nothing new
        for name in queues:
            info = self.queues.get(name)
            if info is None or info.paused:
                continue
            while len(leased) < count and worker.has_room:
                lane = self._best_lane_of_queue(info)
                if lane is None:
                    break
                job = lane.pop()
                assert job is not None
                self._lease(job, lane.function, worker, lease_timeout)
                leased.append(job)
        if self.on_short_fetch is not None and len(leased) < count and worker.has_room:
            self.on_short_fetch(queues, count - len(leased))
        return leased

    @staticmethod
    def _best_lane_of_queue(info: QueueInfo) -> Lane | None:
        return _best_of(list(info.lanes.values()))

    def touch(self, worker: WorkerSession) -> None:
        worker.last_seen = self.clock()

    # ------------------------------------------------------------------ leases

    def _lease(
        self, job: Job, fn: FunctionInfo, worker: WorkerSession, lease_timeout: float | None
    ) -> None:
        """Hand `job`, just taken from a lane of `fn` (its function), to `worker`."""
        now = self.clock()
        job.state = _ACTIVE
        job.worker = worker
        job.attempts += 1
        job.started_at = now
        worker.jobs[job.id] = job
        fn.running += 1  # from the lane: looking the function up by name cost more than this
        timeout = lease_timeout or job.lease_timeout or worker.abilities.get(job.function)
        if timeout:
            self._set_lease(job, now + timeout)
        if self._durable and job.background:
            self._journal.job_saved(job)
        if self.event_log is not None or self.observers:
            self._observe("job.started", job)

    def _set_lease(self, job: Job, deadline: float) -> None:
        job.lease_deadline = deadline
        self.timers.add(deadline, self._on_lease_expired, job)

    def extend_lease(self, job: Job, timeout: float) -> None:
        if job.state is _ACTIVE:
            self._set_lease(job, self.clock() + timeout)

    def _on_lease_expired(self, job: Job, when: float) -> None:
        if job.state is _ACTIVE and job.lease_deadline == when:
            # Revoke first: requeueing may hand the job straight back to the same worker.
            worker = job.worker
            if worker is not None:
                worker.handler.revoke(job, "lease expired")
            self._requeue(job, "lease expired")

    def _release(self, job: Job) -> None:
        worker = job.worker
        if worker is not None:
            held = worker.jobs
            # Not `pop` (a method call once compiled), `in` and `del` (two look-ups) or
            # contextlib.suppress (a context manager): the job is almost always there.
            try:  # noqa: SIM105
                del held[job.id]
            except KeyError:
                pass
            job.worker = None
        job.lease_deadline = None
        self.functions[job.function].running -= 1

    def unlease(self, job: Job) -> None:
        """Undo a lease `fetch` just made, for a job the adapter will not hand out after all
        (a rate limit's partition is full): back to the front of its lane, the attempt not
        counted."""
        if job.state is not _ACTIVE:
            return
        self._release(job)
        job.attempts -= 1
        job.started_at = None
        self._make_available(job, self.functions[job.function], front=True)
        if self._durable and job.background:
            self._journal.job_saved(job)

    def release(self, job: Job) -> bool:
        """Another node may run this queued job instead: it leaves this engine, neither
        finished nor written (the store writes it as nobody's). False if it is no longer
        queued here."""
        if job.state is not _AVAILABLE or self.jobs.get(job.id) is not job:
            return False
        fn = self.functions.get(job.function)
        lane = fn.lanes.get(job.queue) if fn is not None else None
        if lane is None or not lane.withdraw(job):
            return False
        self.jobs.discard(job)
        key = self.unique_key(job.function, job.unique, job.payload)
        if key is not None and self.uniques.get(key) is job:
            del self.uniques[key]
        return True

    def withdraw_pending(self, job: Job) -> bool:
        """A PENDING job leaves this engine, neither finished nor written: another node runs
        it, or holds its unique key. False if it is not PENDING here."""
        if job.state is not JobState.PENDING or self.jobs.get(job.id) is not job:
            return False
        self.jobs.discard(job)
        key = self.unique_key(job.function, job.unique, job.payload)
        if key is not None and self.uniques.get(key) is job:
            del self.uniques[key]
        return True

    def held_job(self, worker: WorkerSession, job_id: str) -> Job:
        """The job `worker` holds under this id: the one ownership check of every work
        update (result, failure, progress, output, lease extension) from every listener.

        Raises JobNotHeld, whose `holder` names the job's state when another worker holds it,
        it went back to its queue or it finished: never the other worker's id. A refused
        update changes nothing."""
        job = worker.jobs.get(job_id)
        if job is not None:
            return job
        other = self.jobs.get(job_id)
        if other is None:
            raise JobNotHeld(f"Job given in work result not found: no job {job_id}")
        holder = "leased to another worker" if other.state is _ACTIVE else other.state.name.lower()
        raise JobNotHeld(
            f"Job given in work result not found: job {job_id} is {holder}, not held by this"
            " worker",
            holder,
        )

    def _requeue(self, job: Job, reason: object, delay: float = 0.0) -> None:
        """An active job lost its worker or failed for now: run it again (after `delay`
        seconds), or discard it when its attempts are spent."""
        self._release(job)
        job.error = reason
        if job.max_attempts is not None and job.attempts >= job.max_attempts:
            self._finish(job, _DISCARDED, None, None)
            return
        fn = self.functions[job.function]
        if delay > 0:
            self._schedule(job, fn, self.clock() + delay, JobState.RETRYABLE)
        else:
            # Keep its place: it was the oldest job when it was handed out.
            self._make_available(job, fn, front=True)
        if self._durable and job.background:
            self._journal.job_saved(job)
        if self.event_log is not None or self.observers:
            self._observe("job.retrying", job)

    # ------------------------------------------------------------------ work updates

    def progress(self, job: Job, done: int, total: int) -> None:
        """The worker has done `done` of `total` steps."""
        job.progress = (done, total)
        subscribers = job.subscribers
        if subscribers:
            for subscriber in _each(subscribers):
                subscriber.job_progress(job, done, total)

    def output(self, job: Job, kind: Output, data: bytes) -> None:
        """The worker streams output (a partial result, a warning) to the waiting clients."""
        subscribers = job.subscribers
        if subscribers:
            for subscriber in _each(subscribers):
                subscriber.job_output(job, kind, data)

    def complete(self, job: Job, result: bytes) -> None:
        if job.state is not _ACTIVE:
            raise IllegalTransition(f"cannot complete a {job.state.name.lower()} job")
        self._release(job)
        job.result = result
        self._finish(job, _COMPLETED, result, None)

    def fail(
        self,
        job: Job,
        error: object = None,
        *,
        detail: bytes | None = None,
        retry: bool = False,
        retry_after: float = 0.0,
    ) -> None:
        """The worker gave up on the job.

        `error` is recorded on the job (any JSON value); `detail` is what the worker said
        for the waiting clients (Gearman WORK_EXCEPTION data), None if nothing. With `retry`
        the job runs again after `retry_after` seconds while it has attempts left (the
        caller's retry policy decides the delay); otherwise it is discarded.
        """
        if job.state is not _ACTIVE:
            raise IllegalTransition(f"cannot fail a {job.state.name.lower()} job")
        if retry:
            self._requeue(job, error if error is not None else "failed", retry_after)
            return
        self._release(job)
        job.error = error
        self._finish(job, _DISCARDED, None, detail)

    def cancel(self, job: Job) -> None:
        """Cancel a job that has not finished; its clients are told it failed."""
        state = job.state
        if state.terminal:
            raise IllegalTransition(f"cannot cancel a {state.name.lower()} job")
        fn = self.functions[job.function]
        if state is _AVAILABLE:
            fn.lanes[job.queue].discard()
        elif state in _WAITING_STATES:
            fn.scheduled -= 1
        elif state is _ACTIVE:
            worker = job.worker
            self._release(job)
            if worker is not None:
                worker.handler.revoke(job, "cancelled")
        self._finish(job, JobState.CANCELLED, None, None)

    def _finish(self, job: Job, state: JobState, result: bytes | None, error: bytes | None) -> None:
        job.state = state
        job.finished_at = now = self.clock()
        if job.unique:
            key = self.unique_key(job.function, job.unique, job.payload)
            if key is not None and self.uniques.get(key) is job:
                del self.uniques[key]
        subscribers = job.subscribers
        if subscribers:
            job.subscribers = None  # so that none of them can unsubscribe meanwhile
            for subscriber in subscribers:
                subscriber.job_finished(job, state, result, error)
        if self._durable and job.background:
            self._journal.job_removed(job)
        if self.config.retain_finished > 0:
            finished = self._finished
            finished.append(job)
            if len(finished) == 1:
                self.timers.add(now + self.config.retain_finished, self._on_forget, None)
            elif len(finished) > self.config.retain_finished_max:
                self.jobs.discard(finished.popleft())
        else:
            self.jobs.discard(job)
        if self.event_log is not None or self.observers or self.finish_observers:
            name = _FINISH_EVENTS[state]
            self._observe(name, job)
            if job.ext is not None and self.finish_observers:
                self._tell_observers(self.finish_observers, name, job)

    def _on_forget(self, _owner: object, when: float) -> None:
        finished, retain = self._finished, self.config.retain_finished
        while finished:
            forget_at = (finished[0].finished_at or 0.0) + retain
            if forget_at > when:
                self.timers.add(forget_at, self._on_forget, None)
                return
            self.jobs.discard(finished.popleft())

    def expire(self, job: Job, reason: str = "expired") -> None:
        """Discard a job that did not start in time (OJS `expires_at`); it never runs.

        Only a waiting job (scheduled, pending, available, retryable) can expire: one that is
        running finishes normally. Raises IllegalTransition otherwise.
        """
        state = job.state
        if state is _ACTIVE or state.terminal:
            raise IllegalTransition(f"cannot expire a {state.name.lower()} job")
        fn = self.functions[job.function]
        if state is _AVAILABLE:
            fn.lanes[job.queue].discard()
        elif state in _WAITING_STATES:
            fn.scheduled -= 1
        job.error = reason
        self._finish(job, _DISCARDED, None, None)

    def revive(self, job: Job) -> Job:
        """A discarded job goes back to its queue with attempts counted from zero (dead
        letter retry). Returns the live job: a new record under the same id, so the finished
        record's retention timer cannot forget it. Raises IllegalTransition.
        """
        if job.state is not JobState.DISCARDED:
            raise IllegalTransition(f"cannot retry a {job.state.name.lower()} job")
        fresh = _background_copy(job)
        fresh.number = job.number
        fresh.lease_timeout = job.lease_timeout
        fresh.ext = job.ext
        self.jobs.add(fresh)
        key = self.unique_key(fresh.function, fresh.unique, fresh.payload)
        if key is not None and key not in self.uniques:
            self.uniques[key] = fresh
        self._make_available(fresh, self.function(fresh.function))
        if self._durable:
            self._journal.job_saved(fresh)
        if self.event_log is not None or self.observers:
            self._observe("job.enqueued", fresh, self.clock())  # not its old created_at
        return fresh

    def forget(self, job: Job) -> None:
        """Drop a finished job from status queries before its retention ends."""
        if job.state.terminal:
            self.jobs.discard(job)

    def _observe(self, event: str, job: Job, at: float = 0.0) -> None:
        """Tell the event log and the observers; `at`: when (0: the time the engine just
        set on the job, `EventLog.observe`)."""
        event_log = self.event_log
        if event_log is not None:
            try:
                event_log.observe(event, job, at)
            except Exception:  # as for any observer: the transition stands
                log.exception("the event log failed on %s for %s", event, job.id)
        if self.observers:
            self._tell_observers(self.observers, event, job)

    def _tell_observers(self, observers: list[JobObserver], event: str, job: Job) -> None:
        for observer in observers:
            try:
                observer(event, job)
            except Exception:  # an observer's bug must not undo a transition
                log.exception("job observer failed on %s for %s", event, job.id)

    # ------------------------------------------------------------------ subscribers

    def subscribe(self, job: Job, subscriber: Subscriber) -> None:
        if job.subscribers is None:
            job.subscribers = [subscriber]
        elif subscriber not in job.subscribers:
            job.subscribers.append(subscriber)

    def unsubscribe(self, job: Job, subscriber: Subscriber) -> None:
        """A foreground client left. A job nobody waits for any more is dropped if not started."""
        subs = job.subscribers
        if subs is None or subscriber not in subs:
            return
        subs.remove(subscriber)
        if subs:
            return
        job.subscribers = None
        if not job.background and job.state in (
            _AVAILABLE,
            JobState.SCHEDULED,
            JobState.PENDING,
            JobState.RETRYABLE,
        ):
            self.cancel(job)

    def retract(self, jobs: Iterable[Job]) -> None:
        """The store could not make these new jobs durable: whoever was told they were
        accepted hears otherwise from its adapter, so they must neither run nor be seen.
        A job that has already ended stays as it is."""
        for job in jobs:
            if self.jobs.get(job.id) is not job or job.state.terminal:
                continue
            self.cancel(job)
            self.forget(job)

    # ------------------------------------------------------------------ admin

    def reset(self) -> None:
        """Forget every job and queue setting (a test runner's admin reset).

        Workers stay connected; jobs they hold are simply gone. Stale timer entries stay in
        the heap and are ignored when they fire, because every forgotten job is marked
        cancelled. The store forgets them too, so a restart does not bring them back.
        """
        for job in self.jobs.values():
            if self._durable and job.background:
                self._journal.job_removed(job)
            if job.worker is not None:
                job.worker.jobs.pop(job.id, None)
                job.worker = None
            job.state = JobState.CANCELLED
            job.subscribers = None
        self.jobs.clear()
        self.uniques.clear()
        self._finished.clear()
        for fn in self.functions.values():
            fn.running = 0
            fn.scheduled = 0
            for lane in fn.lanes.values():
                lane.clear()
        for info in self.queues.values():
            info.paused = False

    # ------------------------------------------------------------------ time and replay

    def run_timers(self) -> float | None:
        """Fire every due timer; return the next deadline."""
        return self.timers.run_due(self.clock())

    def replay(self, rows: Iterable[StoredJob], numbers_reserved: int = 0) -> int:
        """Put a store's jobs back into the queues (start-up); jobs that were active count
        that attempt. `numbers_reserved`: the journal's ceiling of job numbers given out
        (`_reserve_numbers`), above which new ids start."""
        self._last_number = max(self._last_number, numbers_reserved)
        self._numbers_reserved = max(self._numbers_reserved, numbers_reserved)
        jobs = []
        for row in rows:
            job = _background_copy(row)
            job.attempts = row.attempts
            if row.state == JobState.PENDING:
                job.state = JobState.PENDING
            job.row = row.row
            job.run_at = row.run_at
            if row.ext is not None:
                job.ext = decode_ext(row.ext)
            jobs.append(job)
        return self.restore(jobs)

    def restore(self, jobs: Iterable[Job]) -> int:
        """Put jobs read back from the store into the queues (start-up replay)."""
        count = 0
        # New ids must not reuse the numbers of replayed jobs (PREFIX:N).
        top = 0
        index = self.jobs
        for job in jobs:
            job.number = index.number(job.id)
            top = max(top, job.number)
            fn = self.function(job.function)
            index.add(job)
            key = self.unique_key(job.function, job.unique, job.payload)
            if key is not None:
                self.uniques[key] = job
            if job.state is JobState.PENDING:
                pass  # staged: it waits for `activate`, as before the restart
            elif job.run_at is not None and job.run_at > self.clock():
                self._schedule(job, fn, job.run_at, JobState.SCHEDULED)
            else:
                self._make_available(job, fn)
            count += 1
        if top:
            self._last_number = max(top, self._last_number)
        return count
