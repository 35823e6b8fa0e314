"""The Rota wire messages, declared once: msgspec Structs with their limits.

Every JSON frame on `/work` is one of these. `decode.py` decodes a frame against them, which
validates it in the same step; `encode.py` builds them to write a frame; and `schema()` is
the JSON Schema served at `GET /rota/v1/schema.json`, generated from these same classes, so
the decoder, the encoder, the limits and the published schema cannot drift apart.
docs/rota.md says what the messages mean.

Fields that may be omitted also accept `null` (old workers send it for "not given").
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

#: The `v` of every frame. It only changes for changes that old peers would misread.
VERSION: Final = 1
#: Additions to version 1 that old peers may ignore (docs/rota.md, "Revisions").
#: 1: the first schema; 2: `state` and `beat` from the server, `register.revision`,
#: `welcome.revision` and `welcome.beat_interval`.
REVISION: Final = 2

MAX_NAME: Final = 255  # spec, queue and host names, error codes
MAX_ID: Final = 1024  # job ids (OJS UUIDs, Gearman handles)
MAX_TEXT: Final = 64 * 1024  # messages, log lines
MAX_CHECKSUM: Final = 128
MAX_WANTS: Final = 100_000
MAX_SAFE_INT: Final = 2**53 - 1

Name = Annotated[str, Meta(min_length=1, max_length=MAX_NAME)]
Label = Annotated[str, Meta(max_length=MAX_NAME)]
JobId = Annotated[str, Meta(min_length=1, max_length=MAX_ID)]
Text = Annotated[str, Meta(max_length=MAX_TEXT)]
Checksum = Annotated[
    str,
    Meta(
        min_length=1,
        max_length=MAX_CHECKSUM,
        description="Lowercase hex SHA-256 of the spec's canonical form",
    ),
]
Count = Annotated[int, Meta(ge=0, le=MAX_SAFE_INT)]
Seconds = Annotated[float, Meta(ge=0)]
Version = Annotated[Literal[1], Meta(description="The protocol version: 1")]
State = Literal["running", "quiet", "terminate"]
AlertLevel = Literal["info", "warning", "error", "critical"]


class _Object(Struct, frozen=True, omit_defaults=True):  # subclasses repeat frozen for mypy
    """A JSON object: unknown fields are ignored, defaults are left out when written."""


# ---------------------------------------------------------------- worker -> server


class SpecRef(_Object, frozen=True):
    """A job spec the worker implements: its name and the checksum of its canonical form."""

    name: Name
    checksum: Checksum


class Register(_Object, frozen=True):
    """The first heartbeat's part: who the worker is and what it does."""

    hostname: Label | None = None
    os: Label | None = None
    pid: Count | None = None
    #: Take jobs only from these queues; omitted, null or empty: every queue.
    queues: tuple[Name, ...] | None = None
    specs: tuple[SpecRef, ...] | None = None
    #: The schema revision the worker speaks (default 1); 2 asks for the server's `beat`s.
    revision: Annotated[int, Meta(ge=1, le=MAX_SAFE_INT)] | None = None


class Progress(_Object, frozen=True):
    job: JobId
    current: Count
    total: Count


class LogBatch(_Object, frozen=True):
    job: JobId
    lines: tuple[Text, ...] | None = None


class Alert(_Object, frozen=True):
    message: Annotated[str, Meta(min_length=1, max_length=MAX_TEXT)]
    level: AlertLevel = "warning"
    job: JobId | None = None


class Status(_Object, frozen=True):
    #: Percent of one core (may exceed 100).
    cpu: Annotated[float, Meta(ge=0)] | None = None
    #: Resident bytes.
    ram: Count | None = None
    progress: tuple[Progress, ...] | None = None
    logs: tuple[LogBatch, ...] | None = None
    alerts: tuple[Alert, ...] | None = None


class Success(_Object, tag_field="outcome", tag="success", frozen=True):
    job: JobId
    #: Any JSON value; or `data_base64` for raw bytes (not both).
    data: Any = UNSET
    data_base64: bytes | UnsetType = UNSET


class ResultError(_Object, frozen=True):
    code: Name | None = None
    message: Text | None = None
    #: Run the job again (within its attempts); by default a failure is final.
    retryable: bool = False
    details: Any = None


class Failure(_Object, tag_field="outcome", tag="failure", frozen=True):
    job: JobId
    error: ResultError | None = None


