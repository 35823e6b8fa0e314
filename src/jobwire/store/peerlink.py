"""Links between the nodes of a cluster, for foreground jobs (docs/scaling.md, "Peer links").

A foreground job whose worker is on another node went through the shared queue: the job's
row committed here, a notification, the other node's claim and its commit, and the result's
notification back, 5-6 ms in series. When another node has a worker free for the job, the
node hands it over a TCP link instead: nothing is written (a foreground job is not stored,
as on one node), the other node runs it as its own client's job, and what happens to it
comes back over the same link.

- Each node listens on `--peer-listen` and writes the address into its `nodes` row; it dials
  every other live node that has one (`refresh`, at each heartbeat).
- A link starts with challenges both ways: the listening node sends random bytes, the
  dialer answers with its node id, their HMAC-SHA256 under the cluster's secret (a row of
  the schema, `cluster_secret`: whoever can read the jobs can read it) and random bytes of
  its own, which the listening node answers the same way before anything else. Anything
  else closes the link: neither node hands a job to one that does not know the secret.
- A node with `--tls-cert` serves its links over TLS with that certificate (advertised as
  "tls:HOST:PORT"). The dialer does not check the certificate against a CA (a node's
  certificate names what its clients dial, not its peers' addresses); instead both answers
  cover the certificate's SHA-256 too, so a node in the middle, which cannot show the
  listening node's certificate, cannot relay them.
- The listening node tells its dialers how many workers it has free, per function, each
  time one of them waits for work; the dialer counts that down as it hands jobs over.
- The receiving node runs a job handed to it like any foreground job of its own clients. It
  refuses a job it cannot take: its workers got busy meanwhile, its id is already there, or
  its queue is full. The job then comes back to its node, which queues it again, with the
  refusing node's free-worker count. The receiving node never passes a job on through the
  shared queue: a row of it there, and its node's copy after a broken link, would be two.
- The receiving node acknowledges each job it keeps ("got", at the end of the turn that
  took it, once it can no longer refuse it), and keeps every frame it sent on the link
  until the dialer says it read it (each frame the dialer sends carries how many it read).
- A link that breaks is settled: the dialer asks the other node, by notification (the
  operation `link.settle`, `jobwire.store.pgremote`), which of the link's jobs it keeps,
  saying how many frames it read. That node reads nothing more from the link and answers
  with the frames the dialer missed (an end, a refusal, an acknowledgement lost with the
  link) and the jobs it keeps. The dialer hears those frames as if the link had brought
  them, queues again the jobs the other node does not keep (rows go back to the shared
  queue), and leaves the kept ones where they run: their news comes by notification from
  then on (`jobwire.store.pgcluster.RemoteClient`), as for a foreground job claimed from the
  shared queue. Before the answer, the other node sends nothing by notification (a frame
  would come twice) and lets go of a job that came by the link in the same turn (the
  answer then does not name it). Only when the other node is found gone before it answers
  (its lock free or its lease run out, and silent for an ask) are all the link's jobs
  given back, as are kept ones later should that node go.

Background jobs go over the links as rows: a new background job that no worker here is
free for, when another node has one, is written (in its batch's commit, which its submit's
acknowledgement waits for) as that node's row, and the row goes over the link as the commit
begins ("w"): the job starts there at once, as it would have here, and is acknowledged.
That node writes nothing of the job until the dialer says how the commit ended ("ok", or
"drop": the job is retracted, and its removal deletes the row should the commit have landed
unanswered): written earlier, an update would insert the row (the commit then fails on it),
a delete would find nothing. From then on the row is that node's, as if it had claimed it
(should it die, its lease frees the row). A row sent when the link breaks is settled as
above: the dialer waits for the commits of its rows sent ahead to end and says how, with
its ask; a row the other node did not take goes back to the shared queue. Should the dialer
go first, the other node reads how those commits ended from the rows, once the dialer's
lease has run out. A row whose link is down as its commit begins goes once committed, or
back to the shared queue. A stopping node waits for its commits in flight, then a moment
for the acknowledgements of the rows it sent.

Frames: a 4-byte length, a 4-byte header length, the header (JSON), then the job's payload
or result, raw. Written by hand: a dozen lines over asyncio streams, where a messaging
library would bring a second event loop integration for two message kinds.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import logging
import secrets
import socket
import ssl
import struct
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import orjson

from jobwire.engine.job import Job, JobState, Output
from jobwire.ports.cluster import HolderAnswer, HolderUnavailable

if TYPE_CHECKING:
    from jobwire.engine.lanes import FunctionInfo
    from jobwire.server.auth import TLSFiles
    from jobwire.store.pgcluster import ClusterNode
    from jobwire.store.pgremote import RemoteJobs

log = logging.getLogger("jobwire.cluster")

_FRAME = struct.Struct(">II")
#: The challenge a listening node opens each link with: a tag and random bytes. The tag
#: carries the links' version: nodes of two versions do not link (during a rolling upgrade
#: their jobs go through the shared queue). 4: background rows sent ahead of their commit.
GREETING = b"JWPEER4\n"
#: How a node that serves its links over TLS advertises its address.
TLS_PREFIX = "tls:"
CHALLENGE_BYTES = 16
#: Bytes a frame may hold before the link is known: the answer to the challenge is short.
UNAUTHENTICATED_MAX = 1024
#: Bytes a frame may hold at most (a job's payload, or its result).
FRAME_MAX = 1 << 30
#: Seconds a dialer has to answer the challenge.
HANDSHAKE_TIMEOUT = 10.0
#: Seconds between two dials of a node whose link broke, at most.
REDIAL_MAX = 5.0
#: Seconds between two looks at whether a node whose link broke is gone.
GONE_CHECK = 0.5
#: Seconds a stopping node waits for its dials to end.
CLOSE_WAIT = 3.0
#: The operation that settles a broken link (`PeerLinks.settle`).
SETTLE = "link.settle"
#: The operation that asks whether a node lives (`PeerLinks.pong`).
PING = "link.ping"
#: Frames a dialer reads before it tells the other node so, when it has nothing to send.
READ_REPORT = 64
#: A frame this large (a result) is reported read at once.
REPORT_BYTES = 65536
#: Frames not kept for a link's settling: counts of free workers are stale by then.
_UNKEPT = frozenset({"free", "ready", "read"})

SECRET_SQL = """
WITH made AS (
    INSERT INTO cluster_secret (id, secret) VALUES (1, %s) ON CONFLICT (id) DO NOTHING
    RETURNING secret
)
SELECT secret FROM made UNION ALL SELECT secret FROM cluster_secret
"""
#: The host other nodes reach this one at, as PostgreSQL sees it (NULL over a Unix socket).
CLIENT_ADDRESS_SQL = "SELECT host(inet_client_addr())"
#: The node's address, and a word to the others that it is there (they dial it).
ADVERTISE_SQL = "UPDATE nodes SET peer = %s WHERE id = %s RETURNING pg_notify(%s, 'nodes')"
#: Whether a node's lease ran out (or its row is gone).
LEASE_OUT_SQL = "SELECT NOT EXISTS (SELECT 1 FROM nodes WHERE id = %s AND lease_until >= now())"
#: Which of these row keys are rows of this node's.
OWNED_SQL = "SELECT seq FROM jobs WHERE seq = ANY(%s) AND owner = %s"
PEERS_SQL = """
SELECT id, peer FROM nodes WHERE id <> %s AND lease_until >= now() AND peer IS NOT NULL
"""


class OtherVersionError(Exception):
    """The other node speaks another version of the links."""


def encode(header: dict[str, Any], blob: bytes = b"") -> bytes:
    head = orjson.dumps(header)
    return _FRAME.pack(4 + len(head) + len(blob), len(head)) + head + blob


async def read_frame(reader: asyncio.StreamReader, limit: int) -> tuple[dict[str, Any], bytes]:
    """The next frame: its header and blob. Raises ValueError for a malformed one and
    asyncio.IncompleteReadError when the link closes."""
    total, head_size = _FRAME.unpack(await reader.readexactly(_FRAME.size))
    if total < 4 or total - 4 < head_size or total > limit:
        raise ValueError(f"bad frame: {total} bytes, header {head_size}")
    data = await reader.readexactly(total - 4)
    header = orjson.loads(data[:head_size])
    if not isinstance(header, dict):
        raise ValueError("a frame's header is not an object")
    return header, data[head_size:]


def answer(secret: bytes, role: bytes, challenge: bytes, binding: bytes = b"") -> str:
    """The proof that a node (`role`: b"dialer" or b"listener") knows the cluster's secret,
    for this challenge and this link (`binding`: the listening node's certificate's
    SHA-256 over TLS, else nothing)."""
    return hmac.new(secret, role + challenge + binding, hashlib.sha256).hexdigest()


def certificate_binding(der: bytes | None) -> bytes:
    return hashlib.sha256(der).digest() if der else b""


def _dialer_context() -> ssl.SSLContext:
    """TLS for dialing a node: encrypted; the node is authenticated by its answer."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class Outbound:
    """This node's link to another node: jobs go out, what happens to them and the other
    node's free workers come back."""

    def __init__(self, links: PeerLinks, node: int, address: str) -> None:
        self.links = links
        self.node = node
        self.address = address
        self.writer: asyncio.StreamWriter | None = None
        #: Workers free on the other node, per function, less the jobs sent since it said.
        self.free: dict[str, int] = {}
        #: What the connection open now carries.
        self.carried = Carried()
        #: What broken connections carried, until their settling ends.
        self.settling: list[Carried] = []
        #: Jobs and rows of links that broke that the other node keeps, until it is found
        #: gone (then given back) or they end: their news comes by notification meanwhile.
        self.detached: dict[str, Job] = {}
        self.detached_rows: dict[str, int] = {}
        self._watching: asyncio.Task[None] | None = None
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        delay = 0.1
        told = False
        while not self.links.closing:
            try:
                await self._serve()
                delay = 0.1
            except asyncio.CancelledError:
                self._lost()
                raise
            except OtherVersionError as exc:
                if not told:  # an operator upgrading the nodes one by one wants to know
                    told = True
                    log.warning("cluster: no link to node %d: %s", self.node, exc)
            except Exception as exc:
                log.debug("cluster: link to node %d: %s", self.node, exc)
            self._lost()
            await asyncio.sleep(delay)
            delay = min(delay * 2, REDIAL_MAX)

    async def _serve(self) -> None:
        tls = self.address.startswith(TLS_PREFIX)
        host, port = split_address(self.address.removeprefix(TLS_PREFIX))
        context = _dialer_context() if tls else None
        # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a cancellation
        # that comes as its awaitable ends, and a node stopping then waited for this forever.
        async with asyncio.timeout(HANDSHAKE_TIMEOUT):
            reader, writer = await asyncio.open_connection(host, port, ssl=context)
        try:
            _tune(writer)
            async with asyncio.timeout(HANDSHAKE_TIMEOUT):
                greeting = await reader.readexactly(len(GREETING) + CHALLENGE_BYTES)
                if not greeting.startswith(GREETING):
                    if greeting.startswith(GREETING[:6]):
                        version = greeting[6 : len(GREETING) - 1].decode(errors="replace")
                        ours = GREETING[6:-1].decode()
                        raise OtherVersionError(
                            f"it speaks links of version {version}, this node {ours}: their"
                            " jobs go through the shared queue"
                        )
                    raise ValueError("not a jobwire node")
                challenge = greeting[len(GREETING) :]
                ssl_object = writer.get_extra_info("ssl_object")
                der = ssl_object.getpeercert(True) if ssl_object is not None else None
                binding = certificate_binding(der)
                secret, mine = self.links.secret, secrets.token_bytes(CHALLENGE_BYTES)
                mac = answer(secret, b"dialer", challenge, binding)
                writer.write(encode({"node": self.links.node, "mac": mac, "c": mine.hex()}))
                header, _ = await read_frame(reader, UNAUTHENTICATED_MAX)
            proof = header.get("mac")
            if header.get("o") != "ok" or not (
                isinstance(proof, str)
                and hmac.compare_digest(proof, answer(secret, b"listener", mine, binding))
            ):
                raise ValueError("the node did not prove it knows the cluster's secret")
            carried = self.carried = Carried(mine.hex())
            self.writer = writer
            reported = 0
            while True:
                header, blob = await read_frame(reader, FRAME_MAX)
                carried.read += 1
                self._heard(header, blob, carried)
                # The other node keeps what it sent until told it was read: say so often, and
                # at once after a large result.
                if carried.read - reported >= READ_REPORT or len(blob) >= REPORT_BYTES:
                    reported = carried.read
                    self._write({"o": "read", "k": reported})
        finally:
            self.writer = None
            writer.close()

    def _heard(self, header: dict[str, Any], blob: bytes, carried: Carried) -> None:
        """A frame from the other node, about the jobs `carried` (the open connection's, or
        a broken one's, whose missed frames its settling brought)."""
        live = carried is self.carried  # a settled frame's free-worker count is stale
        kind = header.get("o")
        if kind == "free":
            if live:
                self.free[str(header["f"])] = int(header["n"])
            return
        if kind == "read":  # the other node read this many frames: their words are heard
            unheard, read = carried.unheard, int(header["k"])
            while unheard and unheard[0][0] <= read:
                unheard.popleft()
            return
        if kind == "ready":  # the other node's free workers are known: jobs may go
            log.info("cluster: linked to node %d at %s", self.node, self.address)
            return
        job_id = str(header["j"])
        if kind == "got":
            if job_id in carried.background:  # the other node runs it: nobody waits here
                carried.background.discard(job_id)
                carried.rows.pop(job_id, None)
            elif job_id in carried.handed or job_id in carried.rows:
                carried.acked.add(job_id)
            return
        carried.acked.discard(job_id)
        cluster = self.links.cluster
        if kind == "p":
            cluster.tell_progress(job_id, int(header["d"]), int(header["t"]))
        elif kind == "o":
            cluster.tell_output(job_id, Output(int(header["k"])), blob)
        elif kind == "f":
            job = carried.handed.pop(job_id, None)
            function = job.function if job is not None else carried.rows.pop(job_id, (0, None))[1]
            if function is not None and live:  # its worker's free again, before its client hears
                self.free[function] = int(header["n"])
            error = header.get("x")
            cluster.tell_finished(
                job_id,
                JobState(int(header["s"])),
                blob if header.get("r") else None,
                None if error is None else base64.b64decode(error),
            )
        elif kind == "no":  # refused: queued again here, or its row in the shared queue
            job = carried.handed.pop(job_id, None)
            row = carried.rows.pop(job_id, None)
            carried.background.discard(job_id)
            function = job.function if job is not None else row[1] if row is not None else None
            if function is not None and live:  # as free as it says, before this node looks again
                self.free[function] = int(header.get("n") or 0)
            if job is not None:
                self.links.cluster.take_back(job)
            if row is not None and job_id in carried.ahead:
                carried.refused.add(job_id)  # freed once its commit ends, if it committed
            elif row is not None:
                self.links.cluster.free_rows(self.node, [row[0]])

    def hand(self, job: Job) -> None:
        assert self.writer is not None
        carried = self.carried
        carried.handed[job.id] = job
        header: dict[str, Any] = {"o": "run", "j": job.id, "f": job.function, "q": job.queue}
        header["p"] = job.priority
        header["g"] = job.origin
        header["k"] = carried.read
        self._write(header, job.payload)

    def send_row(self, row: tuple[Any, ...], background: bool, ahead: bool = False) -> None:
        """A row written as the other node's (StoredJob's fields): it runs the job. `ahead`:
        a background job's, sent as its commit begins (`row_committed` says how it ended)."""
        assert self.writer is not None
        job_id, function, queue, unique, payload, priority, _state = row[:7]
        attempts, max_attempts, run_at, created_at, reducer, ext, key, origin = row[7:]
        carried = self.carried
        carried.rows[job_id] = (key, function)
        header = {"o": "row", "j": job_id, "f": function, "q": queue, "u": unique}
        header.update(p=priority, a=attempts, m=max_attempts, r=run_at, c=created_at)
        header.update(d=reducer, s=key, g=origin, k=carried.read)
        if background:
            carried.background.add(job_id)
            header["b"] = 1
        if ahead:
            carried.ahead[job_id] = key
            header["w"] = 1
        header["x"] = None if ext is None else base64.b64encode(ext).decode()
        self._write(header, payload)

    def _write(self, header: dict[str, Any], blob: bytes = b"") -> None:
        """A frame on the connection open now, counted (the other node reports how many it
        read: `_heard`, "read")."""
        assert self.writer is not None
        self.carried.sent += 1
        self.writer.write(encode(header, blob))

    def row_committed(self, job_id: str, committed: bool) -> None:
        """The commit of a row sent ahead ended: the other node hears it over the
        connection the row went on; a broken one's settling carries it (it waits for it)."""
        for carried in (self.carried, *self.settling):
            key = carried.ahead.get(job_id)
            if key is None:
                continue
            if job_id in carried.refused:  # the other node never ran it
                del carried.ahead[job_id]
                carried.refused.discard(job_id)
                if committed:
                    self.links.cluster.free_rows(self.node, [key])
            elif carried is self.carried and self.writer is not None:
                # Kept until the other node says it read the frame: lost with the link, the
                # word goes with the settling's ask.
                del carried.ahead[job_id]
                header = {"o": "ok" if committed else "drop", "j": job_id, "k": carried.read}
                self._write(header)
                carried.unheard.append((carried.sent, job_id, committed))
            else:
                carried.outcomes[job_id] = committed
            if len(carried.outcomes) >= len(carried.ahead):
                carried.known.set()
            return
        # Not found: its connection settled without waiting (this node stops, after its
        # commits ended); the other node reads how it ended from the row (`Inbound.resolve`).

    def _lost(self) -> None:
        self.writer = None
        self.free.clear()
        carried, self.carried = self.carried, Carried()
        if not (carried.handed or carried.rows or carried.ahead or carried.unheard):
            return
        if self.links.closing or self.links.remote is None:
            # Nobody to ask (this node stops, or serves no operations): what the other node
            # acknowledged stays there, the rest comes back.
            self._settled(carried, carried.acked)
            return
        self.settling.append(carried)
        task = asyncio.get_running_loop().create_task(self._settle(carried))
        self.links.tasks.add(task)
        task.add_done_callback(self.links.tasks.discard)

    async def _settle(self, carried: Carried) -> None:
        """Ask the other node which of the broken connection's jobs it keeps, and what it sent
        that this node did not read; give everything back if it is found gone first: silent
        for a whole ask while no session held its lock (or its lease ran out). The lock
        alone is not enough: after PostgreSQL restarted, a live node's is free until its next
        heartbeat, and that node answers."""
        remote = self.links.remote
        assert remote is not None
        loop = asyncio.get_running_loop()
        asking: asyncio.Task[HolderAnswer | None] | None = None
        lock_free = False  # seen since the ask in flight was sent
        if len(carried.outcomes) < len(carried.ahead):
            await carried.known.wait()  # the commits of rows sent ahead end (or fail)
        outcomes = [(job_id, ok) for _, job_id, ok in carried.unheard]
        outcomes += carried.outcomes.items()
        committed = [job_id for job_id, ok in outcomes if ok]
        dropped = [job_id for job_id, ok in outcomes if not ok]
        try:
            while True:
                if asking is None:
                    lock_free = False
                    arguments: dict[str, Any] = {"read": carried.read}
                    if committed or dropped:
                        arguments.update(ok=committed, drop=dropped)
                    asking = loop.create_task(
                        remote.ask([self.node], SETTLE, carried.link_id, arguments)
                    )
                await asyncio.wait({asking}, timeout=GONE_CHECK)
                if asking.done():
                    failed = asking.exception()
                    answer = None if failed is not None else asking.result()
                    asking = None
                    if answer is not None:
                        self._answered(carried, orjson.loads(answer.body))
                        return
                    if lock_free:
                        self._settled(carried, set())
                        return
                    await asyncio.sleep(GONE_CHECK)  # the database may be away: not at once
                    continue
                lock_free = lock_free or await self._lock_free()
        finally:
            if asking is not None:
                asking.cancel()
            if carried in self.settling:
                self.settling.remove(carried)

    async def _lock_free(self) -> bool:
        """Whether no session holds the other node's lock, or its lease ran out (False when
        the database cannot tell)."""
        try:
            return await self.links.cluster.node_gone(self.node)
        except Exception as exc:
            log.debug("cluster: cannot tell whether node %d lives: %s", self.node, exc)
            return False

    async def _silent(self) -> bool:
        """Whether the other node does not answer a ping within the time of an ask."""
        remote = self.links.remote
        if remote is None:
            return True
        try:
            return await remote.ask([self.node], PING, "", {}) is None
        except HolderUnavailable:
            return True

    def _answered(self, carried: Carried, answer: dict[str, Any]) -> None:
        """The other node's answer: the frames this node missed, heard now, then its jobs."""
        for header, blob in answer["f"]:
            self._heard(header, base64.b64decode(blob), carried)
        self._settled(carried, set(answer["k"]))

    def _settled(self, carried: Carried, kept: set[str]) -> None:
        """Of a broken connection's jobs, those not `kept` come back: queued again here, rows
        to the shared queue. The kept ones stay where they run while that node lives."""
        cluster = self.links.cluster
        if carried in self.settling:
            self.settling.remove(carried)  # news of its jobs is heard at once from now on
        news, carried.news = carried.news, []
        for message in news:
            cluster.deliver(message)
        back = [job for job_id, job in carried.handed.items() if job_id not in kept]
        freed = [key for job_id, (key, _) in carried.rows.items() if job_id not in kept]
        stay = [(job_id, job) for job_id, job in carried.handed.items() if job_id in kept]
        rows = [(job_id, row[0]) for job_id, row in carried.rows.items() if job_id in kept]
        carried.handed, carried.rows, carried.background = {}, {}, set()
        carried.ahead, carried.refused, carried.outcomes = {}, set(), {}
        carried.unheard.clear()
        log.log(
            logging.WARNING if back or freed else logging.INFO,
            "cluster: link to node %d settled: %d foreground job(s) stay there while it lives,"
            " %d queued again",
            self.node,
            len(stay) + len(rows),
            len(back) + len(freed),
        )
        for job in back:
            cluster.take_back(job)
        if freed:
            cluster.free_rows(self.node, freed)
        self.detached.update(stay)
        self.detached_rows.update(rows)
        if self.links.closing:
            return  # this node stops: nobody waits for them any more
        if (self.detached or self.detached_rows) and self._watching is None:
            self._watching = asyncio.get_running_loop().create_task(self._watch())

    def hold_news(self, job_id: str, message: dict[str, Any]) -> bool:
        """News by notification of a job whose broken connection is being settled waits for
        the frames that connection missed (they came before it)."""
        for carried in self.settling:
            if job_id in carried.handed or job_id in carried.rows:
                carried.news.append(message)
                return True
        return False

    def find(self, job_id: str) -> Job | None:
        """A job of this node's clients handed over this link and not ended."""
        for carried in (self.carried, *self.settling):
            job = carried.handed.get(job_id)
            if job is not None:
                return job
        return self.detached.get(job_id)

    async def _watch(self) -> None:
        """While kept jobs of a broken link wait: give them back if the other node is found
        gone while the link is down (no session holds its lock, or its lease ran out, and it
        does not answer a ping); stop once they all ended."""
        told = False
        try:
            while not self.links.closing and self._waiting():
                if self.writer is None and await self._lock_free():
                    if await self._silent():
                        self.give_back()
                        return
                    if not told:
                        told = True
                        log.info(
                            "cluster: node %d answers though no session holds its lock: the"
                            " jobs it keeps stay there",
                            self.node,
                        )
                await asyncio.sleep(GONE_CHECK)
        finally:
            self._watching = None

    def _waiting(self) -> bool:
        """Whether a detached job still has clients waiting here (forgetting those without)."""
        waits = self.links.cluster.waits
        for job_id in [j for j in self.detached_rows if j not in waits]:
            del self.detached_rows[job_id]
        for job_id in [j for j in self.detached if j not in waits]:
            del self.detached[job_id]
        return bool(self.detached or self.detached_rows)

    def give_back(self) -> None:
        """The other node is gone: its acknowledged jobs are queued here again, its rows go
        back to the shared queue (the job may have run there: as for a worker that died)."""
        detached, self.detached = self.detached, {}
        rows, self.detached_rows = self.detached_rows, {}
        if detached or rows:
            log.warning(
                "cluster: node %d gone with %d foreground job(s) it had taken: queued again",
                self.node,
                len(detached) + len(rows),
            )
        for job in detached.values():
            self.links.cluster.take_back(job)
        if rows:
            self.links.cluster.free_rows(self.node, list(rows.values()))


