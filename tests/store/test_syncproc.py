"""The syncer process: answers sync requests in order, polls between them when asked to."""

from __future__ import annotations

import errno
import socket
import subprocess
import sys
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

    def sync(self, number: int, generation: int) -> tuple[int, int]:
        self.sock.send(syncproc.MESSAGE.pack(number, generation))
        answer: tuple[int, int] = syncproc.MESSAGE.unpack(self.sock.recv(syncproc.MESSAGE.size))
        return answer

    def state(self) -> str:
        return process_state(self.process.pid)


StartSyncer = Callable[[float], Syncer]


@pytest.fixture
def start_syncer(tmp_path: Path) -> Iterator[StartSyncer]:
    started: list[Syncer] = []

    def start(busy_poll: float) -> Syncer:
        (tmp_path / f"{PREFIX}1").write_bytes(b"frames")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        command = [sys.executable, "-I", "-S", syncproc.__file__, str(theirs.fileno())]
        command += [str(tmp_path), PREFIX, repr(busy_poll)]
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),))
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
    assert syncer.sync(1, 1) == (1, 0)
    assert syncer.sync(2, 1) == (2, 0)
    assert syncer.sync(3, 7) == (3, errno.ENOENT)  # no file for that generation
    assert syncer.sync(4, 1) == (4, 0)
    syncer.sock.close()  # while it polls, with a budget of ten minutes
    assert syncer.process.wait(timeout=30) == 0


def test_polls_for_the_next_request_instead_of_sleeping(start_syncer: StartSyncer) -> None:
    syncer = start_syncer(600.0)
    assert syncer.sync(1, 1) == (1, 0)
    # Between its polls it yields the CPU, but it never blocks in recv.
    assert {syncer.state() for _ in range(200)} == {"R"}
    assert syncer.sync(2, 1) == (2, 0)


def test_without_busy_polling_it_sleeps_until_asked(start_syncer: StartSyncer) -> None:
    syncer = start_syncer(0.0)
    assert syncer.sync(1, 1) == (1, 0)
    wait_until(lambda: syncer.state() == "S", "the syncer asleep in recv")
    assert syncer.sync(2, 1) == (2, 0)
