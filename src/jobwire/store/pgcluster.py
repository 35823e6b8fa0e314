"""Several jobwire nodes on one PostgreSQL store: leases, the shared queue, claims.

Every `jobwire serve --store postgresql://...` on the same tables is a node of one cluster
(docs/scaling.md, "The cluster"). The store (`jobwire.store.postgres`) registers the node,
adopts the jobs of dead nodes at start and writes every row with its owner; this module runs
beside the engine on the event loop:

- **Heartbeat**: every third of `--node-lease` the node renews its lease. A node whose row
  is gone was declared dead by the others, who requeued its jobs: it stops at once, so it
  never runs them twice (its writes of them changed nothing meanwhile: they are conditional on
  ownership). It stops too when it could not renew its lease before it ran out.
- **Reaping**: the same beat deletes the nodes whose lease ran out and gives their jobs back to
  the shared queue (owner NULL, their attempts as counted), in one statement, and notifies.
- **The shared queue**: a node keeps the jobs it can run now; when other nodes run, a new job
  no local worker is free for is written without an owner (`releases`). A node claims such
  jobs when its workers wait for work: `UPDATE ... FOR UPDATE SKIP LOCKED ... RETURNING`, at
  most as many as it has idle workers, priority first, then the oldest, and loads them into
  its engine through replay. When a peer link says another node has a worker free for a
  new background job, the job is written as that node's instead, and the row goes to it
  over the link (as its commit begins; once committed for a job with a unique key): it
  runs the job without a notification or a claim (`jobwire.store.peerlink`).
- **Wake-ups**: nodes LISTEN on the schema's channel; a batch that wrote unowned jobs notifies
  "function<US>queue" with its commit, and nodes with idle workers for them claim at once. A
  slow poll (`--cluster-poll`) covers a lost notification.
- **Rebalancing**: a claim that finds the shared queue short while workers here wait asks
  the other nodes (a notification, at most every `ASK_INTERVAL` per function or queue); a
  node that keeps queued jobs of it beyond what its own free workers take gives up to the
  number asked for, the best first, to the shared queue (its next batch writes them
  nobody's and notifies), and the asking node claims them. So jobs a node kept (while
  alone, because a worker or a fetch was there when they came, or after a requeue) do not
  wait on it while another node's workers are idle.
- **Foreground jobs**: one no local worker is free for goes to the shared queue with the node
  its client waits on (`client_node`); the node that claims it tells that node what happens
  to it (`RemoteClient`, or a `Forwarder` when the client waits there too), and the client's
  node hands it to the clients in `waits`, which also holds the clients that joined a job
  another node holds under their unique key (`jobwire.store.pgfollow`).
- **Shared state**: unique keys, cron ticks, pauses and rate limits, in
  `jobwire.store.pgshared`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from jobwire.engine.job import ORIGIN_TITANIC, Job, JobState, Output, Subscriber
from jobwire.ports import StoredJob, decode_ext
from jobwire.ports.cluster import Counts
from jobwire.store.frames import full_row
from jobwire.store.peerlink import PeerClient, PeerLinks
from jobwire.store.pgids import ChosenIds
from jobwire.store.pgshared import SharedState
from jobwire.store.postgres import (
    _NODE_LOCK,
    _STORED,
    CONNECT_TIMEOUT,
    KEY_BLOCK,
    NODE_NAMESPACES,
    RECONNECT_MAX,
    RECONNECT_MIN,
    SESSION_SQL,
    PostgresStore,
    WrittenAs,
    _reason,
)
from jobwire.store.sharedkeys import SHARED_NOTE

if TYPE_CHECKING:
    from jobwire.engine import Engine, WorkerSession
    from jobwire.engine.cron import CronScheduler
    from jobwire.engine.lanes import FunctionInfo
    from jobwire.server.auth import TLSFiles

log = logging.getLogger("jobwire.cluster")

#: Seconds between two claims for every idle worker and recent fetch, whatever was notified.
POLL = 5.0
#: Jobs claimed by one statement at most.
CLAIM_MAX = 100
#: Jobs of a function claimed at least, less those queued here, when a worker here waits:
#: with 32, two nodes ran 4,318-4,825 jobs/s end to end at 10-12 jobs per commit; with 100,
#: 6,515-6,814 at 27-29, and 100 against 138 us of database CPU per job (bench/pg_peers.py,
#: alternated). What a node claims beyond what its workers start waits here, where another
#: node's ask takes it (`GIVE_AFTER`).
CLAIM_BATCH = 100
#: Seconds a fetch by queue that came back short keeps the node claiming for that queue.
FETCH_INTEREST = 10.0
#: Seconds a node that stops waits for its messages to other nodes to go out.
CLOSE_WAIT = 3.0
#: Seconds one statement of the cluster may take before its connection is given up.
STATEMENT_TIMEOUT = 10.0
#: Seconds between two asks for the same function or queue (`ClusterNode._ask`).
ASK_INTERVAL = 0.5
#: Seconds a job waits queued (since it was created or came due) before another node's ask
#: takes it: a younger one is likely taken by a worker or a fetch here in a moment, and one
#: given away is nobody's to take until its batch commits (two fetches at once, one on each
#: node, would both miss it).
GIVE_AFTER = 2.0
#: Notifications asking the nodes for work: ASK_NOTE, the asking node, US, how many jobs,
#: US, "f" + function or "q" + queue.
ASK_NOTE = "\x1d"

#: Renew the lease (node, lease seconds, node); no row: the others declared this node dead.
#: Answers the number of other live nodes, and takes the node's lock on this connection when
#: no connection holds it (the node's own connection lost it when PostgreSQL restarted).
HEARTBEAT_SQL = f"""
UPDATE nodes SET lease_until = now() + make_interval(secs => %s) WHERE id = %s
RETURNING (SELECT count(*) FROM nodes WHERE id <> %s AND lease_until >= now()),
    pg_try_advisory_lock({_NODE_LOCK})
"""
#: Requeue the jobs of nodes whose lease ran out (node, channel): one transaction; the nodes
#: listening hear which queues got work back.
REAP_SQL = """
WITH dead AS (
    DELETE FROM nodes WHERE lease_until < now() AND id <> %s RETURNING id
), requeued AS (
    UPDATE jobs SET owner = NULL WHERE owner IN (SELECT id FROM dead) RETURNING function, queue
), names AS (
    SELECT DISTINCT function || chr(31) || queue AS name FROM requeued
    UNION SELECT 'nodes' FROM dead
)
SELECT (SELECT count(*) FROM dead), (SELECT count(*) FROM requeued),
    (SELECT count(pg_notify(%s, name)) FROM names)
