"""A Titanic client (RFC 9): disconnected, durable requests through a Majordomo broker.

    titanic = TitanicClient("tcp://127.0.0.1:5555")
    uuid = titanic.request("echo", b"hello")      # stored by the broker: 32 hex characters
    frames = titanic.wait(uuid, timeout=60)        # polls titanic.reply until 200
    titanic.close(uuid)                            # the broker forgets it

Status codes: `titanic.reply` answers 200 (the reply follows), 300 (pending: `reply`
returns None), 400 (unknown uuid) or 500 (an error; with jobwire, the job failed for good):
400 and 500 raise `ServiceError`, and so does a 200 whose reply is jobwire's error reply (a
task of `MdpWorker` that raised). Every call is one Majordomo request with the Lazy Pirate
retries of `MdpClient`; a `request` resent after a timeout may store the request twice.
"""

from __future__ import annotations

import time
from typing import Any

from jobwire.protocols.zmq import services
from jobwire.protocols.zmq.mdp import Version
from jobwire.sdk.errors import ServiceError, Timeout
from jobwire.sdk.zmq.client import MdpClient
from jobwire.sdk.zmq.common import (
    DEFAULT_ENDPOINT,
    as_name,
    body_of,
    raise_for_error,
    status_code,
)


def _failed(service: bytes, body: list[bytes]) -> ServiceError:
    code = status_code(body[0]) if body else 0
    text = b" ".join(body[1:]).decode("utf-8", "replace")
    return ServiceError(service.decode(), code, text)


class TitanicClient:
    """`request`, `reply`, `wait` and `close` over one `MdpClient` (made here, or given)."""

    def __init__(
        self,
        endpoint: str = DEFAULT_ENDPOINT,
        *,
        version: int | Version = Version.V1,
        timeout: float | None = 2.5,
        retries: int = 3,
        client: MdpClient | None = None,
    ) -> None:
        self._owned = client is None
        self.client = (
            client
            if client is not None
            else MdpClient(endpoint, version=version, timeout=timeout, retries=retries)
        )

    def __enter__(self) -> TitanicClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close_client()

    def close_client(self) -> None:
        if self._owned:
            self.client.close()

    def request(self, service: str | bytes, *frames: Any) -> str:
        """Store a request for `service`; its uuid (32 hex characters)."""
        body = self.client.request(services.TITANIC_REQUEST, as_name(service), *body_of(frames))
        if len(body) < 2 or status_code(body[0]) != 200 or not services.is_uuid(body[1]):
            raise _failed(services.TITANIC_REQUEST, body)
        return body[1].decode("ascii")

    def reply(self, uuid: str) -> list[bytes] | None:
        """The reply's frames, or None while the request is pending (300)."""
        body = self.client.request(services.TITANIC_REPLY, uuid)
        code = status_code(body[0]) if body else 0
        if code == 200:
            # A task of jobwire's MdpWorker that failed answered with jobwire's error reply.
            raise_for_error(services.TITANIC_REPLY, body[1:])
            return body[1:]
        if code == 300:
            return None
        raise _failed(services.TITANIC_REPLY, body)

    def wait(self, uuid: str, *, poll: float = 0.5, timeout: float | None = None) -> list[bytes]:
        """Poll `reply` every `poll` seconds until it is there; `Timeout` after `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            frames = self.reply(uuid)
            if frames is not None:
                return frames
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Timeout(f"titanic request {uuid}: no reply within {timeout}s")
                time.sleep(min(poll, left))
            else:
                time.sleep(poll)

    def close(self, uuid: str) -> None:
        """Forget the request and its reply (200 also for an unknown uuid)."""
        body = self.client.request(services.TITANIC_CLOSE, uuid)
        if not body or status_code(body[0]) != 200:
            raise _failed(services.TITANIC_CLOSE, body)
