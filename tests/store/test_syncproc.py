"""The syncer process: answers sync requests in order, follows the shared written number,
shares its answers, polls between requests when asked to."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from jobwire.store import syncproc
from tests.interop.gearman_raw import wait_until
from tests.servers import process_state

PREFIX = "jobs.db-redo-"


@dataclass
class Syncer:
    process: subprocess.Popen[bytes]
    sock: socket.socket

    def sync(self, number: int, generation: int) -> tuple[int, int, int]:
        self.sock.send(syncproc.REQUEST.pack(number, generation))
        return answer(self.sock)

    def state(self) -> str:
        return process_state(self.process.pid)


def answer(sock: socket.socket) -> tuple[int, int, int]:
    number, code, more = syncproc.ANSWER.unpack(sock.recv(syncproc.ANSWER.size))
    return number, code, more


def shared_numbers(written: int) -> tuple[int, memoryview]:
    """A memory file holding the written number `written`, as the server makes it: its
    descriptor and a map."""
    fd = os.memfd_create("test-shared")
    os.ftruncate(fd, syncproc.SHARED_SIZE)
    shared = syncproc.map_shared(fd)
    shared[syncproc.WRITTEN] = written
    return fd, shared


StartSyncer = Callable[..., Syncer]


@pytest.fixture
def start_syncer(tmp_path: Path) -> Iterator[StartSyncer]:
    started: list[Syncer] = []

    def start(busy_poll: float, written_fd: int | None = None) -> Syncer:
        (tmp_path / f"{PREFIX}1").write_bytes(b"frames")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        command = [sys.executable, "-I", "-S", syncproc.__file__, str(theirs.fileno())]
        command += [str(tmp_path), PREFIX, repr(busy_poll)]
        passed = [theirs.fileno()]
        if written_fd is not None:
            command.append(str(written_fd))
            passed.append(written_fd)
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, pass_fds=passed)
        theirs.close()
        started.append(Syncer(process, ours))
        return started[-1]

    yield start
    for syncer in started:
        syncer.sock.close()
        syncer.process.kill()
        syncer.process.wait()


@pytest.mark.parametrize("busy_poll", [0.0, 600.0])
def test_answers_in_order_and_exits_when_the_server_closes(
    start_syncer: StartSyncer, busy_poll: float
) -> None:
    syncer = start_syncer(busy_poll)
    assert syncer.sync(1, 1) == (1, 0, 0)
    assert syncer.sync(2, 1) == (2, 0, 0)
    assert syncer.sync(3, 7) == (3, errno.ENOENT, 0)  # no file for that generation
    assert syncer.sync(4, 1) == (4, 0, 0)
    syncer.sock.close()  # while it polls, with a budget of ten minutes
    assert syncer.process.wait(timeout=30) == 0


def test_polls_for_the_next_request_instead_of_sleeping(start_syncer: StartSyncer) -> None:
    syncer = start_syncer(600.0)
    assert syncer.sync(1, 1) == (1, 0, 0)
    # Between its polls it yields the CPU, but it never blocks in recv.
    assert {syncer.state() for _ in range(200)} == {"R"}
    assert syncer.sync(2, 1) == (2, 0, 0)


def test_without_busy_polling_it_sleeps_until_asked(start_syncer: StartSyncer) -> None:
    syncer = start_syncer(0.0)
    assert syncer.sync(1, 1) == (1, 0, 0)
    wait_until(lambda: syncer.state() == "S", "the syncer asleep in recv")
    assert syncer.sync(2, 1) == (2, 0, 0)


def test_a_sync_covers_the_batches_the_shared_number_says_are_written(
    start_syncer: StartSyncer,
) -> None:
    fd, shared = shared_numbers(5)
    syncer = start_syncer(0.0, fd)
    os.close(fd)  # the process has its own descriptor, and maps the file
    assert syncer.sync(1, 1) == (5, 0, 0)  # asked for 1; batches up to 5 are written
    assert syncer.sync(7, 1) == (7, 0, 0)  # a request ahead of the number wins
    shared[syncproc.WRITTEN] = 9
    assert syncer.sync(8, 1) == (9, 0, 0)
    assert shared[syncproc.ANSWERED] == 9 << 1  # the latest answer, shared too


def run_serve(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    during_syncs: list[int],
    fail_at: int = 0,
    shared_answers: list[int] | None = None,
) -> list[tuple[int, int, int]]:
    """Ask `serve` (in a thread) for batch 1; the n-th fdatasync sets the written number
    to `during_syncs[n]` as though frames were written while it ran, and the `fail_at`-th
    fails. The answers until one without `more`. `shared_answers` gets the shared answer
    as each sync starts, and as the thread ends."""
    (tmp_path / f"{PREFIX}1").write_bytes(b"frames")
    fd, shared = shared_numbers(0)
    os.close(fd)
    synced: list[int] = []

    def fdatasync(fd: int) -> None:
        synced.append(fd)
        if shared_answers is not None:
            shared_answers.append(shared[syncproc.ANSWERED])
        if len(synced) <= len(during_syncs):
            shared[syncproc.WRITTEN] = during_syncs[len(synced) - 1]
        if len(synced) == fail_at:
            raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    serve_args = (theirs, str(tmp_path), PREFIX, 0.0, shared)
    thread = threading.Thread(target=syncproc.serve, args=serve_args)
    thread.start()
    answers: list[tuple[int, int, int]] = []
    try:
        ours.send(syncproc.REQUEST.pack(1, 1))
        while not answers or answers[-1][2]:
            answers.append(answer(ours))
    finally:
        ours.close()
        thread.join(timeout=30)
        theirs.close()
    assert not thread.is_alive()
    if shared_answers is not None:
        shared_answers.append(shared[syncproc.ANSWERED])
    return answers


def test_while_frames_are_written_the_syncs_go_on_without_a_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Batches 2-3 written during the first sync, 4-9 during the second, none during the third.
    answers = run_serve(tmp_path, monkeypatch, [3, 9, 9])
    assert answers == [(1, 0, 1), (3, 0, 1), (9, 0, 0)]


def test_a_failed_sync_ends_the_chain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    answers = run_serve(tmp_path, monkeypatch, [3, 9], fail_at=2)
    assert answers == [(1, 0, 1), (3, errno.EIO, 0)]


def test_each_successful_answer_is_shared_before_it_is_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy server reads them there first (`RedoLog.poll`): `number << 1 | more`."""
    shared: list[int] = []
    answers = run_serve(tmp_path, monkeypatch, [3, 9, 9], shared_answers=shared)
    assert answers == [(1, 0, 1), (3, 0, 1), (9, 0, 0)]
    assert shared == [0, 1 << 1 | 1, 3 << 1 | 1, 9 << 1]


def test_a_failed_sync_is_not_shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only its message tells of it: the server must not take it for a success."""
    shared: list[int] = []
    assert run_serve(tmp_path, monkeypatch, [3, 9], 2, shared) == [(1, 0, 1), (3, errno.EIO, 0)]
    assert shared == [0, 1 << 1 | 1, 1 << 1 | 1]
