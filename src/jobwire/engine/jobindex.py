"""Every live job by id, the engine's index for status queries, results and admin.

Most jobs carry an id the engine made, `PREFIX:N`, with N counting up from one job to the
next. Those live in a list indexed by N (a window from the oldest live number on): adding a
job appends to it, and looking one up is an index. Keyed by the id string, a new job went
into a random slot of a dict that, with a few hundred thousand jobs queued, is mostly out
of the CPU cache: that insert was a fifth of the enqueue path's CPU. Keyed by N in a dict,
each entry would need an int object (32 bytes a job).

The window starts at the oldest live number, so a job that stays while thousands after it
finish (scheduled far ahead, or a long run) would hold the window open: once the window is
mostly empty, such stragglers move to a dict and the window closes up behind them. Ids
chosen by clients (OJS) are kept by string.
"""

from __future__ import annotations

from collections.abc import Iterator

from jobwire.engine.job import Job

#: Window slots kept before the first live one, and the gap a new number may open, before
#: the window is rebuilt; below these sizes the bookkeeping would cost more than it saves.
_SLACK = 4096


class JobIndex:
    """Jobs by id. A job with `number` set is the engine's `PREFIX:number`; others (number 0)
    are kept under their id string."""

    __slots__ = ("_base", "_head", "_live", "_named", "_old", "_slack", "_window", "prefix")

    def __init__(self, prefix: str, slack: int = _SLACK) -> None:
        self.prefix = prefix
        self._slack = slack  # tests make it small to reach the rebuilds with few jobs
        self._window: list[Job | None] = []  # _window[i]: the job numbered _base + i
        self._base = 1
        self._head = 0  # every slot before it is None
        self._live = 0  # jobs in the window
        self._old: dict[int, Job] = {}  # numbered jobs outside the window (numbers < _base + _head)
        self._named: dict[str, Job] = {}

    def number(self, job_id: str) -> int:
        """N when `job_id` is exactly `PREFIX:N` as the engine writes it (N > 0), else 0."""
        prefix = self.prefix
        if not job_id.startswith(prefix):
            return 0
        tail = job_id[len(prefix) :]
        # isascii: str.isdigit accepts digits int() refuses; the round trip rejects "007".
        if not (tail.isascii() and tail.isdigit()):
            return 0
        number = int(tail)
        return number if str(number) == tail else 0

    def add(self, job: Job) -> None:
        """Index `job` under its id, replacing the job indexed there before."""
        number = job.number
        if not number:
            self._named[job.id] = job
            return
        old = self._old
        if old and number in old:  # a straggler revived (see Engine.revive)
            old[number] = job
            return
        window = self._window
        i = number - self._base
        size = len(window)
        if i < 0:
            old[number] = job
        elif i < size:
            if window[i] is None:
                self._live += 1
                self._head = min(self._head, i)
            window[i] = job
        else:
            if i - size > self._slack + size:  # a far jump (replayed ids): start the window there
                self._close_window(number)
            elif i > size:
                window.extend([None] * (i - size))
            window.append(job)
            self._live += 1

    def discard(self, job: Job) -> None:
        """Drop `job` from the index; a different job under the same id stays."""
        number = job.number
        if not number:
            named = self._named
            if named.get(job.id) is job:
                del named[job.id]
            return
        window = self._window
        i = number - self._base
        if 0 <= i < len(window) and window[i] is job:
            window[i] = None
            self._live -= 1
            if i == self._head or len(window) - self._head > 4 * self._live + self._slack:
                self._advance()
        elif self._old.get(number) is job:
            del self._old[number]

    def _advance(self) -> None:
        """Move the head past empty slots and stragglers; drop the slots behind it."""
        window = self._window
        head, size = self._head, len(window)
        while head < size:
            job = window[head]
            if job is not None:
                if size - head <= 4 * self._live + self._slack:
                    break
                # The window is mostly empty: this job holds it open for the ones after it.
                self._old[self._base + head] = job
                window[head] = None
                self._live -= 1
            head += 1
        if head >= self._slack and 2 * head >= size:
            del window[:head]
            self._base += head
            head = 0
        self._head = head

    def _close_window(self, base: int) -> None:
        """Move the window's jobs to the dict and start an empty window at `base`."""
        window, old = self._window, self._old
        for i in range(self._head, len(window)):
            job = window[i]
            if job is not None:
                old[self._base + i] = job
        window.clear()
        self._base, self._head, self._live = base, 0, 0

    def get(self, job_id: str) -> Job | None:
        number = self.number(job_id)
        if number:
            job = self.numbered(number)
            if job is not None:
                return job
        # A client may have chosen an id in the engine's own format: it is kept by string.
        return self._named.get(job_id) if self._named else None

    def numbered(self, number: int) -> Job | None:
        """The job the engine numbered `number` (its id is `PREFIX:number`), or None."""
        i = number - self._base
        if 0 <= i < len(self._window):
            job = self._window[i]
            if job is not None:
                return job
        return self._old.get(number) if self._old else None

    def __getitem__(self, job_id: str) -> Job:
        job = self.get(job_id)
        if job is None:
            raise KeyError(job_id)
        return job

    def __contains__(self, job_id: object) -> bool:
        return isinstance(job_id, str) and self.get(job_id) is not None

    def __len__(self) -> int:
        return self._live + len(self._old) + len(self._named)

    def __iter__(self) -> Iterator[str]:
        for job in self.values():
            yield job.id

    def values(self) -> Iterator[Job]:
        """The jobs: those with engine ids by number, then the others as they were added."""
        numbered = [job for job in self._window[self._head :] if job is not None]
        if self._old:
            numbered = sorted([*self._old.values(), *numbered], key=_number)
        yield from numbered
        yield from list(self._named.values())

    def items(self) -> Iterator[tuple[str, Job]]:
        for job in self.values():
            yield job.id, job

    def clear(self) -> None:
        self._window.clear()
        self._base += self._head  # numbers only grow; any base works for an empty window
        self._head = self._live = 0
        self._old.clear()
        self._named.clear()


def _number(job: Job) -> int:
    return job.number