class Carried:
    """What one connection of a link to another node carried: the jobs handed over it and
    the rows sent over it, until they end, come back, or its settling decides."""

    def __init__(self, link_id: str = "") -> None:
        #: The connection's name on both nodes: the dialer's challenge, in hex.
        self.link_id = link_id
        #: Jobs handed over, by id.
        self.handed: dict[str, Job] = {}
        #: Rows written as the other node's and sent, by job id: the row's key and function.
        self.rows: dict[str, tuple[int, str]] = {}
        #: Ids of the rows above that are background jobs: forgotten once the other node
        #: acknowledges them (the row is that node's; should it die, its lease frees it).
        self.background: set[str] = set()
        #: Background rows sent as their commit began, by job id: the row key, until the
        #: other node hears how the commit ended (its writes of the job wait until then).
        self.ahead: dict[str, int] = {}
        #: Of those, the ones the other node refused, and how the commits ended of the others
        #: once this connection broke: its settling tells the other node (`Outbound._settle`).
        self.refused: set[str] = set()
        self.outcomes: dict[str, bool] = {}
        self.known = asyncio.Event()  # every commit of `ahead` ended
        #: Frames sent on this connection, and the words on rows sent ahead among them that
        #: the other node has not said it read: (frame number, job id, committed).
        self.sent = 0
        self.unheard: deque[tuple[int, str, bool]] = deque()
        #: Ids of the jobs and rows above that the other node acknowledged.
        self.acked: set[str] = set()
        #: Frames read from the other node.
        self.read = 0
        #: News of these jobs by notification while settling, heard after the missed frames.
        self.news: list[dict[str, Any]] = []


