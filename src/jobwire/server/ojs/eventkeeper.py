"""The OJS event log kept in the store between two runs, one chunk per snapshot.

Every `SAVE_EVERY` seconds while the log changes (and at shutdown), the events recorded
since the previous snapshot are written as one key-value record of the `events`
namespace, a chunk (key: its first event's sequence number, value: a JSON array of the
events), and every chunk whose events have all left the ring is deleted. So a snapshot
costs what came since the last one: writing the whole ring each time put up to 2 MB into
a durable store's redo log every two seconds under a stream of pushes, with its checksum,
its sync and its checkpoint, however few events were new.

A slow trickle of events would leave many small chunks (one per snapshot, for as long as
the ring takes to turn over): past `MAX_CHUNKS`, the snapshot writes the whole ring as one
chunk instead, and deletes the others, which bounds the records a start reads. A start
reads every chunk, and restores the newest events, as many as the ring holds. The one
record of the format before chunks (`log`, the whole ring) is read and deleted like any
chunk.

The events are plain dicts written with orjson, and with json where orjson refuses: names
may hold the surrogates that stand for bytes that are not UTF-8 (Gearman function names),
which json keeps and orjson does not.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from typing import Any, NamedTuple

import orjson

from jobwire.engine.events import Event, EventLog
from jobwire.ports import KeyValueStore

log = logging.getLogger("jobwire.ojs")

NAMESPACE = "events"
#: Seconds between two snapshots of a changing event log.
SAVE_EVERY = 2.0
#: Chunks kept before a snapshot merges them all into one.
MAX_CHUNKS = 64


class Chunk(NamedTuple):
    first: int  # sequence numbers of its first and last events
    last: int
    key: str


class EventKeeper:
    """Loads the event log at start, and writes its snapshots as chunks."""

    def __init__(self, events: EventLog, kv: KeyValueStore) -> None:
        self.events = events
        self.kv = kv
        self.chunks: deque[Chunk] = deque()  # in the store, oldest first
        self._saved_through = 0  # the last event written in a chunk
        self._seen = 0  # `events.last_seq` at the latest snapshot; -1: save even so

    def load(self) -> None:
        """Restore the chunks' events (at start, before any other event)."""
        events, chunks = decode_chunks(self.kv.kv_load(NAMESPACE))
        self.chunks.extend(chunks)
        self.events.restore(events)
        self._saved_through = self._seen = self.events.last_seq

    def forget(self) -> None:
        """The log was cleared: the next snapshot deletes every chunk, even if no event
        came meanwhile."""
        self._seen = -1

    def save(self) -> None:
        """A snapshot, if the log changed since the last one."""
        events = self.events
        last = events.last_seq
        if not events.capacity or last == self._seen:  # keeping none: keep what is saved
            return
        self._seen = last
        first_held = last - len(events) + 1
        chunks, kv = self.chunks, self.kv
        gone = 0
        while gone < len(chunks) and chunks[gone].last < first_held:
            gone += 1
        new = events.query(after=self._saved_through, limit=len(events) + 1)
        if new and len(chunks) - gone >= MAX_CHUNKS:
            new = events.snapshot()
            gone = len(chunks)
        key = str(new[0].seq) if new else ""
        for _ in range(gone):
            old = chunks.popleft()
            if old.key != key:  # else overwritten below
                kv.kv_put(NAMESPACE, old.key, None)
        if new:
            kv.kv_put(NAMESPACE, key, encode(new))
            chunks.append(Chunk(new[0].seq, new[-1].seq, key))
        self._saved_through = last


def decode_chunks(records: dict[str, bytes]) -> tuple[list[Event], list[Chunk]]:
    """A node's chunks as its events in order, and the chunks oldest first (a record that
    cannot be read: a chunk of no events, which the next snapshot deletes)."""
    restored: dict[int, Event] = {}
    chunks = []
    for key, raw in records.items():
        try:
            events = [Event(**fields) for fields in json.loads(raw)]
        except (TypeError, ValueError) as exc:
            log.error("event log record %s cannot be restored: %s", key, exc)
            events = []
        for event in events:
            restored[event.seq] = event
        if events:
            chunks.append(Chunk(events[0].seq, events[-1].seq, key))
        else:
            chunks.append(Chunk(0, 0, key))
    return [restored[seq] for seq in sorted(restored)], sorted(chunks)


def encode(events: list[Event]) -> bytes:
    """Events as a JSON array, in one orjson call unless one of them needs json."""
    records = [_record(e) for e in events]
    try:
        return orjson.dumps(records, default=str)
    except TypeError:  # surrogates (orjson.JSONEncodeError is a TypeError)
        return b"[" + b",".join(_one(record) for record in records) + b"]"


def _record(e: Event) -> dict[str, Any]:
    # Plain dicts: orjson crashes on the compiled (mypyc) Event dataclass.
    return {
        "seq": e.seq,
        "type": e.type,
        "time": e.time,
        "subject": e.subject,
        "queue": e.queue,
        "data": e.data,
    }


def _one(record: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(record, default=str)
    except TypeError:
        return json.dumps(record, default=str).encode()
