"""The redo log's files: frames read back, zero-filled files made ahead and used."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from jobwire.store import redolog, syncproc
from jobwire.store.redolog import RedoLog, frame, read_frames
from tests.interop.gearman_raw import wait_until


def test_the_zeros_after_the_last_frame_end_the_log_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "jobs.db-redo-1"
    path.write_bytes(frame(b"one") + frame(b"two") + bytes(4096))
    with caplog.at_level(logging.WARNING):
        assert list(read_frames(path)) == [b"one", b"two"]
    assert caplog.records == []


def test_bytes_after_the_last_frame_that_are_not_zeros_are_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "jobs.db-redo-1"
    path.write_bytes(frame(b"one") + frame(b"two")[:9] + bytes(100))
    with caplog.at_level(logging.WARNING):
        assert list(read_frames(path)) == [b"one"]
    assert "bytes after the last whole frame ignored" in caplog.text


def write_frames(redo: RedoLog, bodies: list[bytes]) -> list[tuple[int, str | None]]:
    """Append each body as a batch of its own, the file switched whenever the log asks;
    what the log reported."""
    reports: list[tuple[int, str | None]] = []

    async def main() -> None:
        redo.start(1, lambda number, error: reports.append((number, error)))
        for number, body in enumerate(bodies, start=1):
            if redo._spare is not None:
                await asyncio.to_thread(redo._spare.join)  # the spare is ready
            if redo.wants_new_file:
                redo.rotate(redo._generation + 1)
            redo.append(number, body)
        while not reports or reports[-1][0] < len(bodies):
            await asyncio.sleep(0.001)

    asyncio.run(main())
    redo.stop()
    return reports


def test_each_file_starts_zero_filled_and_the_next_one_when_its_zeros_run_out(
    tmp_path: Path,
) -> None:
    redo = RedoLog(tmp_path / "jobs.db", preallocate=10_000)
    redo.prepare()
    bodies = [bytes([number]) * 3000 for number in range(1, 8)]
    reports = write_frames(redo, bodies)
    assert reports[-1] == (7, None)
    assert redo.generations() == [1, 2, 3]  # three frames fit in 10,000 bytes
    for generation in redo.generations():
        assert redo.path(generation).stat().st_size == 10_000  # written over, not grown
    read = [body for g in redo.generations() for body in read_frames(redo.path(g))]
    assert read == bodies
    assert not (tmp_path / "jobs.db.redo-spare").exists()  # stop() removed the next spare


def test_without_a_spare_ready_the_log_appends_to_a_plain_file(tmp_path: Path) -> None:
    redo = RedoLog(tmp_path / "jobs.db", preallocate=10_000)  # prepare() never called
    bodies = [b"a" * 3000, b"b" * 3000, b"c" * 3000, b"d" * 3000]
    assert write_frames(redo, bodies)[-1] == (4, None)
    assert redo.generations() == [1]
    assert redo.path(1).stat().st_size == sum(len(frame(body)) for body in bodies)
    assert list(read_frames(redo.path(1))) == bodies


def test_a_spare_left_by_a_crash_is_filled_again(tmp_path: Path) -> None:
    (tmp_path / "jobs.db.redo-spare").write_bytes(frame(b"left over") * 10)
    redo = RedoLog(tmp_path / "jobs.db", preallocate=10_000)
    redo.prepare()
    assert write_frames(redo, [b"new"])[-1] == (1, None)
    assert list(read_frames(redo.path(1))) == [b"new"]


class FakeSyncer:
    """Records what the log asks and publishes."""

    def __init__(self) -> None:
        self.asked: list[tuple[int, int]] = []
        self.published: list[int] = []
        self.polled = 0

    def ask(self, number: int, generation: int) -> None:
        self.asked.append((number, generation))

    def publish(self, number: int) -> None:
        self.published.append(number)

    def poll(self) -> None:
        self.polled += 1

    def stop(self) -> None:
        pass


def with_fake_syncer(tmp_path: Path) -> tuple[RedoLog, FakeSyncer, list[int]]:
    redo = RedoLog(tmp_path / "jobs.db")
    syncer = FakeSyncer()
    redo._syncer = syncer
    return redo, syncer, []


def test_the_next_sync_is_asked_before_the_last_one_is_reported(tmp_path: Path) -> None:
    """Reporting a sync sends its acknowledgements; the syncer must not idle meanwhile."""
    redo, syncer, _ = with_fake_syncer(tmp_path)
    seen: list[tuple[int, list[int]]] = []  # each report, with the syncs asked by then

    def asked() -> list[int]:
        return [number for number, _ in syncer.asked]

    async def main() -> None:
        redo.start(1, lambda number, error: seen.append((number, asked())))
        redo.append(1, b"one")  # asked at once
        redo.append(2, b"two")  # waits for the sync of 1 to end
        redo.append(3, b"three")
        assert asked() == [1]
        redo.synced(1, None)
        redo.synced(3, None)

    asyncio.run(main())
    redo.stop()
    assert seen == [(1, [1, 3]), (3, [1, 3])]


def test_batches_written_during_a_sync_are_published_not_asked(tmp_path: Path) -> None:
    redo, syncer, reports = with_fake_syncer(tmp_path)

    async def main() -> None:
        redo.start(1, lambda number, error: reports.append(number))
        redo.append(1, b"one")
        redo.append(2, b"two")
        redo.append(3, b"three")
        assert (syncer.asked, syncer.published) == ([(1, 1)], [2, 3])
        redo.synced(2, None, more=True)  # the syncer went on to 3 by itself
        assert (syncer.asked, reports) == ([(1, 1)], [2])
        redo.synced(3, None)
        redo.append(4, b"four")  # nothing outstanding: asked again

    asyncio.run(main())
    redo.stop()
    assert reports == [2, 3]
    assert (syncer.asked, syncer.published) == ([(1, 1), (4, 1)], [2, 3])


def test_a_new_file_is_asked_for_not_published(tmp_path: Path) -> None:
    redo, syncer, reports = with_fake_syncer(tmp_path)

    async def main() -> None:
        redo.start(1, lambda number, error: reports.append(number))
        redo.append(1, b"one")
        redo.rotate(2)
        redo.append(2, b"two")  # the sync of 1 runs on the file of generation 1
        redo.synced(1, None)

    asyncio.run(main())
    redo.stop()
    assert (syncer.asked, syncer.published, reports) == ([(1, 1), (2, 2)], [], [1])


def test_after_a_failed_write_nothing_more_is_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    redo, syncer, reports = with_fake_syncer(tmp_path)
    pwrite = os.pwrite

    def disk_full(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    async def main() -> None:
        redo.start(1, lambda number, error: reports.append(number))
        redo.append(1, b"one")
        monkeypatch.setattr(redolog.os, "pwrite", disk_full)
        redo.append(2, b"two")
        monkeypatch.setattr(redolog.os, "pwrite", pwrite)
        redo.append(3, b"three")  # covered by no sync of 1's: asked once 2 is reported
        redo.synced(1, None)
        await asyncio.sleep(0)

    asyncio.run(main())
    redo.stop()
    assert syncer.published == []
    assert syncer.asked == [(1, 1), (3, 1)]
    assert reports == [1, 2]


def test_a_syncer_lost_while_following_is_asked_again_for_what_it_left(tmp_path: Path) -> None:
    redo, syncer, reports = with_fake_syncer(tmp_path)
    replacement = FakeSyncer()
    redo.start_syncer = lambda owner, loop: replacement

    async def main() -> None:
        redo.start(1, lambda number, error: reports.append(number))
        redo.append(1, b"one")
        redo.append(2, b"two")
        redo.append(3, b"three")
        redo.synced(2, None, more=True)
        redo.lost_syncer(answered=True)  # died in the sync of 3

    asyncio.run(main())
    redo.stop()
    assert (syncer.published, reports, replacement.asked) == ([2, 3], [2], [(3, 1)])


def test_only_a_sync_in_progress_is_polled_for(tmp_path: Path) -> None:
    redo, syncer, reports = with_fake_syncer(tmp_path)

    async def main() -> None:
        redo.start(1, lambda number, error: reports.append(number))
        redo.poll()  # nothing asked
        redo.append(1, b"one")
        redo.poll()
        redo.synced(1, None)
        redo.poll()

    asyncio.run(main())
    redo.stop()
    assert (syncer.polled, reports) == (1, [1])


def shared_answer(redo: RedoLog) -> int:
    """The batch number of the syncer's latest successful answer, read as `poll` does."""
    syncer = redo._syncer
    assert isinstance(syncer, redolog._Syncer) and syncer._shared is not None
    return syncer._shared[syncproc.ANSWERED] >> 1