class Inbound:
    """Another node's link to this one: jobs come in, what happens to them goes back.

    Every frame sent is numbered, and kept until the dialer says it read it, for the
    settling of the link should it break (`PeerLinks.settle`): frames sent once it broke
    are only kept. Once settled, the link sends nothing more."""

    def __init__(self, writer: asyncio.StreamWriter, node: int, link_id: str) -> None:
        self.writer = writer
        self.node = node
        self.link_id = link_id
        self.sent = 0
        self.unread: deque[tuple[int, dict[str, Any], bytes]] = deque()
        #: The jobs that came by this link and may still be here, with their subscribers.
        self.jobs: dict[str, PeerClient] = {}
        #: Background rows taken as their commit began, by job id: the row key, until the
        #: dialer says how the commit ended (`PeerLinks._row_ended`).
        self.ahead: dict[str, int] = {}
        #: Frames read from the dialer, and the count last reported to it.
        self.received = 0
        self.reported = 0
        self.settled = False

    def send(self, header: dict[str, Any], blob: bytes = b"") -> None:
        if self.settled:
            return
        self.sent += 1
        if header["o"] not in _UNKEPT:
            self.unread.append((self.sent, header, blob))
        if not self.writer.is_closing():
            self.writer.write(encode(header, blob))

    def read_up_to(self, count: Any) -> None:
        """The dialer read the first `count` frames: they need not be kept."""
        unread = self.unread
        while unread and unread[0][0] <= count:
            unread.popleft()

    def settle(self, read: int, engine_jobs: Any) -> dict[str, Any]:
        """The dialer lost the link having read `read` frames: nothing more is read from it
        or sent on it. The frames it missed, and the link's jobs that stay here."""
        self.settled = True
        self.writer.close()
        frames = [
            (header, base64.b64encode(blob).decode())
            for number, header, blob in self.unread
            if number > read
        ]
        kept = []
        for job_id, client in list(self.jobs.items()):
            job = engine_jobs.get(job_id)
            if job is not None and not job.state.terminal and client in (job.subscribers or ()):
                kept.append(job_id)
            else:
                del self.jobs[job_id]
        return {"f": frames, "k": kept}


