"""GearmanConnection holds replies until the store commits, batch by batch.

A fake store decides when (and whether) each commit succeeds, and a fake transport records
what the client would have read, so every interleaving is exact.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from jobwire.engine import Engine, EngineConfig, Job
from jobwire.protocols.gearman.packets import PacketType as T
from jobwire.protocols.gearman.packets import encode, encode_request
from jobwire.server.gearman import GearmanConnection, GearmanOptions, GearmanServer
from jobwire.server.runtime import Runtime


class FakeStore:
    durable = True

    def __init__(self) -> None:
        self.write_count = 0
        self.saved: list[str] = []
        self.removed: list[str] = []
        self.waiting: list[list[Callable[[bool], None]]] = []  # one entry per batch
        self.open_batch = False
        self.idle = False  # `commit_if_idle` ends the batch
        self.finished = 0  # batches committed at the next poll, oldest first
        self.polls = 0
        self.created: list[list[Job]] = []  # the new jobs of each batch, as `waiting`
        self.retract: Callable[[list[Job]], None] | None = None
        self.rows = 0

    def load(self) -> list[Any]:
        return []

    def job_saved(self, job: Job) -> None:
        self._write()
        self.saved.append(job.id)
        if not job.row:  # first saved: new in this batch
            self.rows += 1
            job.row = self.rows
            self.created[-1].append(job)

    def numbers_reserved(self, ceiling: int) -> None:
        pass

    def on_failure(self, retract: Callable[[list[Job]], None]) -> None:
        self.retract = retract

    def job_removed(self, job: Job) -> None:
        self._write()
        self.removed.append(job.id)

    def _write(self) -> None:
        self.write_count += 1
        if not self.open_batch:
            self.open_batch = True
            self.waiting.append([])
            self.created.append([])

    def end_turn(self) -> None:
        self.open_batch = False

    def pending(self) -> bool:
        return bool(self.waiting)

    def after_commit(self, callback: Callable[[bool], None]) -> None:
        self.waiting[-1].append(callback)

    def commit(self, ok: bool = True) -> None:
        """Report the oldest batch: as a real store, a failed one's new jobs are retracted
        before anyone waiting on it hears of it."""
        created = self.created.pop(0)
        if not ok and created and self.retract is not None:
            self.retract(created)
        for callback in self.waiting.pop(0):
            callback(ok)

    def commit_if_idle(self) -> None:
        if self.idle:
            self.end_turn()  # the next write starts a batch of its own

    def poll(self) -> None:
        self.polls += 1
        while self.finished:
            self.finished -= 1
            self.commit()

    def close(self) -> None:
        pass


class FakeTransport:
    def __init__(self) -> None:
        self.data = b""
        self.closing = False

    def write(self, data: bytes) -> None:
        self.data += data

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str) -> None:
        return None

    def take(self) -> bytes:
        data, self.data = self.data, b""
        return data


def submit_bg(payload: bytes) -> bytes:
    return encode_request(T.SUBMIT_JOB_BG, b"f", b"", payload)


def created(handle: str) -> bytes:
    return encode(T.JOB_CREATED, handle.encode())


NOT_STORED = encode(T.ERROR, b"QUEUE_ERROR", b"Job could not be stored")


async def connect(
    job_retries: int | None = None,
) -> tuple[FakeStore, Engine, GearmanConnection, FakeTransport]:
    store = FakeStore()
    engine = Engine(EngineConfig(id_prefix="H", job_retries=job_retries), journal=store)
    runtime = Runtime(engine, asyncio.get_running_loop(), store=store)
    server = GearmanServer(runtime, GearmanOptions())
    conn = server.protocol_factory()
    transport = FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return store, engine, conn, transport


def test_each_batch_is_released_by_its_own_commit() -> None:
    async def main() -> None:
        store, _engine, conn, transport = await connect()
        conn.data_received(submit_bg(b"a"))
        store.end_turn()
        conn.data_received(submit_bg(b"b") + encode_request(T.ECHO_REQ, b"x"))
        store.end_turn()
        assert transport.take() == b""
        store.commit()  # the first batch only
        assert transport.take() == created("H:1")
        store.commit()
        assert transport.take() == created("H:2") + encode(T.ECHO_RES, b"x")

    asyncio.run(main())


def test_reads_of_one_turn_are_committed_apart_when_the_store_starts_early() -> None:
    """Between two reads an idle store may commit what came before (`commit_if_idle`):
    each read's replies are held by its own batch."""

    async def main() -> None:
        store, _engine, first, first_out = await connect()
        second = first.server.protocol_factory()
        second_out = FakeTransport()
        second.connection_made(second_out)  # type: ignore[arg-type]
        store.idle = True
        first.data_received(submit_bg(b"a"))
        second.data_received(submit_bg(b"b"))
        store.commit()  # the first read's batch
        await asyncio.sleep(0)  # the end of the loop turn
        assert (first_out.take(), second_out.take()) == (created("H:1"), b"")
        store.commit()
        assert second_out.take() == created("H:2")

    asyncio.run(main())