def test_a_busy_loop_takes_the_answer_ahead_of_its_message(tmp_path: Path) -> None:
    """The loop, working through a read, sees the sync done before it reads the socket;
    the message read later is not reported again."""
    redo = RedoLog(tmp_path / "jobs.db")
    reports: list[tuple[int, str | None]] = []

    async def main() -> None:
        redo.start(1, lambda number, error: reports.append((number, error)))
        redo.append(1, b"one")
        # The loop does not run here, as while a callback works through a read.
        wait_until(lambda: shared_answer(redo) == 1, "the sync of batch 1 done")
        assert reports == []
        redo.poll()
        assert reports == [(1, None)]
        redo.append(2, b"two")  # asked at once: the syncer has said it is idle
        while len(reports) < 2:  # the loop reads both messages
            await asyncio.sleep(0.001)

    asyncio.run(main())
    redo.stop()
    assert reports == [(1, None), (2, None)]
    assert redo.syncs == 2


def test_ready_ahead_the_file_is_open_and_its_syncer_syncs_the_first_batch(
    tmp_path: Path,
) -> None:
    redo = RedoLog(tmp_path / "jobs.db", preallocate=10_000)
    redo.prepare()
    reports: list[tuple[int, str | None]] = []

    async def main() -> None:
        redo.start(1, lambda number, error: reports.append((number, error)))
        redo.get_ready()
        started = redo._syncer
        assert started is not None and started.process.poll() is None  # before any batch
        assert redo.path(1).stat().st_size == 10_000  # the zero-filled spare, renamed
        while not started.answered:  # its directory sync, asked for batch 0, is ignored
            await asyncio.sleep(0.001)
        assert reports == []
        redo.append(1, b"one")
        while not reports:
            await asyncio.sleep(0.001)
        assert redo._syncer is started  # the first sync started no other process

    asyncio.run(main())
    redo.stop()
    assert reports == [(1, None)]
    assert list(read_frames(redo.path(1))) == [b"one"]