class PeerClient:
    """A `Subscriber` for a job handed here by another node: what the engine tells of it goes
    back over the link it came by, under the id its client knows; once that link is broken,
    by notification, as for a foreground job claimed here (its node kept waiting for the
    jobs this node acknowledged)."""

    def __init__(self, link: Inbound, job_id: str, cluster: ClusterNode) -> None:
        self.link = link
        self.job_id = job_id
        self.functions = cluster.engine.functions
        self.cluster = cluster
        self._fallback: Any = None

    def acknowledge(self) -> None:
        """The job stays here: its node keeps waiting for it should the link break."""
        self.link.send({"o": "got", "j": self.job_id})

    def link_broken(self) -> bool:
        """The link broke and its node has not settled it: that node will take the job back
        unless this node answers that it keeps it (let go of it now, and it is not kept)."""
        return self.link.writer.is_closing() and not self.link.settled

    def settled(self) -> bool:
        """Its node was told whether the job stays here: it must, if it is here."""
        return self.link.settled

    def refuse(self, job: Job) -> None:
        """Send the job back to its node, which queues it again: no worker here is free for
        it after all (passing it on through the shared queue would leave its row there
        should the link break, and its node queue it again too)."""
        self.link.jobs.pop(self.job_id, None)
        free = free_workers(self.functions, job.function)
        self.link.send({"o": "no", "j": self.job_id, "n": free})

    def _broken(self) -> Any:
        """The notifying subscriber to use instead of the link, once the link is settled
        (before, what would go on a broken link is kept for its settling)."""
        if not self.link.settled:
            return None
        if self._fallback is None:
            self._fallback = self.cluster.client_of(self.link.node, self.job_id)
        return self._fallback

    def job_progress(self, job: Job, done: int, total: int) -> None:
        if (fallback := self._broken()) is not None:
            fallback.job_progress(job, done, total)
            return
        self.link.send({"o": "p", "j": self.job_id, "d": done, "t": total})

    def job_output(self, job: Job, kind: Output, data: bytes) -> None:
        if (fallback := self._broken()) is not None:
            fallback.job_output(job, kind, data)
            return
        self.link.send({"o": "o", "j": self.job_id, "k": int(kind)}, data)

    def job_finished(
        self, job: Job, state: JobState, result: bytes | None, error: bytes | None
    ) -> None:
        self.link.jobs.pop(self.job_id, None)
        if (fallback := self._broken()) is not None:
            fallback.job_finished(job, state, result, error)
            return
        header: dict[str, Any] = {"o": "f", "j": self.job_id, "s": int(state)}
        # The workers free for its function now: the other node hands the next job to one of
        # them at once, not after the worker has said it waits.
        header["n"] = free_workers(self.functions, job.function)
        header["r"] = result is not None
        header["x"] = None if error is None else base64.b64encode(error).decode()
        self.link.send(header, result or b"")


