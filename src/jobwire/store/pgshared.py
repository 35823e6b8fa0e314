"""What the nodes of a cluster share beside the jobs: unique keys, cron ticks, pauses, rate
limits.

`ClusterNode` (`jobwire.store.pgcluster`) makes one `SharedState` and hands it the
notifications of shared state; docs/scaling.md describes the whole.

- **Unique keys.** Every new job with a unique key (`jobwire.store.sharedkeys`) is inserted on
  condition that no live job holds its key (`jobs.ukey`, a unique index), in its batch's one
  statement. When other nodes run, such a job is held back (PENDING) until its batch commits,
  so it never runs before the cluster has settled who holds the key: then it becomes
  available here, or it leaves this engine when another job holds the key, and the
  acknowledgements of its submits name that job (`PostgresStore.coalesced`, and `settled`
  for OJS). A foreground job is always written to the shared queue (a foreground job a node
  keeps is not stored), its clients waiting here as for any foreground job another node
  runs; the foreground clients of a job that lost its key follow the job that holds it
  (`jobwire.store.pgfollow`).
- **Cron.** Registrations are key-value records every node reads; a batch that writes one
  notifies, and the others read them again (`CronScheduler.sync`). Every node arms every
  entry, and at each tick the one whose `INSERT INTO cron_ticks ... ON CONFLICT DO NOTHING`
  inserts the row fires it and writes its record (last run, count), which the others read.
- **Pauses.** `paused_queues` holds the paused queues: pausing writes it and notifies; every
  node reads it again and pauses its queues alike, and claims skip the paused queues' jobs.
- **Rate limits** of queues, and their budget: `jobwire.store.pgrates`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from jobwire.engine.job import Job, JobState
from jobwire.store.pgrates import SharedRates
from jobwire.store.postgres import WrittenAs
from jobwire.store.sharedkeys import CRON_CHANGED, CRON_NAMESPACE, PAUSES_CHANGED, RATES_CHANGED

if TYPE_CHECKING:
    from jobwire.engine.cron import CronEntry, CronScheduler
    from jobwire.store.pgcluster import ClusterNode

log = logging.getLogger("jobwire.cluster")

#: Claim a cron tick (name, scheduled time, node): a row only for the first node to ask.
#: Answers whether this node got it, and whether the entry's previous job is still live
#: anywhere (for the `skip` overlap policy).
TICK_SQL = """
WITH tick AS (
    INSERT INTO cron_ticks (name, at, node) VALUES (%s, %s, %s)
    ON CONFLICT DO NOTHING RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM tick), EXISTS (SELECT 1 FROM jobs WHERE id = %s)