def test_ready_ahead_with_fsync_off_opens_the_file_and_starts_no_syncer(tmp_path: Path) -> None:
    redo = RedoLog(tmp_path / "jobs.db", sync=False)

    async def main() -> None:
        redo.start(1, lambda number, error: None)
        redo.get_ready()

    asyncio.run(main())
    assert redo._syncer is None
    assert redo.generations() == [1]
    redo.stop()


def ready_without_a_syncer_then_one_batch(
    redo: RedoLog, caplog: pytest.LogCaptureFixture, between: Callable[[], None]
) -> tuple[int, str | None]:
    """`get_ready` (its errors logged) leaves no syncer; `between` runs, then batch 1 is
    written: its report."""
    reports: list[tuple[int, str | None]] = []

    async def main() -> None:
        redo.start(1, lambda number, error: reports.append((number, error)))
        with caplog.at_level(logging.ERROR):
            redo.get_ready()
        assert redo._syncer is None
        between()
        redo.append(1, b"one")
        while not reports:
            await asyncio.sleep(0.001)

    asyncio.run(main())
    redo.stop()
    return reports[0]


def test_a_syncer_that_cannot_start_ahead_is_started_at_the_first_sync(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    refusing = True

    def start(owner: RedoLog, loop: asyncio.AbstractEventLoop) -> redolog.SyncerLink:
        if refusing:
            raise OSError("no more processes")
        return redolog._Syncer(owner, loop)

    def allow() -> None:
        nonlocal refusing
        refusing = False

    report = ready_without_a_syncer_then_one_batch(
        RedoLog(tmp_path / "jobs.db", start_syncer=start), caplog, allow
    )
    assert "cannot start the redo log syncer: no more processes" in caplog.text
    assert report == (1, None)


def test_a_file_that_cannot_be_opened_ahead_fails_the_first_batch_that_needs_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    redo = RedoLog(tmp_path / "missing" / "jobs.db")
    number, error = ready_without_a_syncer_then_one_batch(redo, caplog, lambda: None)
    assert "cannot open the redo log" in caplog.text
    assert number == 1 and "FileNotFoundError" in str(error)