class Heartbeat(_Object, frozen=True):
    """The only message a worker sends; its parts decide its role."""

    v: Version
    type: Literal["heartbeat"]
    #: Echoed in the server's `error` and `ack` about this message.
    seq: Count | None = None
    register: Register | None = None
    #: How many jobs the worker wants to hold at once, counting those it holds; omitted:
    #: unchanged (it starts at 0).
    wants: Annotated[int, Meta(ge=0, le=MAX_WANTS)] | None = None
    status: Status | None = None
    results: tuple[Success | Failure, ...] | None = None


# ---------------------------------------------------------------- server -> worker


class _Message(_Object, tag_field="type", frozen=True):
    v: Version


class SpecVerdict(_Object, frozen=True):
    name: Name
    checksum: Checksum
    accepted: bool
    #: When not accepted: `checksum_mismatch` or `not_registered` (a later server may add more).
    reason: Name | None = None


class Welcome(_Message, tag="welcome", frozen=True):
    """After the registering heartbeat."""

    worker: JobId
    #: Seconds of silence after which the server gives up on the worker.
    heartbeat_timeout: Seconds
    #: Largest message the worker may send, in bytes.
    max_message: Annotated[int, Meta(ge=1)]
    specs: tuple[SpecVerdict, ...]
    #: Revision 2: the server's schema revision.
    revision: Annotated[int, Meta(ge=1)] | None = None
    #: Revision 2, to workers that registered with revision 2 or later: the server sends a
    #: message at least this often (a `beat` when it has nothing else to say).
    beat_interval: Seconds | None = None


class JobCopy(_Object, frozen=True):
    id: JobId
    spec: Name
    queue: Name
    #: The OJS view of the input.
    args: list[Any]
    priority: int
    attempt: Count
    #: Null when unlimited.
    max_attempts: Count | None
    created_at: Annotated[str, Meta(max_length=64)] | None
    #: The engine's bytes: `payload` when they are UTF-8, else `payload_base64`.
    payload: str | UnsetType = UNSET
    payload_base64: bytes | UnsetType = UNSET
    meta: Any = None


class Assignment(_Message, tag="assignment", frozen=True):
    """A job is leased to the worker."""

    job: JobCopy
    #: Send this job's logs.
    logs: bool


class Revoke(_Message, tag="revoke", frozen=True):
    """A held job was taken back: stop it; its result will be refused."""

    job: JobId
    reason: Text


class Specs(_Message, tag="specs", frozen=True):
    """The registered specs changed, and so did this worker's verdicts."""

    specs: tuple[SpecVerdict, ...]


class Ack(_Message, tag="ack", frozen=True):
    """The results of the worker's heartbeat `seq` are durable."""

    seq: Count


class Error(_Message, tag="error", frozen=True):
    """A message or part of one was refused; `fatal`: the socket closes next."""

    code: Name
    message: Text
    fatal: bool
    job: JobId | None = None
    seq: Count | None = None


class SetState(_Message, tag="state", frozen=True):
    """Revision 2: an operator directs the worker. `quiet`: finish held jobs, take no new
    ones; `running`: take jobs again; `terminate`: finish held jobs and exit."""

    state: State


class Beat(_Message, tag="beat", frozen=True):
    """Revision 2: the server is alive (sent when it had nothing else to say for a while)."""


ServerMessage = Welcome | Assignment | Revoke | Specs | Ack | Error | SetState | Beat
SERVER_TYPES: Final = frozenset(
    ("welcome", "assignment", "revoke", "specs", "ack", "error", "state", "beat")
)


class Envelope(Struct):
    """What every frame has, read on its own to say why a frame was refused."""

    v: Any = None
    type: Any = None
    seq: Any = None


def schema() -> dict[str, Any]:
    """The JSON Schema of every `/work` frame (served at `GET /rota/v1/schema.json`)."""
    (worker, server), defs = msgspec.json.schema_components(
        [Heartbeat, ServerMessage], ref_template="#/$defs/{name}"
    )
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "/rota/v1/schema.json",
        "title": f"Rota worker protocol, version {VERSION}, revision {REVISION}",
        "description": (
            "One JSON object per WebSocket text frame on /work. Unknown fields are ignored; "
            "a worker ignores message types it does not know. See docs/rota.md."
        ),
        "x-rota-version": VERSION,
        "x-rota-revision": REVISION,
        "oneOf": [
            {"title": "worker to server", **worker},
            {"title": "server to worker", **server},
        ],
        "$defs": defs,
    }
