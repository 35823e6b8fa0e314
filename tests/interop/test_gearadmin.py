r"""`gearadmin` (Debian gearman-tools 1.1.20) against jobwire and gearmand.

gearadmin ends every admin command with `\r\n` (`status\r\n`, `create function F\r\n`, ...),
does one blocking read and then keeps reading only while more data arrives within 5 ms, so a
reply must go out in one write. It prints the reply with a leading `OK ` removed, prints `OK`
for a reply that starts with `OK\r`, and prints `Error: <rest of reply>` on stderr for a reply
starting with `ERR ` (the exit status stays 0). Several options on one command line run in a
fixed order of its own (last pushed first), so every test here passes one option per run.

The state the listings are checked against is set up over raw sockets first (tests/interop/
gearman_raw.py): queued background jobs at all three priorities, one waiting foreground job,
and a worker with a client id that can do two functions.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.interop.gearman_raw import (
    DEADLINE,
    Cmd,
    GearmanSocket,
    admin,
    list_lines,
    register_worker,
    status,
    wait_until,
)
from tests.servers import ServerProcess

pytestmark = pytest.mark.interop

GEARADMIN = "/usr/bin/gearadmin"

QUEUE = "queued"  # function holding the queued jobs; no worker can do it
WORKER_ID = "admin-worker"
WORKER_FUNCTIONS = ("working", "also-working")

# Background jobs in submission order: (unique, priority, data).
BG_JOBS = [
    ("u-normal-1", "normal", "n1"),
    ("u-low", "low", "lo"),
    ("u-normal-2", "normal", "n2"),
    ("u-high", "high", "hi"),
]
FG_UNIQUE = "u-fg"  # a foreground normal-priority job, submitted after the background ones


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str


def gearadmin(server: ServerProcess, *options: str) -> Run:
    """Run gearadmin; output is decoded without newline translation (`\\r` stays visible)."""
    proc = subprocess.run(
        [GEARADMIN, "-h", "127.0.0.1", "-p", str(server.port), *options],
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=DEADLINE,
        check=False,
    )
    return Run(proc.returncode, proc.stdout.decode(), proc.stderr.decode())


def ok_listing(run: Run) -> list[str]:
    """The body lines of a successful list reply, after checking its frame."""
    assert (run.returncode, run.stderr) == (0, ""), run
    return list_lines(run.stdout)


@dataclass
class State:
    server: ServerProcess
    client: GearmanSocket  # submitted all jobs; waits for the foreground one
    worker: GearmanSocket
    watch: GearmanSocket  # the one admin connection used for polling
    handles: dict[str, str]  # unique -> job handle


@pytest.fixture
def state(any_server: ServerProcess) -> Iterator[State]:
    watch = GearmanSocket(any_server)
    client = GearmanSocket(any_server)
    handles = {u: client.submit_bg(QUEUE, data, unique=u, priority=p) for u, p, data in BG_JOBS}
    handles[FG_UNIQUE] = client.submit_fg(QUEUE, "fg", unique=FG_UNIQUE)
    worker = register_worker(any_server, list(WORKER_FUNCTIONS), WORKER_ID, watch=watch)
    yield State(any_server, client, worker, watch, handles)
    for conn in (worker, client, watch):
        conn.close()


def test_status(state: State) -> None:
    lines = ok_listing(gearadmin(state.server, "--status"))
    # FUNCTION \t TOTAL(queued + running) \t RUNNING \t AVAILABLE_WORKERS; order is unspecified.
    assert sorted(lines) == sorted(
        [f"{QUEUE}\t5\t0\t0", *(f"{f}\t0\t0\t1" for f in WORKER_FUNCTIONS)]
    )


def test_priority_status(state: State) -> None:
    lines = ok_listing(gearadmin(state.server, "--priority-status"))
    # FUNCTION \t HIGH \t NORMAL \t LOW \t WORKERS (queued jobs only); the foreground job is normal.
    assert sorted(lines) == sorted(
        [f"{QUEUE}\t1\t3\t1\t0", *(f"{f}\t0\t0\t0\t1" for f in WORKER_FUNCTIONS)]
    )


def test_workers(state: State) -> None:
    # First let the server forget any connection closed before this test (e.g. the harness's
    # readiness probe): poll until only our three connections are listed.
    wait_until(lambda: len(list_lines(admin(state.watch, "workers"))) == 3, "3 connections")
    lines = ok_listing(gearadmin(state.server, "--workers"))
    # One line per connection, workers or not: "FD IP CLIENT-ID : fn fn ..."; id defaults to "-".
    # The connections are the raw client, the raw worker, the polling one and gearadmin's own.
    for line in lines:
        assert re.fullmatch(r"\d+ 127\.0\.0\.1 \S+ :( \S+)*", line), line
    fds = [line.split(" ", 1)[0] for line in lines]
    assert len(set(fds)) == len(fds), lines
    # Normalise the fd and the order of a connection's functions (gearmand lists them newest first).
    seen = sorted(
        (line.split(" :")[0].split(" ", 1)[1], sorted(line.split(" ")[4:])) for line in lines
    )
    assert seen == sorted(
        [
            ("127.0.0.1 -", []),
            ("127.0.0.1 -", []),
            ("127.0.0.1 -", []),
            (f"127.0.0.1 {WORKER_ID}", sorted(WORKER_FUNCTIONS)),
        ]
    )


def test_server_version(any_server: ServerProcess) -> None:
    run = gearadmin(any_server, "--server-version")
    assert (run.returncode, run.stderr) == (0, "")
    # gearmand prints e.g. "1.1.20+ds"; jobwire its own version. Only the form is common.
    assert re.fullmatch(r"\d+(\.\d+)+\S*\n", run.stdout), run.stdout


def test_server_verbose(any_server: ServerProcess) -> None:
    run = gearadmin(any_server, "--server-verbose")
    assert (run.returncode, run.stderr) == (0, "")
    levels = "FATAL|ALERT|CRITICAL|ERROR|WARNING|NOTICE|INFO|DEBUG"  # gearmand_verbose_name()
    assert re.fullmatch(rf"({levels})\n", run.stdout), run.stdout


def test_getpid(any_server: ServerProcess) -> None:
    run = gearadmin(any_server, "--getpid")
    assert run == Run(0, f"{any_server.proc.pid}\n", "")


def test_show_jobs(state: State) -> None:
    lines = ok_listing(gearadmin(state.server, "--show-jobs"))
    # HANDLE \t RETRIES \t IGNORED(cancelled) \t PERSISTED: gearmand reports background jobs as
    # persisted (1) even with its builtin no-op queue, foreground jobs as 0.
    expected = [f"{state.handles[u]}\t0\t0\t1" for u, _, _ in BG_JOBS]
    expected.append(f"{state.handles[FG_UNIQUE]}\t0\t0\t0")
    assert sorted(lines) == sorted(expected)


def test_show_unique_jobs(state: State) -> None:
    lines = ok_listing(gearadmin(state.server, "--show-unique-jobs"))
    assert sorted(lines) == sorted([u for u, _, _ in BG_JOBS] + [FG_UNIQUE])


def test_cancel_background_job(state: State) -> None:
    run = gearadmin(state.server, f"--cancel-job={state.handles['u-normal-2']}")
    assert run == Run(0, "OK\n", "")  # server replied "OK\r\n"
    # A worker draining the queue never receives the cancelled job; the rest come by priority
    # (high, then normal in FIFO order with the foreground job, then low).
    with register_worker(state.server, [QUEUE]) as worker:
        grabbed: list[bytes] = []
        while (packet := worker.grab()).type is Cmd.JOB_ASSIGN_UNIQ:
            grabbed.append(packet.args[2])
    assert grabbed == [b"u-high", b"u-normal-1", FG_UNIQUE.encode(), b"u-low"]


def test_cancel_foreground_job(state: State) -> None:
    handle = state.handles[FG_UNIQUE]
    assert gearadmin(state.server, f"--cancel-job={handle}") == Run(0, "OK\n", "")
    # The waiting client is told the job failed.
    assert state.client.expect(Cmd.WORK_FAIL).args == (handle.encode(),)


def test_cancel_unknown_job(any_server: ServerProcess) -> None:
    run = gearadmin(any_server, "--cancel-job=H:nowhere:999")
    assert run == Run(0, "", "Error: UNKNOWN_JOB\r\n")  # server replied "ERR UNKNOWN_JOB\r\n"


def test_create_function(any_server: ServerProcess) -> None:
    run = gearadmin(any_server, "--create-function=made")
    assert run == Run(0, "OK\n", "")
    # gearadmin terminates the command with "\r\n", so gearmand's truncation bug (below) cuts
    # exactly the "\r\n" and the full name is created on both servers.
    assert status(any_server) == {"made": (0, 0, 0)}


def test_create_function_truncation_differs(any_server: ServerProcess) -> None:
    r"""The one deliberate difference: `create function foo` ended by a bare "\n".

    gearmand strips two bytes from the name (`arg_size - 2`, libgearman-server/text.cc), which
    is right only for "\r\n" and creates `fo` here; jobwire creates the name that was sent.
    """
    assert admin(any_server, "create function foo") == "OK\r\n"
    expected = "fo" if any_server.name == "gearmand" else "foo"
    assert status(any_server) == {expected: (0, 0, 0)}


def test_drop_function(any_server: ServerProcess) -> None:
    assert gearadmin(any_server, "--create-function=doomed").returncode == 0
    assert gearadmin(any_server, "--drop-function=doomed") == Run(0, "OK\n", "")
    assert "doomed" not in status(any_server)


def test_drop_function_with_worker(state: State) -> None:
    run = gearadmin(state.server, f"--drop-function={WORKER_FUNCTIONS[0]}")
    assert run == Run(0, "", "Error: there are still connected workers or executing clients\r\n")
    assert WORKER_FUNCTIONS[0] in status(state.server)


def test_drop_unknown_function(any_server: ServerProcess) -> None:
    run = gearadmin(any_server, "--drop-function=never-created")
    assert run == Run(0, "", "Error: function not found\r\n")


def test_several_options_in_one_run(any_server: ServerProcess) -> None:
    # gearadmin runs the options over one connection in its own fixed order (getpid, create,
    # ..., status last), sending each command after the previous reply has been read.
    run = gearadmin(any_server, "--status", "--getpid", "--create-function=multi")
    assert run == Run(0, f"{any_server.proc.pid}\nOK\nmulti\t0\t0\t0\n.\n", "")