class PeerLinks:
    """This node's links: its listener, its dials, what it hands over and what it gets."""

    def __init__(self, cluster: ClusterNode, listen: str, tls: TLSFiles | None = None) -> None:
        self.cluster = cluster
        self.node = cluster.node
        self.listen = listen
        self.secret = b""
        #: The listeners' certificate and key, without their client CA (nodes show none).
        self.tls = None if tls is None else replace(tls, client_ca=None)
        self._context: ssl.SSLContext | None = None
        self._binding = b""  # the SHA-256 of this node's certificate, over TLS
        self.address: str | None = None
        self.outbound: dict[int, Outbound] = {}
        self.inbound: set[Inbound] = set()
        #: Other nodes' links to this one, open or broken and not settled, by their id.
        self.links_in: dict[str, Inbound] = {}
        #: Asks other nodes to settle broken links (`jobwire.store.pgremote.RemoteJobs`).
        self.remote: RemoteJobs | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.handed = 0  # jobs handed to other nodes, for tests and metrics
        self.taken = 0  # jobs other nodes handed here
        self._server: asyncio.base_events.Server | None = None
        self.closing = False  # the dials stop
        self._advertise: set[str] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self, channel: str) -> None:
        """Listen, and write this node's address into its row (with the secret made if it is
        the first node to need it)."""
        self._loop = asyncio.get_running_loop()
        fetch = self.cluster.shared_fetch
        rows = await fetch(SECRET_SQL, (secrets.token_bytes(32),))
        self.secret = bytes(rows[0][0])
        host, port = split_address(self.listen)
        if self.tls is None:
            self._server = await asyncio.start_server(self._accepted, host, port)
        else:
            self._context = self.tls.server_context()
            self._binding = certificate_binding(_first_certificate(self.tls))
            self._server = await asyncio.start_server(
                self._accepted,
                host,
                port,
                ssl=self._context,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT,
            )
        bound = self._server.sockets[0].getsockname()[1]
        advertised = host
        if host in ("0.0.0.0", "::"):
            seen = (await fetch(CLIENT_ADDRESS_SQL, ()))[0][0]
            advertised = str(seen) if seen else "127.0.0.1"
        if ":" in advertised:
            advertised = f"[{advertised}]"
        self.address = f"{TLS_PREFIX if self.tls else ''}{advertised}:{bound}"
        await fetch(ADVERTISE_SQL, (self.address, self.node, channel))
        log.info("cluster: peer link on %s", self.address)

    def reload_tls(self) -> None:
        """SIGHUP: the certificate files again (links already open keep theirs)."""
        if self.tls is not None and self._context is not None:
            binding = certificate_binding(_first_certificate(self.tls))
            self.tls.load(self._context)
            self._binding = binding

    async def refresh(self) -> None:
        """Dial the live nodes not dialled yet; drop the links of nodes gone."""
        if self._server is None:
            return
        rows = await self.cluster.shared_fetch(PEERS_SQL, (self.node,))
        live = {int(node): str(address) for node, address in rows}
        assert self._loop is not None
        for node, address in live.items():
            link = self.outbound.get(node)
            if link is not None and link.address == address:
                continue
            if link is not None and link.task is not None:
                link.task.cancel()
            link = self.outbound[node] = Outbound(self, node, address)
            link.task = self._loop.create_task(link.run())
        for node in set(self.outbound) - set(live):
            link = self.outbound.pop(node)
            if link.task is not None:
                link.task.cancel()
            link.give_back()  # its lease ran out: what it acknowledged comes back
        for link_id, inbound in list(self.links_in.items()):
            if inbound.writer.is_closing() and (inbound.settled or inbound.node not in live):
                del self.links_in[link_id]  # settled, or its node went: nobody will ask
                inbound.settled = True  # news of its jobs by notification, if any is left

    def hold_news(self, job_id: str, message: dict[str, Any]) -> bool:
        return any(link.hold_news(job_id, message) for link in self.outbound.values())

    async def pong(self, _operation: str, _key: str, _asked: dict[str, Any]) -> HolderAnswer:
        """`PING`: this node lives (its lock may look free after PostgreSQL restarted)."""
        return HolderAnswer(200, b"{}", {})

    async def settle(self, _operation: str, link_id: str, asked: dict[str, Any]) -> HolderAnswer:
        """Another node lost its link to this one (`SETTLE`): what it missed, what stays here."""
        link = self.links_in.get(link_id)
        if link is None:  # never seen, or settled and forgotten: nothing of it is here
            return HolderAnswer(200, b'{"f":[],"k":[]}', {})
        for outcome, committed in (("ok", True), ("drop", False)):
            for job_id in asked.get(outcome) or ():
                self._row_ended(link, str(job_id), committed)
        answer = link.settle(int(asked.get("read") or 0), self.cluster.engine.jobs)
        log.info(
            "cluster: node %d settled its link here: %d frame(s) it missed, %d job(s) stay",
            link.node,
            len(answer["f"]),
            len(answer["k"]),
        )
        return HolderAnswer(200, orjson.dumps(answer), {})

    async def close(self) -> None:
        # Background rows sent and not yet acknowledged: their acknowledgements first (a
        # row the other node took must not go back to the shared queue as its link closes).
        deadline = time.monotonic() + CLOSE_WAIT
        while time.monotonic() < deadline and any(
            link.writer is not None and link.carried.background for link in self.outbound.values()
        ):
            await asyncio.sleep(0.01)
        self.closing = True
        if self._server is not None:
            self._server.close()
        for link in self.inbound:
            link.writer.close()
        for task in self.tasks:
            task.cancel()
        tasks = [
            task
            for link in self.outbound.values()
            for task in (link.task, link._watching)
            if task is not None
        ]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=CLOSE_WAIT)
        self.outbound.clear()

    # ------------------------------------------------------------------ handing over

    def reserve(self, function: str) -> Outbound | None:
        """The link to the node with the most workers free for `function`, one of them now
        counted as taken; None if no node has one."""
        best: Outbound | None = None
        for link in self.outbound.values():
            free = link.free.get(function, 0) if link.writer is not None else 0
            if free > 0 and (best is None or free > best.free[function]):
                best = link
        if best is not None:
            best.free[function] -= 1
        return best

    def hand_over(self, job: Job) -> bool:
        """Send `job` to the node with the most workers free for it, if one has any; the
        caller has let it leave the engine and waits for its news."""
        link = self.reserve(job.function)
        if link is None:
            return False
        link.hand(job)
        self.handed += 1
        return True

    def send_row(
        self, node: int, job_id: str, row: tuple[Any, ...], background: bool, ahead: bool = False
    ) -> bool:
        """Tell `node` of a row written as its own (`ClusterNode.written`; `ahead`: as its
        commit begins, `ClusterNode.sending`): False if its link is down (the row goes back
        to the shared queue once committed)."""
        link = self.outbound.get(node)
        if link is None or link.writer is None:
            return False
        link.send_row(row, background, ahead)
        self.handed += 1
        return True

    def row_committed(self, node: int, job_id: str, committed: bool) -> None:
        """The commit of a row sent ahead to `node` ended: that node hears how."""
        link = self.outbound.get(node)
        if link is not None:  # else that node is gone: its rows went back with its lease
            link.row_committed(job_id, committed)

    @property
    def acknowledged(self) -> int:
        """Jobs of this node's clients that other nodes acknowledged and have not ended."""
        return sum(
            len(link.carried.acked)
            + sum(len(carried.acked) for carried in link.settling)
            + len(link.detached)
            + len(link.detached_rows)
            for link in self.outbound.values()
        )

    def can_hand_over(self, function: str) -> bool:
        return any(
            link.writer is not None and link.free.get(function, 0) > 0
            for link in self.outbound.values()
        )

    # ------------------------------------------------------------------ being handed to

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link: Inbound | None = None
        try:
            _tune(writer)
            challenge = secrets.token_bytes(CHALLENGE_BYTES)
            writer.write(GREETING + challenge)
            async with asyncio.timeout(HANDSHAKE_TIMEOUT):
                header, _ = await read_frame(reader, UNAUTHENTICATED_MAX)
            mac, node, theirs = header.get("mac"), header.get("node"), header.get("c")
            binding = self._binding
            if not (
                isinstance(mac, str)
                and isinstance(node, int)
                and isinstance(theirs, str)
                and len(theirs) == 2 * CHALLENGE_BYTES
                and hmac.compare_digest(mac, answer(self.secret, b"dialer", challenge, binding))
            ):
                peer = writer.get_extra_info("peername")
                log.warning("cluster: refused a peer link from %s: wrong answer", peer)
                return
            proof = answer(self.secret, b"listener", bytes.fromhex(theirs), binding)
            writer.write(encode({"o": "ok", "mac": proof}))
            link = Inbound(writer, node, theirs)
            self.inbound.add(link)
            self.links_in[theirs] = link
            self._tell_free(link, self.cluster.engine.functions)
            link.send({"o": "ready"})
            while True:
                header, blob = await read_frame(reader, FRAME_MAX)
                if link.settled:
                    break  # its node settled it: what comes after was never handed here
                link.read_up_to(header.get("k", 0))
                link.received += 1
                if link.received - link.reported >= READ_REPORT:
                    link.reported = link.received
                    link.send({"o": "read", "k": link.received})
                kind = header.get("o")
                if kind == "run":
                    self._run(link, header, blob)
                elif kind == "row":
                    self._take_row(link, header, blob)
                elif kind in ("ok", "drop"):
                    self._row_ended(link, str(header["j"]), kind == "ok")
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            pass
        except (ValueError, KeyError, TypeError, orjson.JSONDecodeError) as exc:
            log.warning("cluster: closed a peer link: %s", exc)
        finally:
            if link is not None:
                self.inbound.discard(link)
                if link.ahead and self._loop is not None:  # unless its settling says first
                    task = self._loop.create_task(self._resolve(link))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
            writer.close()

    def _run(self, link: Inbound, header: dict[str, Any], payload: bytes) -> None:
        job_id = str(header["j"])
        engine = self.cluster.engine
        if self.cluster.closed or engine.jobs.get(job_id) is not None:
            self._refuse(link, job_id, header)
            return
        client = PeerClient(link, job_id, self.cluster)
        try:
            engine.submit(
                str(header["f"]),
                payload,
                priority=int(header["p"]),
                background=False,
                subscriber=client,
                queue=header.get("q"),
                job_id=job_id,
                origin=int(header.get("g") or 0),
            )
        except Exception as exc:  # the queue is full here: its node queues it again
            log.debug("cluster: refused job %s from node %d: %s", job_id, link.node, exc)
            self._refuse(link, job_id, header)
            return
        link.jobs[job_id] = client
        self.taken += 1

    def _take_row(self, link: Inbound, header: dict[str, Any], payload: bytes) -> None:
        job_id = str(header["j"])
        ext = header.get("x")
        row = (
            job_id,
            str(header["f"]),
            header.get("q"),
            header.get("u"),
            payload,
            int(header["p"]),
            int(JobState.AVAILABLE),
            int(header["a"]),
            header.get("m"),
            header.get("r"),
            float(header["c"]),
            header.get("d"),
            None if ext is None else base64.b64decode(ext),
            int(header["s"]),
            int(header.get("g") or 0),
        )
        if header.get("b"):  # a background job: this node's from now on, nobody waits
            ahead = bool(header.get("w"))  # its commit has not ended: it runs, unwritten
            key = int(header["s"])
            if ahead:
                self.cluster.store.expect_row(key)
            if not self.cluster.load_from_link(row, None):
                if ahead:
                    self.cluster.store.confirm_row(key)
                self._refuse(link, job_id, header)
                return
            if ahead:
                link.ahead[job_id] = key
            link.send({"o": "got", "j": job_id})
            self.taken += 1
            return
        subscriber = PeerClient(link, job_id, self.cluster)
        if not self.cluster.load_from_link(row, subscriber):
            self._refuse(link, job_id, header)
            return
        link.jobs[job_id] = subscriber
        subscriber.acknowledge()  # a row is this node's: never refused once loaded
        self.taken += 1

    def _row_ended(self, link: Inbound, job_id: str, committed: bool) -> None:
        """The commit of a row sent ahead ended: this node writes the job from now on; a
        failed one's job is retracted (its submit heard of the failure), and the removal
        deletes its row should the commit have landed all the same."""
        key = link.ahead.pop(job_id, None)
        if key is None:
            return
        cluster = self.cluster
        cluster.store.confirm_row(key)
        if not committed:
            job = cluster.engine.jobs.get(job_id)
            if job is not None and job.row == key:
                cluster.engine.retract([job])

    async def _resolve(self, link: Inbound) -> None:
        """A link broke with rows sent ahead whose commits it did not say the end of: its
        settling will (the other node waits for them first). If that node goes first
        (its lease runs out: no commit of it can be in flight then), the rows say: one
        there committed, one missing did not."""
        while link.ahead and not self.closing:
            try:
                gone = await self.cluster.shared_fetch(LEASE_OUT_SQL, (link.node,))
                if gone[0][0] and link.ahead:
                    keys = list(link.ahead.values())
                    rows = await self.cluster.shared_fetch(OWNED_SQL, (keys, self.node))
                    there = {int(row[0]) for row in rows}
                    for job_id, key in list(link.ahead.items()):
                        self._row_ended(link, job_id, key in there)
                    return
            except Exception as exc:
                log.debug("cluster: cannot tell whether node %d is gone: %s", link.node, exc)
            await asyncio.sleep(GONE_CHECK)

    def _refuse(self, link: Inbound, job_id: str, header: dict[str, Any]) -> None:
        free = free_workers(self.cluster.engine.functions, str(header.get("f")))
        link.send({"o": "no", "j": job_id, "n": free})

    def worker_idle(self, functions: Iterable[str]) -> None:
        """Workers here may be free for `functions` (one waits for work, or a job of them
        ended): tell the dialers, at the end of the turn, how many are free for each."""
        if not self.inbound or self._loop is None:
            return
        if not self._advertise:
            self._loop.call_soon(self._send_free)
        self._advertise.update(functions)

    def _send_free(self) -> None:
        names, self._advertise = self._advertise, set()
        functions = self.cluster.engine.functions
        chosen = {name: functions[name] for name in names if name in functions}
        for link in list(self.inbound):
            self._tell_free(link, chosen)

    @staticmethod
    def _tell_free(link: Inbound, functions: Any) -> None:
        for name, fn in functions.items():
            if fn.workers:
                link.send({"o": "free", "f": name, "n": free_workers(functions, name)})