"""
# The rows are picked once, in a materialized CTE: as a plain `IN (subquery)` the planner may
# rescan the subquery for each row it updates, and each rescan skips the rows this very
# statement already took and locks the next ones, so LIMIT no longer bounds the claim.
_CLAIM = """
WITH picked AS MATERIALIZED (
    SELECT seq FROM jobs
    WHERE owner IS NULL AND {column} = %(name)s AND state <> {pending}
    AND (run_at IS NULL OR run_at <= %(now)s)
    AND NOT EXISTS (SELECT 1 FROM paused_queues WHERE paused_queues.queue = jobs.queue)
    ORDER BY priority DESC, created_at, seq
    LIMIT %(limit)s FOR UPDATE SKIP LOCKED
)
UPDATE jobs SET owner = %(node)s
WHERE seq IN (SELECT seq FROM picked)
AND owner IS NULL AND EXISTS (SELECT 1 FROM nodes WHERE id = %(node)s)
RETURNING {stored}, client_node
"""
#: Claim up to `limit` unowned jobs of a function (or of a queue), the best first.
CLAIM_BY_FUNCTION = _CLAIM.format(column="function", pending=int(JobState.PENDING), stored=_STORED)
CLAIM_BY_QUEUE = _CLAIM.format(column="queue", pending=int(JobState.PENDING), stored=_STORED)

#: Namespaces of the key-value records a running node takes over from a node gone (the
#: event log's chunks wait for a node that starts: `jobwire.store.postgres.KV_ADOPT_SQL`).
RUNTIME_ADOPTED = sorted(NODE_NAMESPACES - {"events"})
#: Take them (parameters: the node, the namespaces, the node). Two nodes at once: the
#: second finds the rows' owner alive once the first's update commits, and skips them.
ADOPT_RECORDS_SQL = """
UPDATE kv SET owner = %s
WHERE namespace = ANY(%s) AND owner NOT IN (0, %s)
AND NOT EXISTS (SELECT 1 FROM nodes WHERE nodes.id = kv.owner)
RETURNING namespace, key, value
"""
#: Shared key-value records addressed to whichever node keeps another record (parameters:
#: the namespace, the kept records' namespace, the node): such a record's key is the key of
#: the record it is for, a US, then its own. This node's: those for records it keeps. Those
#: for a record no node keeps any more (it was retired) are dropped.
ADDRESSED_SQL = """
WITH orphaned AS (
    DELETE FROM kv s WHERE s.namespace = %(namespace)s AND s.owner = 0 AND NOT EXISTS (
        SELECT 1 FROM kv k WHERE k.namespace = %(kept)s AND k.key = split_part(s.key, chr(31), 1)
    )
)
SELECT s.key, s.value FROM kv s WHERE s.namespace = %(namespace)s AND s.owner = 0 AND EXISTS (
    SELECT 1 FROM kv k WHERE k.namespace = %(kept)s AND k.owner = %(node)s
    AND k.key = split_part(s.key, chr(31), 1)
)
"""
#: Key-value records of a namespace kept by nodes that are not alive: gone, or with a lease
#: that ran out, the nodes `jobwire.store.pgremote.PEERS_SQL` does not ask (parameters: the
#: namespace, the node).
GONE_RECORDS_SQL = """
SELECT owner, key, value FROM kv WHERE namespace = %s AND owner NOT IN (0, %s)
AND NOT EXISTS (SELECT 1 FROM nodes WHERE nodes.id = kv.owner AND nodes.lease_until >= now())
"""
KEY_HOLDERS_SQL = (
    "SELECT ukey, id FROM jobs WHERE ukey = ANY(%s::text[]) AND owner IS DISTINCT FROM %s"
)
#: A job by id, wherever it is (the row of a job this node holds is older than the engine's).
FIND_SQL = f"SELECT {_STORED} FROM jobs WHERE id = %s AND owner IS DISTINCT FROM %s LIMIT 1"
#: Jobs this node does not hold, by function and queue: (function, queue, jobs, running).
ELSEWHERE_SQL = f"""
SELECT function, queue, count(*), count(*) FILTER (WHERE state = {int(JobState.ACTIVE)})
FROM jobs WHERE owner IS DISTINCT FROM %s GROUP BY function, queue
"""
#: Jobs of a queue no live node holds, by state (queue).
UNHELD_SQL = """
SELECT j.state, count(*) FROM jobs j LEFT JOIN nodes n ON n.id = j.owner
WHERE j.queue = %s AND (j.owner IS NULL OR n.id IS NULL OR n.lease_until < now())
GROUP BY j.state
"""

#: The same for every queue: (queue, state, count).
UNHELD_ALL_SQL = """
SELECT j.queue, j.state, count(*) FROM jobs j LEFT JOIN nodes n ON n.id = j.owner
WHERE j.owner IS NULL OR n.id IS NULL OR n.lease_until < now()
GROUP BY j.queue, j.state
"""

#: When the next job of the shared queue comes due (the time now). Scheduled jobs of a node
#: that died or left wait there: without a claim then, they would wait for the poll.
NEXT_DUE_SQL = "SELECT min(run_at) FROM jobs WHERE owner IS NULL AND run_at > %s"

#: Whether a node is gone (the node twice): no live lease, or its lock free.
NODE_GONE_SQL = f"""
SELECT NOT EXISTS (SELECT 1 FROM nodes WHERE id = %s AND lease_until >= now())
    OR pg_try_advisory_xact_lock({_NODE_LOCK})