def test_a_commit_polled_for_during_a_long_read_releases_what_it_holds_at_once() -> None:
    """Other clients' acknowledgements go out then; the reading client's own released
    replies wait for the end of its read, whose replies must not go out with them."""

    async def main() -> None:
        store, _engine, reader, reader_out = await connect()
        other = reader.server.protocol_factory()
        other_out = FakeTransport()
        other.connection_made(other_out)  # type: ignore[arg-type]
        other.data_received(submit_bg(b"other"))
        reader.data_received(submit_bg(b"first"))
        store.end_turn()
        store.finished = 1  # done while the next read, of 32 submits, is handled
        reader.data_received(b"".join(submit_bg(b"%d" % n) for n in range(32)))
        assert store.polls == 2  # every 16 packets
        assert other_out.take() == created("H:1")
        assert reader_out.take() == b""
        await asyncio.sleep(0)  # the end of the loop turn
        assert reader_out.take() == created("H:2")
        store.end_turn()
        store.commit()
        assert reader_out.take() == b"".join(created(f"H:{n}") for n in range(3, 35))

    asyncio.run(main())


def test_failed_commit_turns_acks_into_errors_and_drops_the_jobs() -> None:
    async def main() -> None:
        store, engine, conn, transport = await connect()
        conn.data_received(submit_bg(b"kept"))
        store.end_turn()
        store.commit()
        assert transport.take() == created("H:1")
        foreground = encode_request(T.SUBMIT_JOB, b"g", b"", b"fg")
        conn.data_received(submit_bg(b"lost") + foreground + submit_bg(b"lost too"))
        store.end_turn()
        conn.data_received(submit_bg(b"next"))
        store.end_turn()
        store.commit(ok=False)
        # Foreground jobs are not stored, so their JOB_CREATED stands.
        assert transport.take() == NOT_STORED + created("H:3") + NOT_STORED
        assert sorted(engine.jobs) == ["H:1", "H:3", "H:5"]
        assert store.removed == ["H:2", "H:4"]
        store.commit()
        assert transport.take() == created("H:5")

    asyncio.run(main())


def test_a_failed_commit_retracts_a_joined_submit_but_keeps_the_job_it_joined() -> None:
    async def main() -> None:
        store, engine, conn, transport = await connect()
        unique = encode_request(T.SUBMIT_JOB_BG, b"f", b"u", b"first")
        conn.data_received(unique)
        store.end_turn()
        store.commit()
        assert transport.take() == created("H:1")
        conn.data_received(submit_bg(b"new") + unique)  # a new job, and a join of H:1
        store.end_turn()
        store.commit(ok=False)
        assert transport.take() == NOT_STORED + NOT_STORED
        assert list(engine.jobs) == ["H:1"]  # the new job is dropped, the joined one stays
        assert store.removed == ["H:2"]

    asyncio.run(main())


def test_a_failed_commit_after_the_client_left_still_drops_its_jobs() -> None:
    async def main() -> None:
        store, engine, conn, transport = await connect()
        conn.data_received(submit_bg(b"stored"))
        store.end_turn()
        conn.data_received(submit_bg(b"orphan"))
        store.end_turn()
        transport.closing = True  # the peer went away; connection_lost comes later
        store.commit()
        store.commit(ok=False)
        conn.connection_lost(None)
        assert transport.take() == b""
        assert list(engine.jobs) == ["H:1"]
        assert store.removed == ["H:2"]

    asyncio.run(main())


def assign(handle: str, payload: bytes) -> bytes:
    return encode(T.JOB_ASSIGN, handle.encode(), b"f", payload)


def test_an_assignment_does_not_wait_for_its_attempt_to_be_stored() -> None:
    """Without a retry limit the attempt count is informative: workers are not held up."""

    async def main() -> None:
        store, _engine, conn, transport = await connect()
        conn.data_received(submit_bg(b"a") + submit_bg(b"b"))
        store.end_turn()
        store.commit()
        assert transport.take() == created("H:1") + created("H:2")
        conn.data_received(encode_request(T.CAN_DO, b"f") + encode_request(T.GRAB_JOB))
        store.end_turn()
        await asyncio.sleep(0)  # the end of the loop turn, when replies are written
        assert store.pending()  # the lease is on its way to the disk
        assert transport.take() == assign("H:1", b"a")
        # A result and the next grab: neither waits for the commits before them.
        conn.data_received(
            encode_request(T.WORK_COMPLETE, b"H:1", b"ok") + encode_request(T.GRAB_JOB)
        )
        await asyncio.sleep(0)
        assert transport.take() == assign("H:2", b"b")

    asyncio.run(main())


def test_with_a_retry_limit_an_assignment_waits_for_its_attempt() -> None:
    """A limit must count attempts a crash cut short, so the attempt is stored first."""

    async def main() -> None:
        store, _engine, conn, transport = await connect(job_retries=3)
        conn.data_received(submit_bg(b"a"))
        store.end_turn()
        store.commit()
        assert transport.take() == created("H:1")
        conn.data_received(encode_request(T.CAN_DO, b"f") + encode_request(T.GRAB_JOB))
        store.end_turn()
        assert transport.take() == b""
        store.commit()
        assert transport.take() == assign("H:1", b"a")

    asyncio.run(main())