def free_workers(functions: Mapping[str, FunctionInfo], function: str) -> int:
    """Workers free for `function`: connected for it, less those running a job of it, or
    those waiting for work if more (one connection may run several jobs at once, and waits
    while it runs one: the SDK's worker), less the jobs of it queued."""
    fn = functions.get(function)
    if fn is None:
        return 0
    return max(0, max(len(fn.workers) - fn.running, len(fn.waiters)) - fn.available)


def split_address(address: str) -> tuple[str, int]:
    """An address "HOST", "HOST:PORT" or "[V6]:PORT": its host ("0.0.0.0" if
    empty) and port (0: any)."""
    if address.startswith("["):
        host, _, rest = address[1:].partition("]")
        port = rest.removeprefix(":")
    elif address.count(":") == 1:
        host, _, port = address.partition(":")
    else:
        host, port = address, ""
    return host or "0.0.0.0", int(port or 0)


def _first_certificate(tls: TLSFiles) -> bytes:
    """The DER of the first certificate in the PEM chain file: this node's own."""
    pem = tls.cert.read_text()
    end = pem.index("-----END CERTIFICATE-----") + len("-----END CERTIFICATE-----")
    return ssl.PEM_cert_to_DER_cert(pem[pem.index("-----BEGIN CERTIFICATE-----") : end])


#: A link whose other end went silent (a network that drops its packets, no reset) counts as
#: broken after this many seconds: keepalive probes while it is idle, a bound on unacknowledged
#: data while it is not (Linux). Until then, jobs on it would wait for news that cannot come.
SILENT_LINK = 30


def _tune(writer: asyncio.StreamWriter) -> None:
    """No Nagle delay; a silent other end noticed within `SILENT_LINK` seconds."""
    sock = writer.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (
        ("TCP_KEEPIDLE", SILENT_LINK // 3),
        ("TCP_KEEPINTVL", SILENT_LINK // 6),
        ("TCP_KEEPCNT", 4),
        ("TCP_USER_TIMEOUT", SILENT_LINK * 1000),
    ):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
