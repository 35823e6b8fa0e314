"""Acknowledgements held at the runtime's commit barrier: JOB_CREATED means durable.

With a durable store, a read whose replies announce something the store must keep (a
background job's JOB_CREATED, the assignment of a job with a retry limit) holds the
connection's output queued so far until the commit carrying those changes
(`Runtime.after_durable`); output after it queues behind. Commits finish in order, so holds
are released in order. A failed commit retracts the JOB_CREATED replies it held (each
becomes a QUEUE_ERROR); the engine has retracted the jobs they created by then
(`Engine.retract`), so they neither run nor show.

Every exchange about commits is here: `poll` (commits finished during a long read) and
`hold` (wait for the commit of what this read changed); the runtime offers an idle store
what came before each read (`Runtime.note_read`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jobwire.protocols.gearman.replies import NOT_STORED, created_handle, job_created
from jobwire.server.runtime import Runtime

if TYPE_CHECKING:
    from jobwire.server.gearman.transport import Transport


class Hold:
    """Output held until a store commit: everything queued before position `end` (output
    positions count every entry ever queued on the connection), and the JOB_CREATED
    replies to retract if the commit fails: those of new jobs (`created`), and of submits
    that joined a job that already existed (`joined`, None if there are none, as is most
    often the case).

    The replies themselves are kept, in the order they were queued: a failed commit finds
    them in the output by identity. A position per reply would cost an int object per
    acknowledgement; a reference costs one append."""

    __slots__ = ("created", "end", "joined")

    def __init__(self, end: int, created: list[bytes], joined: list[bytes] | None) -> None:
        self.end = end
        self.created = created
        self.joined = joined


class Acks:
    """One connection's held output: what may be written (`released`), and what to take
    back if a commit fails."""

    def __init__(self, conn: Transport, runtime: Runtime) -> None:
        self.conn = conn
        self.runtime = runtime
        #: Replies wait for commits at all (a memory store has none to wait for).
        self.durable = runtime.durable_store
        # Each batch awaiting its commit. A list, not a deque: it holds a few entries, and
        # compiled, a list's truth is native, a deque's a call.
        self.holds: list[Hold] = []
        self.released = 0  # while holding, output before this position may go out
        # JOB_CREATED replies of the current read, which its hold takes over (see `Hold`)
        self.created: list[bytes] = []
        self.joined: list[bytes] = []
        #: Replies queued so far that may only go out once the store has what they announce.
        self.count = 0
        #: While a commit's waiters are told: its new jobs that found their unique key held
        #: by a job on another node, id -> that job's id (a cluster's store; one dict, kept).
        self.coalesced: dict[str, str] | None = getattr(runtime.store, "coalesced", None)

    def job_created(self, reply: bytes, created: bool) -> None:
        """A background submit's JOB_CREATED, queued: of a new job, or one it joined."""
        if created:
            self.created.append(reply)
        else:
            self.joined.append(reply)
        self.count += 1

    def needs_commit(self) -> None:
        """A reply was queued that announces a change the store must have first."""
        self.count += 1

    def poll(self) -> None:
        """Take the commits finished meanwhile (during a long read)."""
        self.runtime.poll_commits()

    def hold(self, sent: int, end: int) -> None:
        """Hold the output queued so far, up to position `end`, until the commit of what
        was changed meanwhile; `sent` is the position of the next entry to write."""
        if not self.holds and self.released < sent:
            # A commit polled for during the read may have released more than was sent.
            self.released = sent
        joined = self.joined
        if joined:
            self.joined = []
        hold = Hold(end, self.created, joined or None)
        self.created = []
        self.holds.append(hold)
        self.runtime.after_durable(lambda ok: self._release(hold, ok))

    def _release(self, hold: Hold, ok: bool) -> None:
        """The batch `hold` holds is durable, or (not ok) its commit failed."""
        del self.holds[0]  # commits finish in order
        self.released = hold.end
        if not ok:
            self._retract(hold)
        elif self.coalesced:
            self._rename(hold, self.coalesced)
        conn = self.conn
        if not conn.reading:  # else the read's end flushes
            conn.flush()

    def _retract(self, hold: Hold) -> None:
        """The clients must not believe the jobs were accepted (the engine has retracted
        the new ones already)."""
        conn = self.conn
        out = conn.out
        created = hold.created
        joined = hold.joined or []
        # Each list's replies are in the output in the order they were queued.
        c = j = 0
        for index in range(min(hold.end - conn.sent, len(out))):  # those not yet sent
            entry = out[index]
            if c < len(created) and entry is created[c]:
                out[index] = NOT_STORED
                c += 1
            elif j < len(joined) and entry is joined[j]:
                out[index] = NOT_STORED
                j += 1

    def _rename(self, hold: Hold, coalesced: dict[str, str]) -> None:
        """The JOB_CREATED replies of jobs that found their unique key held on another node
        name the job that holds it instead: the one the submit joined."""
        conn = self.conn
        out = conn.out
        replies = [*hold.created, *(hold.joined or [])]
        for index in range(min(hold.end - conn.sent, len(out))):  # those not yet sent
            entry = out[index]
            for reply in replies:
                if entry is reply:
                    holder = coalesced.get(created_handle(reply).decode(errors="replace"))
                    if holder is not None:
                        out[index] = job_created(holder.encode())
                    break