"""
#: Ticks older than this many seconds are deleted as new ones are claimed.
TICKS_KEPT = 86400.0
FORGET_TICKS_SQL = """
WITH gone AS (DELETE FROM cron_ticks WHERE name = %s AND at < %s RETURNING 1)
SELECT count(*) FROM gone
"""
CRON_SQL = "SELECT key, value FROM kv WHERE namespace = %s"
PAUSE_SQL = """
WITH paused AS (
    INSERT INTO paused_queues (queue) VALUES (%s) ON CONFLICT DO NOTHING
)
SELECT pg_notify(%s, %s)
"""
RESUME_SQL = """
WITH resumed AS (DELETE FROM paused_queues WHERE queue = %s)
SELECT pg_notify(%s, %s)
"""
PAUSED_SQL = "SELECT queue FROM paused_queues"


class SharedState:
    def __init__(self, cluster: ClusterNode) -> None:
        self.cluster = cluster
        self.store = cluster.store
        self.engine = cluster.engine
        #: The node's cron, when a listener has one (`attach_cron`).
        self.cron: CronScheduler | None = None
        # Held jobs whose submitter waits to know who holds their key, by id.
        self._waiting: dict[str, asyncio.Future[str | None]] = {}
        #: Has the clients of a job that lost its key follow the job that holds it
        #: (`jobwire.store.pgfollow`, set by `RemoteJobs`).
        self.follow: Callable[[Job, str], None] | None = None
        self._paused: set[str] = set()  # as last read from the database
        self.rates = SharedRates(cluster)
        self._reading: asyncio.Task[None] | None = None
        self._again = False  # read once more when the reading in progress ends

    def start(self) -> None:
        self.engine.hold_unique = self._hold_engine_job
        self.store.on_unique = self._settle

    def close(self) -> None:
        self.engine.hold_unique = None
        self.store.on_unique = None
        if self.cron is not None:
            self.cron.claim_tick = None
        self.rates.close()
        for future in self._waiting.values():
            if not future.done():
                future.set_result(None)
        self._waiting.clear()

    # ------------------------------------------------------------------ unique keys

    def _hold_engine_job(self, job: Job) -> bool:
        """The engine asks: hold this new job with a unique key back until its batch settles
        the key? Yes when other nodes run (alone, this node's map decides)."""
        if not self.cluster.peers:
            return False
        self.store.held[job.id] = job
        return True

    def hold(self, job: Job) -> bool:
        """A listener that created `job` PENDING asks the cluster to hold it until its key is
        settled (then `settled` tells it who holds the key). False: alone, not needed."""
        if not self.cluster.peers:
            return False
        self.store.held[job.id] = job
        return True

    def wants_hold(self) -> bool:
        return bool(self.cluster.peers)

    async def settled(self, job: Job) -> str | None:
        """For a held job: once its batch has committed, the id of the job on another node
        that holds its key, or None if it took the key (or its batch failed: the commit
        barrier says so)."""
        if self.store.held.get(job.id) is not job:
            return None  # not held (a caller asks in the turn that created it: not settled)
        loop = asyncio.get_running_loop()
        future = self._waiting.get(job.id)
        if future is None:
            future = self._waiting[job.id] = loop.create_future()
        return await asyncio.shield(future)

    def _settle(self, won: list[Job], lost: list[tuple[Job, str]], failed: list[Job]) -> None:
        """A batch with held jobs finished (before its acknowledgements go out)."""
        engine = self.engine
        cluster = self.cluster
        for job in won:
            self._answer(job, None)
            if engine.jobs.get(job.id) is job and job.state is JobState.PENDING:
                engine.activate(job)  # kept here: now it may run
            else:
                cluster.written(job)  # to the node it was written as, if it was
        for job, holder in lost:
            self._answer(job, holder)
            cluster.unwritten(job)
            # It leaves: held here, or offered to the shared queue (a foreground job).
            gone = engine.withdraw_pending(job) or cluster.stop_waiting(job)
            if gone and job.subscribers:  # foreground clients wait on it here
                self._follow(job, holder)
        for job in failed:
            self._answer(job, None)
            cluster.unwritten(job)
            if cluster.stop_waiting(job):  # offered with the batch: the engine cannot retract it
                _end(job, JobState.CANCELLED, None)

    def _follow(self, job: Job, holder: str) -> None:
        """The clients waiting here on `job` wait on `holder`, which took its key, instead: its
        news reaches them from whichever node runs it (`jobwire.store.pgfollow`)."""
        if self.follow is not None:
            self.follow(job, holder)
        else:  # no node to ask (a cluster without `RemoteJobs`)
            _end(job, JobState.DISCARDED, f"coalesced with job {holder} on another node".encode())

    def alone(self) -> None:
        """The other nodes went: the held foreground jobs not yet offered to the shared queue
        run here after all, as alone (their batch would not write them)."""
        engine = self.engine
        for job in list(self.store.held.values()):
            if not job.background and engine.jobs.get(job.id) is job:
                del self.store.held[job.id]
                self._answer(job, None)
                if job.state is JobState.PENDING:
                    engine.activate(job)

    def _answer(self, job: Job, holder: str | None) -> None:
        future = self._waiting.pop(job.id, None)
        if future is not None and not future.done():
            future.set_result(holder)

    def releases_held(self, job: Job) -> bool | WrittenAs | None:
        """At the end of the turn that created a held job: None if `job` is not held; True
        if it goes to the shared queue (it leaves this engine now, and its row is written
        available and nobody's), False if it stays here, to run once its key is settled;
        for a foreground job a free worker waits for, here or on a node a peer link
        reaches, that node, whose row it is written as (`ClusterNode.written_as`), and for a
        background job one a link reaches (`ClusterNode.written_as_linked`)."""
        if self.store.held.get(job.id) is not job:
            return None
        if not job.background:
            # A foreground job this node keeps is not stored, yet the index must hold its key:
            # it is offered like any foreground job no worker here is free for, its clients
            # waiting here (a worker here takes it from the shared queue as well as any).
            if not self.engine.withdraw_pending(job):  # cancelled: its clients went
                del self.store.held[job.id]
                self._answer(job, None)
                return False
            self.cluster.wait_elsewhere(job)
            owner = self.cluster.written_as(job)
            if owner is not None:
                return owner
            self.cluster.released += 1
            return True
        if job.subscribers or self.cluster.keeps(job, waiting_here=1):
            return False  # a client waits on it here, or a worker here is free for it
        if not self.engine.withdraw_pending(job):
            return False
        job.state = JobState.AVAILABLE  # as its row says (for the replies that show it)
        linked = self.cluster.written_as_linked(job)
        if linked is not None:
            return linked
        self.cluster.released += 1
        return True

    # ------------------------------------------------------------------ notifications

    def heard(self, payload: str) -> None:
        """A notification of shared state (`jobwire.store.sharedkeys`)."""
        if payload in (CRON_CHANGED, PAUSES_CHANGED, RATES_CHANGED):
            self._read_again()

    def _read_again(self) -> None:
        """Read the cron registrations, the pauses and the rate limits again (one reading at
        a time; a notification during one makes another follow)."""
        if self.cluster.closed:
            return
        if self._reading is not None and not self._reading.done():
            self._again = True
            return
        self._again = False
        self._reading = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        while True:
            try:
                await self.read_pauses()
                await self.rates.read()
                await self.read_cron()
            except Exception as exc:
                log.warning("cluster: reading the shared state failed: %s", exc)
            if not self._again or self.cluster.closed:
                return
            self._again = False

    def refresh(self) -> None:
        """The poll, or the listener reconnected: what may have been missed."""
        self._read_again()

    # ------------------------------------------------------------------ pauses

    async def set_paused(self, queue: str, paused: bool) -> None:
        """Pause (or resume) `queue` on every node: here at once, on the others when they
        hear of it; claims skip its jobs from the commit on."""
        self.engine.queue(queue).paused = paused
        statement = PAUSE_SQL if paused else RESUME_SQL
        await self.cluster.shared_fetch(statement, (queue, self.store.channel, PAUSES_CHANGED))
        if paused:
            self._paused.add(queue)
        else:
            self._paused.discard(queue)
            self.cluster.want_all()  # its shared jobs may be claimed again

    async def read_pauses(self) -> None:
        rows = await self.cluster.shared_fetch(PAUSED_SQL, ())
        paused = {str(row[0]) for row in rows}
        engine = self.engine
        for queue in paused - self._paused:
            engine.queue(queue).paused = True
        resumed = self._paused - paused
        for queue in resumed:
            info = engine.queues.get(queue)
            if info is not None:
                info.paused = False
        self._paused = paused
        if resumed:
            self.cluster.want_all()  # their shared jobs may be claimed again

    # ------------------------------------------------------------------ cron

    def attach_cron(self, cron: CronScheduler) -> None:
        self.cron = cron
        cron.claim_tick = self.claim_tick

    async def claim_tick(self, entry: CronEntry, when: float) -> tuple[bool, bool]:
        """(whether this node fires `entry` for its tick at `when`, whether the entry's
        previous job still lives somewhere)."""
        parameters: Any = (entry.name, when, self.cluster.node, entry.last_job_id or "")
        rows = await self.cluster.shared_fetch(TICK_SQL, parameters)
        mine, previous_live = bool(rows[0][0]), bool(rows[0][1])
        if mine:
            await self.cluster.shared_fetch(FORGET_TICKS_SQL, (entry.name, when - TICKS_KEPT))
        return mine, previous_live

    async def read_cron(self) -> None:
        cron = self.cron
        if cron is None:
            return
        pending = self.store.kv_pending(CRON_NAMESPACE)
        rows = await self.cluster.shared_fetch(CRON_SQL, (CRON_NAMESPACE,))
        # Records this node wrote and that may not have been committed when they were read
        # stay as they are here (their commit notifies: they are read again then).
        pending |= self.store.kv_pending(CRON_NAMESPACE)
        cron.sync({str(key): bytes(value) for key, value in rows}, keep=pending)


def _end(job: Job, state: JobState, error: bytes | None) -> None:
    """Tell the clients waiting on `job`, which leaves this node without running, that it ended."""
    subscribers, job.subscribers = job.subscribers or [], None
    job.state = state
    for subscriber in subscribers:
        subscriber.job_finished(job, state, None, error)
