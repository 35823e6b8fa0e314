"""What every submission runs, compiled: `AsyncClient`'s base class.

`client.py` stays interpreted (mypyc does not compile its async generator, `stream`), so the
part of the client a foreground job runs each time lives here: encoding the request, picking
the server, and `submit` itself, whose usual case (connected, no deadline) waits on its batch
here. Everything less usual (connecting, retries, deadlines) is `AsyncClient`'s, reached
through `self` as any attribute of the subclass.
"""

from __future__ import annotations

import itertools
import uuid
import zlib
from typing import Any, Final

from mypy_extensions import mypyc_attr

from jobwire.protocols.gearman import encode_request
from jobwire.sdk.errors import ServerUnavailable
from jobwire.sdk.payload import to_bytes
from jobwire.sdk.session import (
    _SUBMIT,
    MAX_UNIQUE,
    DataCallback,
    Listener,
    Priority,
    Request,
    Session,
    StatusCallback,
    submit_type,
)

_SUBMIT_JOB: Final = 7  # PacketType.SUBMIT_JOB, a native constant (compiled)
assert _SUBMIT["normal", False] == _SUBMIT_JOB


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled; `AsyncClient` subclasses it
class ClientCore:
    """The servers, their sessions and the submission path of an `AsyncClient`."""

    def __init__(self, servers: list[str], timeout: float, settle_delay: float | None) -> None:
        self.servers = servers
        self.timeout = timeout
        # Binary Star: the pair, and the one of the two the client talks to now.
        self.settle_delay = settle_delay
        self._current = 0
        self._sessions: dict[int, Session] = {}
        self._round_robin = itertools.count()
        # The default unique key: random per client, numbered per submission (as unique as
        # a UUID per submission, without the syscall).
        self._key_prefix = uuid.uuid4().hex.encode() + b"-"
        self._submissions = 0

    async def submit(
        self,
        function: str,
        payload: Any = b"",
        *,
        unique: str | None = None,
        priority: Priority = "normal",
        timeout: float | None = None,
        on_data: DataCallback | None = None,
        on_warning: DataCallback | None = None,
        on_status: StatusCallback | None = None,
    ) -> bytes:
        """Run a job and return its result.

        Raises JobFailed (WORK_FAIL), JobException (the task raised; `.data` holds what the
        worker reported), Timeout (no result within `timeout` seconds; the job is not cancelled),
        ServerUnavailable (retries exhausted) or ServerError (the server refused the job).
        `on_data`, `on_warning` and `on_status(numerator, denominator)` are called with the
        job's updates as they arrive; after a retry, updates may repeat.
        """
        listener = Listener(on_data, on_warning, on_status)
        # Module functions, not the methods: compiled, a call of a method that a subclass
        # may override goes through Python's attribute look-up.
        requests = [_new_request(self, function, payload, unique, priority, False, listener)]
        start = _first_server(self, unique)
        client: Any = self  # the rest of the client: the subclass's methods
        if timeout is None:
            # The usual case (connected, no deadline), without `_execute`: one coroutine
            # per call instead of three, each of which every resumption passes through.
            session = self._sessions.get(start % len(self.servers))
            if session is not None and session.conn.is_open:
                batch = session.start(requests, self.timeout)
                try:
                    await batch.done
                finally:
                    if batch.left:  # cancelled: stop listening
                        session.abandon(batch, requests)
                outcome = batch.outcomes[0]
                if isinstance(outcome, ServerUnavailable):
                    outcome = (await client._attempts(requests, start, batch.outcomes))[0]
            else:
                outcome = (await client._execute(requests, start))[0]
        else:
            work = client._execute(requests, start)
            outcome = (await client._with_deadline(work, timeout))[0]
        if isinstance(outcome, bytes):
            return outcome
        if isinstance(outcome, BaseException):
            raise outcome
        raise TypeError(f"a job's outcome is {outcome!r}, not bytes")

    def _request(
        self,
        function: str,
        payload: Any,
        unique: str | None,
        priority: Priority,
        background: bool,
        listener: Listener | None,
    ) -> Request:
        return _new_request(self, function, payload, unique, priority, background, listener)

    def _start(self, unique: str | None) -> int:
        return _first_server(self, unique)


def _new_request(
    core: ClientCore,
    function: str,
    payload: Any,
    unique: str | None,
    priority: Priority,
    background: bool,
    listener: Listener | None,
) -> Request:
    """One submission, encoded."""
    if priority == "normal" and not background:  # the usual one, without the table
        ptype = _SUBMIT_JOB
    else:
        found = _SUBMIT.get((priority, background))
        ptype = found if found is not None else submit_type(priority, background)  # raises
    if unique is None:
        core._submissions += 1
        raw_unique = core._key_prefix + str(core._submissions).encode()
    else:
        raw_unique = unique.encode()
        if len(raw_unique) > MAX_UNIQUE:
            raise ValueError(f"unique keys are at most {MAX_UNIQUE} bytes")
    raw_function = function.encode()
    # `0 in`, a byte value: with a bytes needle, `in` first tries it as an int, and the
    # TypeError it raises and swallows costs more than the search.
    if not raw_function or 0 in raw_function or 0 in raw_unique:
        raise ValueError("function names must be non-empty; neither may contain NUL")
    data = payload if isinstance(payload, bytes) else to_bytes(payload)
    return Request(encode_request(ptype, raw_function, raw_unique, data), listener)


def _first_server(core: ClientCore, unique: str | None) -> int:
    """The first server to try: by unique key, so equal keys meet; else round robin.
    In a Binary Star pair, the server that answered last."""
    if core.settle_delay is not None:
        return core._current
    if unique:
        return zlib.crc32(unique.encode()) % len(core.servers)
    return next(core._round_robin) % len(core.servers)