"""
#: Give back to the shared queue rows written as a node's that will not run them (the rows'
#: keys, the node, the channel): its link broke, or it refused them.
FREE_ROWS_SQL = """
WITH freed AS (
    UPDATE jobs SET owner = NULL WHERE seq = ANY(%s) AND owner = %s RETURNING function, queue
), names AS (
    SELECT DISTINCT function || chr(31) || queue AS name FROM freed
)
SELECT count(pg_notify(%s, name)) FROM names
"""
#: A message for a node whose client waits on a foreground job (node channel, payload); one
#: too large for a notification goes into `relay`, and the notification names its row.
NOTIFY_SQL = "SELECT pg_notify(%s, %s)"
RELAY_SQL = """
WITH kept AS (INSERT INTO relay (payload) VALUES (%s) RETURNING id)
SELECT pg_notify(%s, '@' || id) FROM kept
"""
UNRELAY_SQL = "DELETE FROM relay WHERE id = %s RETURNING payload"
#: PostgreSQL refuses notifications of 8,000 bytes or more.
NOTIFY_MAX = 7900

Fatal = Callable[[str], None]


class Connection:
    """One connection of the cluster's, made when first needed and again after it broke."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.conn: psycopg.AsyncConnection[Any] | None = None
        # One connection made at a time: two callers that both found none made two, and the
        # first one made was left open.
        self._connecting = asyncio.Lock()

    async def get(self) -> psycopg.AsyncConnection[Any]:
        conn = self.conn
        if conn is None or conn.broken or conn.closed:
            async with self._connecting:
                conn = self.conn
                if conn is None or conn.broken or conn.closed:
                    conn = await psycopg.AsyncConnection.connect(
                        self.dsn,
                        autocommit=True,
                        connect_timeout=CONNECT_TIMEOUT,
                        prepare_threshold=0,
                    )
                    await conn.execute(SESSION_SQL)  # no plan kept from when tables were small
                    self.conn = conn
        return conn

    async def fetch(self, statement: str, parameters: Any) -> list[tuple[Any, ...]]:
        conn = await self.get()
        try:
            async with asyncio.timeout(STATEMENT_TIMEOUT):
                cur = await conn.execute(statement, parameters)
                return await cur.fetchall()
        except BaseException:
            self.drop()
            raise

    def drop(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.pgconn.finish()


class ClusterNode:
    """This node's part in the cluster: attach it to the engine, `start()` it on the loop."""

    def __init__(
        self,
        store: PostgresStore,
        engine: Engine,
        *,
        poll: float = POLL,
        on_fatal: Fatal | None = None,
        peer_listen: str | None = None,
        peer_tls: TLSFiles | None = None,
    ) -> None:
        self.store = store
        self.engine = engine
        self.node = store.node
        self.poll = poll
        self.on_fatal = on_fatal
        #: Other live nodes, as of the last heartbeat; 0: alone, every job stays here.
        self.peers = 0
        self.claimed = 0  # jobs claimed from the shared queue, for tests and metrics
        self.released = 0  # jobs written to the shared queue
        self.requeued = 0  # jobs of dead nodes this node gave back to the shared queue
        self.given = 0  # queued jobs this node gave to the shared queue when others asked
        self._asked_at: dict[str, float] = {}  # "f" + function or "q" + queue -> monotonic
        self._asks_due: dict[str, int] = {}  # asks waiting for the interval: how many
        self._gives_due: set[str] = set()  # asks for jobs too young to give yet
        #: Told of each job this node claims from the shared queue (the OJS binding arms
        #: its expiry, or expires it at once).
        self._claim_hooks: list[Callable[[Job], None]] = []
        self._record_hooks: list[Callable[[str, dict[str, bytes]], None]] = []
        self._addressed_hooks: list[tuple[str, str, Callable[[dict[str, bytes]], None]]] = []
        self._beat = Connection(store.dsn)
        self._claims = Connection(store.dsn)
        self._reads = Connection(store.dsn)  # status queries
        self._chosen_ids = ChosenIds(store.dsn)
        self._listen: psycopg.AsyncConnection[Any] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._beat_now = asyncio.Event()
        # What to claim for: functions whose workers wait; queues fetched short, until when.
        self._functions: set[str] = set()
        # Workers that asked and found nothing (a grab without sleeping), by function.
        self._asked: dict[str, set[str]] = {}
        self._queues: dict[str, tuple[int, float]] = {}
        # Queues a fetch is claiming for while it waits, and by how many fetches: the
        # background claims leave them alone meanwhile, so nothing is claimed twice over.
        self._fetching: dict[str, int] = {}
        # Claims that found less than they asked for (the shared queue had no more): no claim
        # for them again before a notification or a poll.
        self._dry: set[str] = set()
        self._notes = 0  # notifications heard: a claim that raced one is not dry
        self._pass: asyncio.Task[None] | None = None
        self._again = False
        # Foreground jobs of this node's clients that another node runs, by id: the job itself
        # (offered to the shared queue), or jobs that found their unique key held and follow
        # the holder under its id (`jobwire.store.pgfollow`). And the messages about them, in
        # the order they came.
        self.waits: dict[str, list[Job]] = {}
        self._telling: set[str] = set()  # ids whose news is being handed to their clients
        self._inbox: asyncio.Queue[str] = asyncio.Queue()
        # Messages to the nodes whose clients wait on jobs run here: (channel, payload).
        self._outbox: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self._relay = Connection(store.dsn)
        #: Takes the other messages on this node's channel first (`jobwire.store.pgremote`):
        #: True if it was one of its own.
        self.on_message: Callable[[dict[str, Any]], bool] | None = None
        #: This node's own channel: news of its clients' foreground jobs run elsewhere.
        self.node_channel = node_channel(store.channel, self.node)
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Unique keys, cron ticks and pauses across the nodes.
        self.shared = SharedState(self)
        #: Links to the other nodes, for foreground jobs (`jobwire.store.peerlink`); None: off.
        self.links = PeerLinks(self, peer_listen, peer_tls) if peer_listen else None
        #: New jobs whose batch writes them as a node's own, by id: that node, until the
        #: batch settles. Held foreground jobs (this node's, or one a link reaches:
        #: `written_as`) and background jobs a linked node has a free worker for (`_releases`).
        self._written_as: dict[str, int] = {}
        #: Background jobs whose rows went to a linked node as their commit began, by id:
        #: that node, until the commit ends (`_sending`).
        self._sent_ahead: dict[str, int] = {}
        #: Rows going back to the shared queue (`free_rows`), until they are there.
        self._freeing: set[asyncio.Task[None]] = set()
        self._dropped = False  # the connections are gone
        #: A claim for every idle worker when the shared queue's next job comes due (and
        #: that time), armed when nodes leave or die and at each poll (`_watch_due`).
        self._due: tuple[float, asyncio.TimerHandle] | None = None

    # ------------------------------------------------------------------ wiring

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        engine = self.engine
        engine.on_idle_worker = self._idle_worker
        engine.on_short_fetch = self._short_fetch
        engine.claim_for_fetch = self.claim_for_fetch
        self.store.releases = self._releases
        self.store.on_handed = self._handed
        self.store.on_handing = self._sending
        self.store.retract_released = self._retract_released
        self.store.keys_low = self._keys_low
        self.store.on_abandon.append(self._abandon)
        self.shared.start()
        self._tasks = [
            self._loop.create_task(self._heartbeats()),
            self._loop.create_task(self._listener()),
            self._loop.create_task(self._polls()),
            self._loop.create_task(self._deliver_inbox()),
            self._loop.create_task(self._send_outbox()),
        ]
        if self.links is not None:
            self._tasks.append(self._loop.create_task(self._start_links()))
        log.info("cluster: node %d (%s)", self.node, self.store.address)

    async def close(self) -> None:
        """Stop claiming and listening; what other nodes' clients are still to hear of jobs
        run here goes first (for a few seconds at most), and so do the background jobs
        written as linked nodes' in commits still in flight."""
        self.store.releases = None  # no new job leaves this engine
        await self.store.handed_over(CLOSE_WAIT)
        self._closed = True
        self.engine.on_idle_worker = None
        self.engine.on_short_fetch = None
        self.engine.claim_for_fetch = None
        self.shared.close()
        if self._observed in self.engine.observers:
            self.engine.observers.remove(self._observed)
        self.store.releases = None
        self.store.keys_low = None
        deadline = time.monotonic() + CLOSE_WAIT
        while not self._outbox.empty() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        tasks = [*self._tasks, *([self._pass] if self._pass is not None else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        if self.links is not None:
            await self.links.close()
        if self._freeing:  # rows the closed links leave to go back to the shared queue
            await asyncio.wait(self._freeing, timeout=CLOSE_WAIT)
        self._abandon()

    def _abandon(self) -> None:
        self._closed = True
        self._dropped = True
        if self._due is not None:
            self._due[1].cancel()
        self._beat.drop()
        self._claims.drop()
        self._reads.drop()
        self._chosen_ids.close()
        self._relay.drop()
        listen, self._listen = self._listen, None
        if listen is not None:
            listen.pgconn.finish()

    @property
    def closed(self) -> bool:
        return self._closed

    async def shared_fetch(self, statement: str, parameters: Any) -> list[tuple[Any, ...]]:
        """A statement about shared state (`jobwire.store.pgshared`), on the status reads'
        connection."""
        return await self._reads.fetch(statement, parameters)

    async def set_paused(self, queue: str, paused: bool) -> None:
        await self.shared.set_paused(queue, paused)

    def hold(self, job: Job) -> bool:
        return self.shared.hold(job)

    def wants_hold(self) -> bool:
        return self.shared.wants_hold()

    async def settled(self, job: Job) -> str | None:
        return await self.shared.settled(job)

    def attach_cron(self, cron: CronScheduler) -> None:
        self.shared.attach_cron(cron)

    def attach_rate_limits(self, apply: Callable[[str, int | None], None]) -> None:
        self.shared.rates.attach(apply)
        if self._loop is not None:  # started: what was read before had nobody to go to
            self.shared.refresh()

    async def share_rate_limit(self, queue: str, per_second: int) -> None:
        await self.shared.rates.share(queue, per_second)

    async def forget_rate_limits(self) -> None:
        await self.shared.rates.forget()

    async def take_rate(self, queue: str, wanted: int) -> int:
        return await self.shared.rates.take(queue, wanted)

    def give_back_rate(self, queue: str, unused: int) -> None:
        self.shared.rates.give_back(queue, unused)

    async def take_keyed(
        self, asked: list[tuple[str, str, int | None, int | None, float]]
    ) -> list[bool]:
        return await self.shared.rates.take_keyed(asked)

    def release_keyed(self, job_ids: list[str]) -> None:
        self.shared.rates.release_keyed(job_ids)

    def _fatal(self, reason: str) -> None:
        log.critical("cluster: %s", reason)
        self._closed = True
        self.store.releases = None
        if self.on_fatal is not None:
            self.on_fatal(reason)

    # ------------------------------------------------------------------ foreground jobs

    async def _send_outbox(self) -> None:
        """Tell the nodes whose clients wait, in order; a message that cannot be sent is
        logged and dropped (its client's node may be gone)."""
        while True:
            channel, payload = await self._outbox.get()
            try:
                if len(payload.encode()) < NOTIFY_MAX:
                    await self._relay.fetch(NOTIFY_SQL, (channel, payload))
                else:
                    await self._relay.fetch(RELAY_SQL, (payload, channel))
            except Exception as exc:
                log.warning("cluster: could not tell %s of a job: %s", channel, _reason(exc))

    async def _deliver_inbox(self) -> None:
        """News of this node's clients' jobs run elsewhere, in the order it came."""
        while True:
            payload = await self._inbox.get()
            try:
                if payload.startswith("@"):  # too large for a notification: in `relay`
                    rows = await self._reads.fetch(UNRELAY_SQL, (int(payload[1:]),))
                    if not rows:
                        continue
                    payload = str(rows[0][0])
                message = json.loads(payload)
                if self.on_message is None or not self.on_message(message):
                    self.deliver(message)
            except Exception:
                log.exception("cluster: a message about a foreground job was lost")

    def deliver(self, message: dict[str, Any]) -> None:
        """News of a job whose clients wait here, from the node that runs it."""
        job_id, kind = message["j"], message["e"]
        if self.links is not None and self.links.hold_news(job_id, message):
            return  # a job of a broken link being settled: after the frames its link missed
        if kind == "p":
            self.tell_progress(job_id, message["d"], message["t"])
        elif kind == "o":
            self.tell_output(job_id, Output(message["k"]), _bytes(message["b"]) or b"")
        elif kind == "f":
            state = JobState(message["s"])
            self.tell_finished(job_id, state, _bytes(message["r"]), _bytes(message["x"]))

    def wait_elsewhere(self, job: Job) -> bool:
        """`job`'s clients wait here for news of it, under its id, from the node that runs it:
        whether it is the first job here to wait on that id."""
        job.state = JobState.PENDING  # neither queued nor running here (a cancel is a no-op)
        waiting = self.waits.setdefault(job.id, [])
        waiting.append(job)
        return len(waiting) == 1

    def stop_waiting(self, job: Job) -> bool:
        """`job` no longer waits here (under its id): whether it did."""
        waiting = self.waits.get(job.id)
        if waiting is None or job not in waiting:
            return False
        waiting.remove(job)
        if not waiting:
            del self.waits[job.id]
        return True

    def tell_progress(self, job_id: str, done: int, total: int) -> None:
        jobs = self._telling_of(job_id)
        try:
            for job in jobs:
                job.progress = (done, total)
                for subscriber in list(job.subscribers or ()):
                    subscriber.job_progress(job, done, total)
        finally:
            self._told(job_id, jobs)

    def tell_output(self, job_id: str, kind: Output, data: bytes) -> None:
        jobs = self._telling_of(job_id)
        try:
            for job in jobs:
                for subscriber in list(job.subscribers or ()):
                    subscriber.job_output(job, kind, data)
        finally:
            self._told(job_id, jobs)

    def tell_finished(
        self, job_id: str, state: JobState, result: bytes | None, error: bytes | None
    ) -> None:
        jobs = self._telling_of(job_id)
        if jobs:
            del self.waits[job_id]
        try:
            for job in jobs:
                subscribers, job.subscribers = job.subscribers or [], None
                job.state = state
                job.result = result
                for subscriber in subscribers:
                    subscriber.job_finished(job, state, result, error)
        finally:
            self._told(job_id, jobs)

    def _telling_of(self, job_id: str) -> list[Job]:
        """The jobs waiting here on `job_id`, to tell; none while they are being told (a job
        run in the place of another forwards to it: news never goes round in a circle)."""
        jobs = self.waits.get(job_id)
        if not jobs or job_id in self._telling:
            return []
        self._telling.add(job_id)
        return list(jobs)

    def _told(self, job_id: str, jobs: list[Job]) -> None:
        if jobs:
            self._telling.discard(job_id)

    # ------------------------------------------------------------------ status (ClusterView)

    async def find_job(self, job_id: str) -> Job | None:
        if self.links is not None:  # handed to another node: no row anywhere
            for link in self.links.outbound.values():
                handed = link.find(job_id)
                if handed is not None:
                    return handed
        rows = await self._reads.fetch(FIND_SQL, (job_id, self.node))
        return detached_job(StoredJob(*rows[0])) if rows else None

    def hold_ids(self, ids: list[str]) -> AbstractAsyncContextManager[set[str]]:
        return self._chosen_ids.held(ids)

    async def key_holders(self, keys: list[str]) -> dict[str, str]:
        rows = await self._reads.fetch(KEY_HOLDERS_SQL, (keys, self.node))
        return {str(key): str(job_id) for key, job_id in rows}

    async def elsewhere(self) -> Counts:
        rows = await self._reads.fetch(ELSEWHERE_SQL, (self.node,))
        return {
            (function, queue): (int(jobs), int(running)) for function, queue, jobs, running in rows
        }

    async def gone_records(self, namespace: str) -> dict[int, dict[str, bytes]]:
        records: dict[int, dict[str, bytes]] = {}
        for owner, key, value in await self._reads.fetch(GONE_RECORDS_SQL, (namespace, self.node)):
            records.setdefault(int(owner), {})[str(key)] = bytes(value)
        return records

    async def unheld_states(self, queue: str) -> dict[int, int]:
        rows = await self._reads.fetch(UNHELD_SQL, (queue,))
        return {int(state): int(count) for state, count in rows}

    async def unheld_by_queue(self) -> dict[str, dict[int, int]]:
        counts: dict[str, dict[int, int]] = {}
        for queue, state, count in await self._reads.fetch(UNHELD_ALL_SQL, ()):
            counts.setdefault(str(queue), {})[int(state)] = int(count)
        return counts

    def forget_interest(self) -> None:
        self._queues.clear()
        self._functions.clear()
        self._asked.clear()

    # ------------------------------------------------------------------ leases

    async def _heartbeats(self) -> None:
        lease = self.store.lease
        renewed = time.monotonic()  # the lease runs until `renewed + lease` at least
        while not self._closed:
            sent = time.monotonic()
            try:
                await self._heartbeat(lease)
                renewed = sent
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._closed:
                    return
                if time.monotonic() - renewed >= lease:
                    self._fatal(f"node {self.node} could not renew its lease ({_reason(exc)})")
                    return
                log.warning("cluster: heartbeat failed: %s", _reason(exc))
            if self._closed:
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(lease / 3):
                    await self._beat_now.wait()
            self._beat_now.clear()

    async def _heartbeat(self, lease: float) -> None:
        rows = await self._beat.fetch(HEARTBEAT_SQL, (lease, self.node, self.node, self.node))
        if not rows:
            self._fatal(
                f"node {self.node} was declared dead by the cluster (its lease ran out) and its"
                " jobs requeued: stopping so that none runs twice"
            )
            return
        peers = int(rows[0][0])
        gone = peers < self.peers
        if peers != self.peers:
            log.info("cluster: %d nodes", peers + 1)
            self.peers = peers
            observers = self.engine.observers
            if peers and self._observed not in observers:
                observers.append(self._observed)  # to offer foreground jobs to the others
            elif not peers and self._observed in observers:
                observers.remove(self._observed)
                self.shared.alone()
            if peers:
                self.want_all()  # workers idle here may get what the others keep
        if self.links is not None and self.links.address is not None:
            try:  # the lease is renewed: a failed look at the peers must not count against it
                await self.links.refresh()
            except Exception as exc:
                log.warning("cluster: could not read the other nodes' links: %s", _reason(exc))
        dead, requeued, _ = (await self._beat.fetch(REAP_SQL, (self.node, self.store.channel)))[0]
        if dead:
            self.requeued += int(requeued)
            log.warning(
                "cluster: %d node(s) found dead, %d of their jobs back in the shared queue",
                dead,
                requeued,
            )
        if dead or gone:  # their scheduled jobs wait in the shared queue now
            await self._watch_due()
        if (dead or gone) and self._record_hooks:
            await self._adopt_records()
        if self._addressed_hooks:
            try:  # like the links: a failed look must not count against the lease
                await self._read_addressed()
            except Exception as exc:
                log.warning("cluster: could not read the records left for this node: %s", exc)
        if self.store.keys_left < KEY_BLOCK // 2:
            await self._take_keys()

    def _keys_low(self) -> None:
        if not self._closed and self._loop is not None:
            self._loop.create_task(self._take_keys())

    async def _take_keys(self) -> None:
        """The next block of row keys, before the store needs it (else it takes it itself,
        waiting for the round trip)."""
        store = self.store
        if store.spare_keys is not None:
            return
        try:
            first = int((await self._claims.fetch("SELECT nextval('job_keys')", ()))[0][0])
        except Exception as exc:
            log.warning("cluster: could not take row keys ahead: %s", _reason(exc))
            return
        if store.spare_keys is None:
            store.spare_keys = (first, first + KEY_BLOCK - 1)

    # ------------------------------------------------------------------ wake-ups

    async def _listener(self) -> None:
        delay = RECONNECT_MIN
        channel = sql.SQL("LISTEN {}; LISTEN {}").format(
            sql.Identifier(self.store.channel), sql.Identifier(self.node_channel)
        )
        while not self._closed:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.store.dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT
                )
                self._listen = conn
                await conn.execute(channel)
                delay = RECONNECT_MIN
                self._want_everything()  # what was notified while not listening
                async for note in conn.notifies():
                    if note.channel == self.node_channel:
                        self._inbox.put_nowait(note.payload)
                    else:
                        self._heard(note.payload)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._closed:
                    return
                log.warning("cluster: listening failed, again in %.2fs: %s", delay, _reason(exc))
                listen, self._listen = self._listen, None
                if listen is not None:
                    listen.pgconn.finish()
                await asyncio.sleep(delay)
                delay = min(delay * 2, RECONNECT_MAX)

    async def _start_links(self) -> None:
        assert self.links is not None
        try:
            await self.links.start(self.store.channel)
            await self.links.refresh()
        except Exception as exc:
            log.warning("cluster: no peer links (foreground jobs go by the shared queue): %s", exc)
            await self.links.close()
            self.links = None

    def _heard(self, payload: str) -> None:
        if payload.startswith(SHARED_NOTE):
            self.shared.heard(payload)
            return
        if payload.startswith(ASK_NOTE):
            node, _, rest = payload[1:].partition("\x1f")
            count, _, key = rest.partition("\x1f")
            if node != str(self.node) and count.isdigit() and key[:1] in ("f", "q"):
                self._give(key, int(count))
            return
        self._notes += 1
        function, separator, queue = payload.partition("\x1f")
        if not separator:  # "nodes": one came or went
            self._beat_now.set()
            return
        self._dry.discard("f" + function)
        self._dry.discard("q" + queue)
        fn = self.engine.functions.get(function)
        if fn is not None and fn.waiters:
            self._functions.add(function)
            self._want()
        if queue in self._queues:
            self._want()

    async def _polls(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.poll)
            self._want_everything()
            await self._watch_due()

    async def _watch_due(self) -> None:
        """Claim again when the shared queue's next job comes due, if that is sooner than
        the claim already planned (a lost look is the poll's to make up for)."""
        try:
            rows = await self._reads.fetch(NEXT_DUE_SQL, (time.time(),))
        except Exception as exc:
            log.warning("cluster: could not read when the shared queue's jobs come due: %s", exc)
            return
        at = rows[0][0] if rows else None
        if at is None or self._closed or self._loop is None:
            return
        if self._due is not None:
            if self._due[0] <= at:
                return
            self._due[1].cancel()
        self._due = (at, self._loop.call_later(max(0.0, at - time.time()), self._came_due))

    def _came_due(self) -> None:
        self._due = None
        if self._closed or self._loop is None:
            return
        self.want_all()
        self._loop.create_task(self._watch_due())  # and the next one

    def _want_everything(self) -> None:
        self.shared.refresh()
        self.want_all()

    def want_all(self) -> None:
        """Claim for every idle worker and recent fetch, whatever was claimed dry (and a
        claim in flight now does not mark anything dry: it may have missed the change)."""
        self._notes += 1
        self._dry.clear()
        for name, fn in self.engine.functions.items():
            if fn.waiters:
                self._functions.add(name)
        self._want()

    # ------------------------------------------------------------------ engine hooks

    def _idle_worker(self, worker: WorkerSession) -> None:
        if self._closed:
            return
        wanted = False
        asking = not worker.waiting  # a grab that found nothing, not a worker going to sleep
        for name in worker.abilities:
            if "f" + name not in self._dry:
                self._functions.add(name)
                if asking:
                    self._asked.setdefault(name, set()).add(worker.id)
                wanted = True
        if wanted:
            self._want()
        if self.links is not None:
            self.links.worker_idle(worker.abilities)

    def _short_fetch(self, queues: Sequence[str], missing: int) -> None:
        if self._closed:
            return
        until = time.monotonic() + FETCH_INTEREST
        wanted = False
        for queue in queues:
            self._queues[queue] = (missing, until)
            if "q" + queue not in self._dry:
                wanted = True
        if wanted:
            self._want()

    def _releases(self, job: Job) -> bool | WrittenAs:
        """At the end of the turn that created `job`: write it to the shared queue (and let
        it leave this engine) when other nodes run and no local worker is free for it; a
        background job as a linked node's that has one (`_handed`)."""
        links = self.links
        handed_here = None if job.background else _handed_here(job)  # links carry fg jobs
        if handed_here is not None:  # another node's job: it stays, or goes back to its node
            if handed_here.settled():
                return False  # its node was told it stays here (its link broke)
            broken = handed_here.link_broken()  # its node takes it back: it must not stay
            if (broken or (self.peers and not self.keeps(job))) and self.engine.release(job):
                if not broken:
                    handed_here.refuse(job)
                if links is not None:
                    links.taken -= 1
            else:
                handed_here.acknowledge()
            return False
        if not self.peers:
            return False  # alone
        held = self.shared.releases_held(job)
        if held is not None:
            return held  # a job held back until its unique key is settled
        if job.background == bool(job.subscribers) or self.keeps(job):
            return False  # a background job a client waits on, or an orphan; or kept
        if (
            not job.background
            and links is not None
            and _linkable(job)
            and links.can_hand_over(job.function)
            and self.engine.release(job)
        ):
            self.wait_elsewhere(job)
            links.hand_over(job)
            return False  # nothing to write: the job went over a link
        if not self.engine.release(job):
            return False
        if job.background and (linked := self.written_as_linked(job)) is not None:
            return linked
        self.released += 1
        if not job.background:  # its client waits here: the node that runs it will say
            self.wait_elsewhere(job)
        return True

    def _retract_released(self, jobs: Iterable[Job]) -> None:
        """A batch that offered foreground jobs to the shared queue failed: their clients,
        answered JOB_CREATED at once, hear that the job failed (the engine's own retraction
        skips them: they left it)."""
        for job in jobs:
            if not job.background and job in self.waits.get(job.id, ()):
                self.tell_finished(job.id, JobState.CANCELLED, None, None)

    def written_as(self, job: Job) -> WrittenAs | None:
        """A held foreground job about to be offered (its unique key goes into the index with
        its row): written as this node's if a worker here is free for it, or as the node's
        a link says has one, which runs it once the batch commits (`written`), without a
        claim; None: nobody's, in the shared queue."""
        if self.keeps(job, waiting_here=1):
            node = self.node
        elif self.links is not None and (link := self.links.reserve(job.function)) is not None:
            node = link.node
        else:
            return None
        self._written_as[job.id] = node
        return WrittenAs(node)

    def written_as_linked(self, job: Job) -> WrittenAs | None:
        """A background job leaving this engine: written as the node's a link says has a
        worker free for it, which runs it once the batch commits (`written`), without a
        notification or a claim; None: nobody's, in the shared queue."""
        link = self.links.reserve(job.function) if self.links is not None else None
        if link is None:
            return None
        self._written_as[job.id] = link.node
        return WrittenAs(link.node)

    def written(self, job: Job) -> None:
        """`job`'s batch committed (a foreground job's with its key): to the node it was
        written as, if one."""
        node = self._written_as.pop(job.id, None)
        if node is None or (not job.background and job not in self.waits.get(job.id, ())):
            return  # nobody's, or its clients went
        row = _link_row(job)
        if node == self.node:
            self.load([(*row, self.node)])  # as if claimed: its clients wait here
        elif self.links is None or not self.links.send_row(node, job.id, row, job.background):
            self.free_rows(node, [job.row])

    def unwritten(self, job: Job) -> None:
        """`job`'s batch failed, or another job holds its key: no row of it was written."""
        self._written_as.pop(job.id, None)

    def _sending(self, jobs: list[Job]) -> None:
        """A batch with background jobs written as linked nodes' goes to commit: each row
        goes to its node now, over their link, and the job runs there at once, as it would
        here; that node writes nothing of it until it hears how the commit ended
        (`_handed`). Rows whose link is down go once committed, or back to the shared
        queue (`written`). So do the rows of jobs with a unique key: such a job runs only
        once its commit has shown that it holds its key (another job may hold it)."""
        links = self.links
        held = self.store.held
        for job in jobs:
            node = self._written_as.get(job.id)
            if node is None or links is None or node == self.node or job.id in held:
                continue
            if links.send_row(node, job.id, _link_row(job), True, ahead=True):
                del self._written_as[job.id]
                self._sent_ahead[job.id] = node

    def _handed(self, jobs: list[Job], committed: bool) -> None:
        """A batch with background jobs written as linked nodes' finished: the nodes they
        were sent to hear how; the others, committed, go to theirs now; failed, they were
        never written (their submits heard so)."""
        for job in jobs:
            node = self._sent_ahead.pop(job.id, None)
            if node is not None:
                if self.links is not None:
                    self.links.row_committed(node, job.id, committed)
            elif committed:
                self.written(job)
            else:
                self.unwritten(job)

    def free_rows(self, node: int, rows: list[int]) -> None:
        """Rows written as `node`'s that it will not run (its link broke, or it refused
        them) go to the shared queue, unless that node's lease ran out first (then they are
        there already) or it took them in another way. While this node stops too: its
        links' last rows come back as they close (`close` waits for them)."""
        if self._loop is not None and not self._dropped:
            task = self._loop.create_task(self._free_rows(node, rows))
            self._freeing.add(task)
            task.add_done_callback(self._freeing.discard)

    async def _free_rows(self, node: int, rows: list[int]) -> None:
        try:
            await self._claims.fetch(FREE_ROWS_SQL, (rows, node, self.store.channel))
        except Exception as exc:
            log.warning(
                "cluster: %d job(s) written as node %d's stay its own: %s",
                len(rows),
                node,
                _reason(exc),
            )

    def load_from_link(self, row: tuple[Any, ...], subscriber: Subscriber | None) -> bool:
        """A row another node wrote as this node's and sent over a link: into the engine,
        what happens to it going to `subscriber` (a foreground job's). False: refused (an id
        here already, or this node stops)."""
        if self._closed or self.engine.jobs.get(str(row[0])) is not None:
            return False
        self.load([(*row, None)], subscriber)
        return True

    async def node_gone(self, node: int) -> bool:
        """Whether `node` is gone: its lease ran out, or no session holds its lock (its
        process died; the lock is taken and let go at once)."""
        rows = await self._claims.fetch(NODE_GONE_SQL, (node, node))
        return bool(rows[0][0])

    def take_back(self, job: Job) -> None:
        """A job handed to another node came back (refused, or its link broke): queued here
        again as a new job, which the next batch offers again (`_releases`)."""
        if self._closed or not self.stop_waiting(job):
            return  # finished meanwhile, or this node stops
        engine = self.engine
        if engine.jobs.get(job.id) is not None:
            return
        engine.jobs.add(job)
        engine.activate(job)  # PENDING -> AVAILABLE: a worker here may take it at once
        job.row = 0
        self.store.job_saved(job)

    def keeps(self, job: Job, waiting_here: int = 0) -> bool:
        """Whether a new job stays here rather than going to the shared queue: a worker here
        is free for it, or its queue was fetched here lately. `waiting_here`: 1 for a job not
        yet in its function's count of available jobs (held back)."""
        fn = self.engine.functions.get(job.function)
        if fn is not None and len(fn.workers) - fn.running >= fn.available + waiting_here:
            return True
        interest = self._queues.get(job.queue)
        return interest is not None and interest[1] > time.monotonic()

    def _observed(self, event: str, job: Job) -> None:
        """A new foreground job goes to the store with this turn's batch, which decides at
        its end whether to offer it to the other nodes (`_releases`) or to keep it unstored
        (one with a unique key is always offered, so that the index holds its key).
        A job queued again here (its worker's lease ran out, or it failed and retries at
        once) goes to the shared queue unless a worker here is free for it: the worker or
        fetcher this node gave it to let it go, and another node's may be waiting. So does
        a scheduled job that comes due, if a linked node has a worker free for it. A job
        that ends tells the peer links that its function's workers may be free."""
        if event == "job.enqueued" and not job.background and job.subscribers:
            self.store.job_saved(job)
        elif event == "job.retrying" and job.state is JobState.AVAILABLE and _movable(job):
            assert self._loop is not None
            self._loop.call_soon(self._share_requeued, job)  # once the requeue is over
        elif event == "job.due" and job.state is JobState.AVAILABLE and _movable(job):
            assert self._loop is not None
            self._loop.call_soon(self._share_due, job)
        elif job.state.terminal and self.links is not None:
            # Its worker may be free again without asking for work (one that runs several
            # jobs at once asked while it ran this one): the other nodes hear of it.
            self.links.worker_idle((job.function,))

    def _share_requeued(self, job: Job) -> None:
        fn = self.engine.functions.get(job.function)
        if fn is not None and len(fn.workers) - fn.running >= fn.available:
            return  # a worker here takes it
        self._give_one(job)

    def _share_due(self, job: Job) -> None:
        """A scheduled job (or a retry's delay) came due: when no worker here is free for it
        and no fetch asked for its queue here lately, but a linked node has a worker free for
        it (its link says so), it goes to the shared queue, so that worker is woken now, not
        when its node next asks. Otherwise it waits here: the next fetch may well come here
        (given away, another node's fetchers of its queue would keep it)."""
        if (
            job.state is JobState.AVAILABLE
            and self.links is not None
            and not self.keeps(job)
            and self.links.can_hand_over(job.function)
        ):
            self._give_one(job)

    def _give_one(self, job: Job) -> None:
        if self.peers and self.store.givable(job) and self.engine.release(job):
            _keep_error(job)  # written with the row, for the node that runs it next
            self.store.give_away(job)
            self.given += 1

    def watch_claims(self, hook: Callable[[Job], None]) -> None:
        self._claim_hooks.append(hook)

    def watch_adopted_records(self, hook: Callable[[str, dict[str, bytes]], None]) -> None:
        self._record_hooks.append(hook)

    def watch_addressed_records(
        self, namespace: str, kept: str, hook: Callable[[dict[str, bytes]], None]
    ) -> None:
        self._addressed_hooks.append((namespace, kept, hook))
        self._beat_now.set()  # a look now: a node starting with records adopted

    async def _read_addressed(self) -> None:
        """At each heartbeat: the shared records other nodes left for records this node
        keeps (`ClusterView.watch_addressed_records`), to their hooks."""
        for namespace, kept, hook in self._addressed_hooks:
            asked = {"namespace": namespace, "kept": kept, "node": self.node}
            rows = await self._beat.fetch(ADDRESSED_SQL, asked)
            if rows:
                hook({str(key): bytes(value) for key, value in rows})

    async def _adopt_records(self) -> None:
        """A node went (found dead, or left): its workflows and dead letters become this
        node's, unless another live node took them first (a row lock and a second look)."""
        rows = await self._beat.fetch(ADOPT_RECORDS_SQL, (self.node, RUNTIME_ADOPTED, self.node))
        if not rows:
            return
        adopted: dict[str, dict[str, bytes]] = {}
        for namespace, key, value in rows:
            adopted.setdefault(str(namespace), {})[str(key)] = bytes(value)
        log.warning(
            "cluster: took over %s of nodes gone",
            ", ".join(
                f"{len(records)} {namespace} record(s)" for namespace, records in adopted.items()
            ),
        )
        for namespace, records in adopted.items():
            for hook in self._record_hooks:
                hook(namespace, records)

    # ------------------------------------------------------------------ claims

    def _want(self) -> None:
        if self._closed:
            return
        if self._pass is not None and not self._pass.done():
            self._again = True
            return
        assert self._loop is not None
        self._pass = self._loop.create_task(self._claim_pass())

    async def _claim_pass(self) -> None:
        try:
            while not self._closed:
                self._again = False
                functions, self._functions = self._functions, set()
                asked, self._asked = self._asked, {}
                for name in functions:
                    fn = self.engine.functions.get(name)
                    if fn is not None:
                        await self._claim(CLAIM_BY_FUNCTION, "f" + name, name, _wanted(fn, asked))
                now = time.monotonic()
                for queue in list(self._queues):
                    interest = self._queues.get(queue)  # as of now: a fetch may have claimed
                    if interest is None or queue in self._fetching:
                        continue  # or claims for it right now
                    missing, until = interest
                    if until <= now:
                        del self._queues[queue]
                        continue
                    info = self.engine.queues.get(queue)
                    queued = info.available if info is not None else 0
                    await self._claim(CLAIM_BY_QUEUE, "q" + queue, queue, missing - queued)
                if not self._again:
                    return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("cluster: claiming failed: %s", _reason(exc))

    async def _claim(
        self, statement: str, key: str, name: str, wanted: int, *, even_dry: bool = False
    ) -> int:
        """Claim up to `wanted` shared jobs of a function or queue into the engine: how many.
        A key found dry is skipped until a notification, unless `even_dry` (a fetch waiting,
        which must not miss a job whose notification is still on its way)."""
        if wanted <= 0 or (key in self._dry and not even_dry):
            return 0
        limit = min(wanted, CLAIM_MAX)
        parameters = {"node": self.node, "name": name, "now": time.time(), "limit": limit}
        notes = self._notes
        rows = await self._claims.fetch(statement, parameters)
        if len(rows) < limit:
            if notes == self._notes:
                self._dry.add(key)  # nothing more is waiting: look again when told
            self._ask(key, limit - len(rows))
        if rows:
            self.claimed += self.load(rows)
        return len(rows)

    # ------------------------------------------------------------------ rebalancing

    def _ask(self, key: str, missing: int) -> None:
        """Workers here wait for `missing` more jobs of `key` ("f" + function, "q" + queue)
        than the shared queue had: ask the other nodes for queued jobs they keep."""
        if not self.peers or self._closed or self._loop is None:
            return
        now = time.monotonic()
        wait = self._asked_at.get(key, -ASK_INTERVAL) + ASK_INTERVAL - now
        if wait > 0:  # asked lately: ask again once the interval is over, the latest count
            if key not in self._asks_due:
                self._loop.call_later(wait, self._ask_due, key)
            self._asks_due[key] = missing
            return
        self._asked_at[key] = now
        self._outbox.put_nowait(
            (self.store.channel, f"{ASK_NOTE}{self.node}\x1f{missing}\x1f{key}")
        )

    def _ask_due(self, key: str) -> None:
        missing = self._asks_due.pop(key, 0)
        if missing:
            self._ask(key, missing)

    def _give(self, key: str, wanted: int) -> int:
        """Another node asked for `wanted` jobs of `key`: give up to that many queued jobs
        of it, the best first, to the shared queue, of those this node's own free workers
        will not take (a function's surplus over its idle workers). Only background jobs
        without a client waiting here, whose rows are written, queued for `GIVE_AFTER`
        seconds at least (younger ones are given once they are that old, if asked for)."""
        if self._closed or wanted <= 0:
            return 0
        engine = self.engine
        name = key[1:]
        if key[0] == "f":
            fn = engine.functions.get(name)
            lanes = [] if fn is None else list(fn.lanes.values())
        else:
            lanes = [fn.lanes[name] for fn in engine.functions.values() if name in fn.lanes]
        spare: dict[str, int] = {}
        chosen: list[Job] = []
        now = time.time()
        young: float | None = None  # when the first job too young to give is old enough
        for lane in lanes:
            fn = lane.function
            left = spare.get(fn.name)
            if left is None:
                left = fn.available - max(0, len(fn.workers) - fn.running)
            for level in lane.levels:  # highest priority first, each oldest first
                for job in level.entries():
                    if len(chosen) >= wanted or left <= 0:
                        break
                    if job.state is not JobState.AVAILABLE or not _movable(job):
                        continue
                    if not self.store.givable(job):
                        continue
                    since = max(job.created_at, job.run_at or 0.0)
                    if now - since < GIVE_AFTER:
                        young = min(young or now + GIVE_AFTER, since + GIVE_AFTER)
                        continue
                    chosen.append(job)
                    left -= 1
            spare[fn.name] = left
        given = 0
        for job in chosen:
            if engine.release(job):
                _keep_error(job)
                self.store.give_away(job)
                given += 1
        if given:
            self.given += given
            log.debug("cluster: gave %d queued job(s) of %s to the shared queue", given, name)
        if young is not None and given < wanted and key not in self._gives_due:
            assert self._loop is not None
            self._gives_due.add(key)
            self._loop.call_later(young - now, self._give_due, key, wanted - given)
        return given

    def _give_due(self, key: str, wanted: int) -> None:
        self._gives_due.discard(key)
        self._give(key, wanted)

    async def claim_for_fetch(self, queues: Sequence[str], missing: int) -> int:
        """For a fetch by queue that found fewer jobs than it asked for: claim up to
        `missing` shared jobs of `queues`, in order, into the engine now, and answer how many
        (the fetch then takes them). Alone, nothing is shared: no round trip. A fetch that
        goes away meanwhile does not stop the claim: what it claimed stays queued here."""
        if self._closed or not self.peers or self._loop is None:
            return 0
        names = list(queues)
        for queue in names:  # before the background claim this fetch set off gets to run
            self._fetching[queue] = self._fetching.get(queue, 0) + 1
        claiming = self._loop.create_task(self._claim_for_fetch(names, missing))
        return await asyncio.shield(claiming)

    async def _claim_for_fetch(self, queues: list[str], missing: int) -> int:
        claimed = 0
        try:
            for queue in queues:
                info = self.engine.queues.get(queue)
                if info is not None and info.paused:
                    continue
                queued = info.available if info is not None else 0  # held back by a limit
                got = await self._claim(
                    CLAIM_BY_QUEUE, "q" + queue, queue, missing - claimed - queued, even_dry=True
                )
                claimed += got
                interest = self._queues.get(queue)
                if interest is not None and got:  # what the background claim need not
                    self._queues[queue] = (max(0, interest[0] - got), interest[1])
                if claimed >= missing:
                    break
        except Exception as exc:  # the fetch answers with what there is
            log.warning("cluster: claiming for a fetch failed: %s", _reason(exc))
        finally:
            for queue in queues:
                left = self._fetching[queue] - 1
                if left:
                    self._fetching[queue] = left
                else:
                    del self._fetching[queue]
        return claimed

    def load(self, rows: list[tuple[Any, ...]], subscriber: Subscriber | None = None) -> int:
        """Claimed rows into the engine, best first, through replay; a foreground job's
        client, waiting on another node, hears of it through that node (or `subscriber`).
        How many went into the engine."""
        jobs = [StoredJob(*row[:-1]) for row in rows]  # each row: StoredJob's, client_node
        clients = {
            job.row: row[-1] for job, row in zip(jobs, rows, strict=True) if row[-1] is not None
        }
        jobs.sort(key=lambda job: (-job.priority, job.created_at, job.row))
        for job in jobs:
            job.payload = bytes(job.payload)
            if job.ext is not None:
                job.ext = bytes(job.ext)
        fresh = [job for job in jobs if self.engine.jobs.get(job.id) is None]
        loaded = self.engine.replay(fresh)
        for stored in fresh:
            client = clients.get(stored.row)
            claimed = self.engine.jobs.get(stored.id)
            if claimed is not None:
                _restore_error(claimed)
                for hook in self._claim_hooks:
                    hook(claimed)
            if claimed is None or claimed.state.terminal:
                continue
            if subscriber is not None:
                self.engine.subscribe(claimed, subscriber)
            elif client is not None:
                self.engine.subscribe(claimed, self.client_of(int(client), claimed.id))
        return loaded

    def client_of(self, node: int, job_id: str) -> Subscriber:
        """The subscriber that tells `node`'s clients waiting on `job_id` what happens to the job
        running here: over that node's channel, or directly when they wait here."""
        if node == self.node:
            return Forwarder(self, job_id)
        return RemoteClient(self._outbox, node_channel(self.store.channel, node))


def _wanted(fn: FunctionInfo, asked: dict[str, set[str]]) -> int:
    """How many shared jobs of `fn` to claim: none unless a worker here waits for one; then one
    per waiting worker and one per job of it running here, less those queued here. One
    connection may run many jobs at once (the SDK's worker runs `concurrency` of them over
    one): claiming only per waiting connection took one job per round trip and commit, 458
    jobs/s end to end on two nodes against 11,050 on one (bench/pg_peers.py). What the node
    claims beyond what its workers start at once waits here, where another node's ask can
    still take it."""
    idle = len(fn.waiters) + len(asked.get(fn.name, ()))
    if idle <= 0:
        return 0
    return max(idle + fn.running, CLAIM_BATCH) - fn.available


def _movable(job: Job) -> bool:
    """A queued job another node may run as well as this one: a background job no client
    waits on here, whose end no state of this node's follows (a Titanic request, whose reply
    is kept where it was asked for). A workflow's step moves: the node that runs it tells
    the workflow's node of its end (`jobwire.server.ojs.workflows`)."""
    return job.background and not job.subscribers and job.origin != ORIGIN_TITANIC


def _link_row(job: Job) -> tuple[Any, ...]:
    """A new job's row as a link carries it: StoredJob's order (`_STORED`: seq moves after
    ext), available."""
    full = full_row(job)  # the table's column order: seq first
    return (*full[1:7], int(JobState.AVAILABLE), *full[8:14], full[0], full[14])


def _handed_here(job: Job) -> PeerClient | None:
    """The link a job came by from another node (`jobwire.store.peerlink`), if it did."""
    for subscriber in job.subscribers or ():
        if isinstance(subscriber, PeerClient):
            return subscriber
    return None


def _linkable(job: Job) -> bool:
    """A foreground job another node can run from what a link carries: no unique key (the
    index holds those), no options of an adapter, no reducer, not handed over already."""
    if job.unique is not None or job.ext is not None or job.reducer is not None:
        return False
    return _handed_here(job) is None


def detached_job(row: StoredJob) -> Job:
    """A job record of a stored row, for status replies only (no engine holds it)."""
    job = Job(
        row.id,
        row.function,
        bytes(row.payload),
        row.queue,
        row.unique,
        row.priority,
        True,
        row.created_at,
    )
    job.state = JobState(row.state)
    job.attempts = row.attempts
    job.max_attempts = row.max_attempts
    job.run_at = row.run_at
    job.reducer = row.reducer
    job.origin = row.origin
    if row.ext is not None:
        job.ext = decode_ext(bytes(row.ext))
        _restore_error(job)
    return job


#: The `ext` key that carries a requeued job's last error to the node that runs it next
#: (the engine keeps `Job.error` in memory only; OJS shows it as the job's `error`).
REQUEUED_ERROR = "requeued_error"


def _keep_error(job: Job) -> None:
    error = job.error
    if error is None or job.ext is None:
        return
    if isinstance(error, bytes):
        error = error.decode("utf-8", "replace")
    job.ext[REQUEUED_ERROR] = error if isinstance(error, dict) else str(error)


def _restore_error(job: Job) -> None:
    if job.error is None and job.ext is not None and REQUEUED_ERROR in job.ext:
        job.error = job.ext[REQUEUED_ERROR]


def node_channel(channel: str, node: int) -> str:
    return f"{channel}.n{node}"


def _text(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _bytes(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


class Forwarder:
    """A `Subscriber` that hands what it hears of a job to the clients of this node waiting on
    `job_id` (`ClusterNode.waits`): for a job claimed here whose client waits here too, or a
    job run here in the place of the one they wait on (`jobwire.store.pgfollow`)."""

    def __init__(self, cluster: ClusterNode, job_id: str) -> None:
        self.cluster = cluster
        self.job_id = job_id

    def job_progress(self, job: Job, done: int, total: int) -> None:
        self.cluster.tell_progress(self.job_id, done, total)

    def job_output(self, job: Job, kind: Output, data: bytes) -> None:
        self.cluster.tell_output(self.job_id, kind, data)

    def job_finished(
        self, job: Job, state: JobState, result: bytes | None, error: bytes | None
    ) -> None:
        self.cluster.tell_finished(self.job_id, state, result, error)


class RemoteClient:
    """A `Subscriber` for a foreground job claimed here whose client waits on another node:
    what the engine tells it goes to that node, in order."""

    def __init__(self, outbox: asyncio.Queue[tuple[str, str]], channel: str) -> None:
        self.outbox = outbox
        self.channel = channel

    def _send(self, message: dict[str, Any]) -> None:
        self.outbox.put_nowait((self.channel, json.dumps(message, separators=(",", ":"))))

    def job_progress(self, job: Job, done: int, total: int) -> None:
        self._send({"j": job.id, "e": "p", "d": done, "t": total})

    def job_output(self, job: Job, kind: Output, data: bytes) -> None:
        self._send({"j": job.id, "e": "o", "k": int(kind), "b": _text(data)})

    def job_finished(
        self, job: Job, state: JobState, result: bytes | None, error: bytes | None
    ) -> None:
        self._send({"j": job.id, "e": "f", "s": int(state), "r": _text(result), "x": _text(error)})
