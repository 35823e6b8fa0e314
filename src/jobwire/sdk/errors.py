"""What the SDK raises. Everything derives from `JobwireError`."""

from __future__ import annotations

from collections.abc import Sequence


class JobwireError(Exception):
    """Base class of every SDK error."""


class JobFailed(JobwireError):
    """The job failed (WORK_FAIL): its task failed, timed out, or was cut off at shutdown."""

    def __init__(self, handle: str, message: str = "") -> None:
        super().__init__(message or f"job {handle} failed")
        self.handle = handle


class JobException(JobFailed):
    """The job's task raised (WORK_EXCEPTION); `data` is what the worker reported.

    A subclass of `JobFailed`, so `except JobFailed` catches both.
    """

    def __init__(self, handle: str, data: bytes) -> None:
        text = data.decode("utf-8", "replace")
        super().__init__(handle, f"job {handle} raised: {text}")
        self.data = data


class Timeout(JobwireError, TimeoutError):
    """The job did not finish within the caller's `timeout`. It may still run on the server."""


class ServerUnavailable(JobwireError, ConnectionError):
    """No server accepted the request within the client's timeout and retries."""


class AuthenticationFailed(ServerUnavailable):
    """The server refused the token or the TLS handshake (`tls=`, `token=`)."""


class ServerError(JobwireError):
    """The server refused a request with an ERROR packet (e.g. QUEUE_ERROR: queue full)."""

    def __init__(self, code: str, text: str) -> None:
        super().__init__(f"{code}: {text}")
        self.code = code
        self.text = text


class NotAcknowledged(JobwireError):
    """`flush()` (or leaving the client's `with` block, or `close()`) found background
    submissions that the server did not acknowledge: it refused them (`ServerError`, e.g. a
    full queue) or no server answered within the retries (`ServerUnavailable`).

    `failures` lists each one as (receipt, error), in submission order; the first error is also
    the exception's `__cause__`. Jobs not listed were acknowledged (and so are durable on a
    durable server). A `ServerUnavailable` one may still have been created (see `AsyncClient`).
    """

    def __init__(self, failures: Sequence[tuple[object, BaseException]]) -> None:
        first = failures[0][1]
        super().__init__(f"{len(failures)} submission(s) not acknowledged; the first: {first}")
        self.failures = list(failures)


class ServiceError(JobwireError):
    """A ZeroMQ broker answered a request with an error (`jobwire.sdk.zmq`).

    `status` is the broker's code: for jobwire's error reply `404` (no worker served the
    service in time), `500` (the job failed; `text` says why) or `410` (cancelled); for
    Titanic `400` (unknown request) or `500` (error); for MMI `501` (not implemented).
    """

    def __init__(self, service: str, status: int, text: str = "") -> None:
        super().__init__(f"{service}: {status} {text}".rstrip())
        self.service = service
        self.status = status
        self.text = text
