"""The sqlite store against real crashes: kill -9, restart on the same file, count the jobs.

Every wait polls or blocks on a socket up to a generous deadline; no outcome depends on how
fast the server is. Where a crash must happen "in the middle", the client kills the server
once it has seen some acknowledgements; how many more were in flight varies from run to run,
and the assertions hold for any number.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.interop.gearman_raw import (
    DEADLINE,
    Cmd,
    GearmanSocket,
    admin,
    list_lines,
    pack,
    status,
)
from tests.ojs.dsl import Runner
from tests.pg import new_schema
from tests.servers import ServerProcess, free_port, process_state, start_jobwire

pytestmark = pytest.mark.interop

FUNCTION = "durable"


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "data" / "jobs.db"


@pytest.fixture
def servers() -> Iterator[list[ServerProcess]]:
    """Servers a test starts; whatever is still running at the end is killed."""
    started: list[ServerProcess] = []
    yield started
    for server in started:
        server.kill()


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, db: Path) -> Iterator[str]:
    """`--store` of a durable store: a SQLite file, or a PostgreSQL schema of the test's."""
    if request.param == "sqlite":
        yield f"sqlite:{db}"
    else:
        with new_schema() as schema:
            yield schema.dsn


def start(
    servers: list[ServerProcess], store: Path | str, *args: str, http: bool = False
) -> ServerProcess:
    spec = f"sqlite:{store}" if isinstance(store, Path) else store
    server = start_jobwire(args, store=spec, http=http)
    servers.append(server)
    return server


def redo_generations(db: Path) -> list[int]:
    """The generations of the redo log files beside `db`."""
    return [int(path.name.rpartition("-")[2]) for path in db.parent.glob(f"{db.name}-redo-*")]


def drain(server: ServerProcess, batch: int = 200) -> list[tuple[str, bytes]]:
    """Grab (pipelined) and complete every available job: [(handle, payload)] in order."""
    jobs: list[tuple[str, bytes]] = []
    with GearmanSocket(server) as worker:
        worker.send(Cmd.CAN_DO, FUNCTION)
        while True:
            worker.sock.sendall(pack(Cmd.GRAB_JOB_UNIQ) * batch)
            done = b""
            empty = False
            for _ in range(batch):
                packet = worker.recv()
                assert packet.type in (Cmd.JOB_ASSIGN_UNIQ, Cmd.NO_JOB), packet
                if packet.type == Cmd.NO_JOB:
                    empty = True
                    continue
                handle, _function, _unique, payload = packet.args
                jobs.append((handle.decode(), payload))
                done += pack(Cmd.WORK_COMPLETE, handle, b"")
            worker.sock.sendall(done)
            if empty:
                return jobs


def payload(number: int) -> bytes:
    return f"job-{number}".encode()


def show_jobs(server: ServerProcess) -> dict[str, int]:
    """`show jobs` as {handle: retries}."""
    rows = (line.split("\t") for line in list_lines(admin(server, "show jobs")))
    return {handle: int(retries) for handle, retries, _ignore, _persisted in rows}


@pytest.mark.parametrize(
    "setup",
    ["sqlite-redo-log", "sqlite-checkpoints", "postgresql"],  # the second checkpoints often
)
def test_kill_9_during_pipelined_submits_loses_no_acknowledged_job(
    db: Path, servers: list[ServerProcess], setup: str
) -> None:
    if setup == "postgresql":
        with new_schema() as schema:
            kill_9_during_pipelined_submits(schema.dsn, db, servers, ())
    else:
        options = ("--checkpoint-every", "1000") if setup == "sqlite-checkpoints" else ()
        kill_9_during_pipelined_submits(db, db, servers, options)


def kill_9_during_pipelined_submits(
    store: Path | str, db: Path, servers: list[ServerProcess], options: tuple[str, ...]
) -> None:
    # Up to `window` submissions are in flight; the kill comes once `kill_after` acks have
    # arrived (and, with checkpoints asked for, two have completed), so it lands mid-stream.
    # The client submits until the kill, whatever that takes: a checkpoint runs in a process
    # of its own, and how many jobs go by before two finish depends on the machine.
    limit, kill_after, window, chunk = 500_000, 2000, 1000, 100
    server = start(servers, store, *options)
    acked: list[str] = []
    acked_at_kill = -1
    progress = threading.Condition()
    client = GearmanSocket(server)

    def may_send(sent: int) -> bool:
        return len(acked) + window >= sent or killed.is_set()

    def submit_pipelined() -> None:
        sent = 0
        try:
            for first in range(0, limit, chunk):
                with progress:
                    progress.wait_for(lambda: may_send(sent))  # noqa: B023 - called right here
                if killed.is_set():
                    return
                batch = [payload(i) for i in range(first, first + chunk)]
                packets = [pack(Cmd.SUBMIT_JOB_BG, FUNCTION, "", p) for p in batch]
                client.sock.sendall(b"".join(packets))
                sent += len(batch)
        except OSError:
            pass  # the server died under us

    def checkpointed() -> bool:
        """With checkpoints asked for: the log files show that two have completed."""
        return not options or min(redo_generations(db), default=0) > 2

    killed = threading.Event()
    sender = threading.Thread(target=submit_pipelined)
    sender.start()
    try:
        while True:
            packet = client.recv()
            assert packet.type == Cmd.JOB_CREATED, packet
            with progress:
                acked.append(packet.args[0].decode())
                progress.notify()
            if len(acked) >= kill_after and not killed.is_set() and checkpointed():
                server.kill()  # SIGKILL while submissions are in flight
                killed.set()
                acked_at_kill = len(acked)
    except OSError:  # ConnectionError included: the server is gone
        pass
    finally:
        killed.set()
        with progress:
            progress.notify()
        sender.join()
        client.close()
    assert acked_at_kill >= kill_after, "the server was not killed mid-stream"
    assert acked_at_kill <= len(acked) <= acked_at_kill + window + chunk

    server = start(servers, store)
    new_handle = GearmanSocket(server).submit_bg(FUNCTION, "after restart")
    received = drain(server)
    handles = [handle for handle, _ in received]
    assert new_handle not in acked, "a new job reused the handle of a replayed one"
    assert received[-1] == (new_handle, b"after restart")
    replayed = received[:-1]
    # Every acknowledged job comes back, with its own payload (replies are in submit order).
    replayed_payloads = dict(replayed)
    for number, handle in enumerate(acked):
        assert replayed_payloads.get(handle) == payload(number), handle
    # Batches commit in order, so what survived is a prefix of the submissions, in order.
    assert [body for _, body in replayed] == [payload(i) for i in range(len(replayed))]
    assert len(set(handles)) == len(handles)
    # Jobs stored but not acknowledged: committed, but the JOB_CREATED was still in the
    # server's or the kernel's buffers when the process died. The client never heard of
    # them, so it would submit them again: at-least-once, never lost. Their number varies.
    unacknowledged = len(replayed) - len(acked)
    assert unacknowledged >= 0
    print(f"acknowledged {len(acked)}, replayed {len(replayed)}, unacknowledged {unacknowledged}")
    assert status(server).get(FUNCTION, (0, 0, 0))[:2] == (0, 0)


def test_job_active_at_the_crash_comes_back_with_its_attempt_counted(
    store: str, servers: list[ServerProcess]
) -> None:
    # With a retry limit, JOB_ASSIGN is only sent once the lease (attempt 1) is on disk.
    server = start(servers, store, "--job-retries", "5")
    with GearmanSocket(server) as client:
        active = client.submit_bg(FUNCTION, "was running")
        queued = client.submit_bg(FUNCTION, "was queued")
    worker = GearmanSocket(server)
    worker.send(Cmd.CAN_DO, FUNCTION)
    assign = worker.grab()
    assert assign.args[0].decode() == active
    server.kill()
    worker.close()

    server = start(servers, store)
    assert show_jobs(server) == {active: 1, queued: 0}
    assert status(server)[FUNCTION][:2] == (2, 0)
    assert drain(server) == [(active, b"was running"), (queued, b"was queued")]
    assert show_jobs(server) == {}


def handle_number(handle: str) -> int:
    """N of a `PREFIX:N` job handle."""
    return int(handle.rpartition(":")[2])


def wait_until_idle(server: ServerProcess) -> None:
    """Poll `status` until the server holds no job of FUNCTION (the completions sent are
    handled)."""
    end = time.monotonic() + DEADLINE
    while status(server).get(FUNCTION, (0, 0, 0))[:2] != (0, 0):
        assert time.monotonic() < end, f"jobs still queued after {DEADLINE}s: {status(server)}"
        time.sleep(0.02)


@pytest.mark.parametrize("ending", ["SIGTERM", "SIGKILL"])
def test_job_handles_are_never_reused_after_a_restart_with_nothing_to_replay(
    store: str, servers: list[ServerProcess], ending: str
) -> None:
    """Promise: a job handle names one job for the life of the store, so a handle a client
    kept from before a restart never names a new job, even when every job had finished."""
    server = start(servers, store, http=True)
    with GearmanSocket(server) as client:
        before = [client.submit_bg(FUNCTION, payload(i)) for i in range(5)]
    assert drain(server) == [(handle, payload(i)) for i, handle in enumerate(before)]
    wait_until_idle(server)
    # Batches commit in order: once this push is answered 201 the completions handled before
    # it are durable too, so the restart below finds no Gearman job to continue the
    # numbering from. (Its id is a UUID, not a PREFIX:N handle.)
    barrier = Runner(f"http://127.0.0.1:{server.http_port}").request(
        "POST", "/ojs/v1/jobs", {"type": "barrier", "args": []}
    )
    assert barrier.status == 201, barrier.raw
    if ending == "SIGTERM":
        assert server.stop() == 0, server.log()
    else:
        server.kill()

    server = start(servers, store)
    assert set(show_jobs(server)).isdisjoint(before)  # nothing of before was replayed
    with GearmanSocket(server) as client:
        after = [client.submit_bg(FUNCTION, payload(i)) for i in range(5)]
    assert min(map(handle_number, after)) > max(map(handle_number, before)), (before, after)


def test_replay_keeps_order_priorities_and_scheduled_jobs(
    store: str, servers: list[ServerProcess]
) -> None:
    server = start(servers, store)
    later = str(int(time.time()) + 3600)
    with GearmanSocket(server) as client:
        for payload, priority in [
            ("low 1", "low"),
            ("normal 1", "normal"),
            ("high 1", "high"),
            ("normal 2", "normal"),
            ("low 2", "low"),
        ]:
            client.submit_bg(FUNCTION, payload, priority=priority)
        client.send(Cmd.SUBMIT_JOB_EPOCH, FUNCTION, "", later, "in an hour")
        scheduled = client.expect(Cmd.JOB_CREATED).args[0].decode()
        unique = client.submit_bg(FUNCTION, "coalesced", unique="u-1")
    assert server.stop() == 0, server.log()  # a clean stop, this time

    server = start(servers, store)
    with GearmanSocket(server) as client:
        # The unique key was replayed too: the same submit joins the stored job.
        assert client.submit_bg(FUNCTION, "coalesced", unique="u-1") == unique
        client.send(Cmd.GET_STATUS, scheduled)
        assert client.expect(Cmd.STATUS_RES).args[1:3] == (b"1", b"0")
    payloads = [body for _, body in drain(server)]
    assert payloads == [b"high 1", b"normal 1", b"normal 2", b"coalesced", b"low 1", b"low 2"]
    assert show_jobs(server) == {scheduled: 0}  # still waiting for its time
    assert status(server)[FUNCTION][:2] == (1, 0)


def test_store_errors_refuse_submits_and_the_server_keeps_serving(
    db: Path, servers: list[ServerProcess]
) -> None:
    server = start(servers, db, "--verbose", "INFO")
    client = GearmanSocket(server)
    kept = client.submit_bg(FUNCTION, "before")
    # Every file write of the server now fails (EFBIG), as on a full disk.
    unlimited = resource.RLIM_INFINITY
    resource.prlimit(server.proc.pid, resource.RLIMIT_FSIZE, (1, unlimited))
    try:
        for i in range(3):
            client.send(Cmd.SUBMIT_JOB_BG, FUNCTION, "", f"refused {i}")
            error = client.expect(Cmd.ERROR)
            assert error.args == (b"QUEUE_ERROR", b"Job could not be stored")
        # Pipelined: the whole batch is refused, nothing is half-acknowledged.
        client.sock.sendall(
            b"".join(pack(Cmd.SUBMIT_JOB_BG, FUNCTION, "", f"refused b{i}") for i in range(50))
        )
        for _ in range(50):
            assert client.expect(Cmd.ERROR).args[0] == b"QUEUE_ERROR"
        # What needs no disk still works: echo, admin, foreground jobs (not stored).
        assert client.request(Cmd.ECHO_REQ, "still here", reply=Cmd.ECHO_RES).args == (
            b"still here",
        )
        assert show_jobs(server) == {kept: 0}
        foreground = client.submit_fg("echo-fg", "no disk needed")
        with GearmanSocket(server) as worker:
            worker.send(Cmd.CAN_DO, "echo-fg")
            assert worker.grab().args[0].decode() == foreground
            worker.send(Cmd.WORK_COMPLETE, foreground, "done")
        assert client.expect(Cmd.WORK_COMPLETE).args == (foreground.encode(), b"done")
    finally:
        resource.prlimit(server.proc.pid, resource.RLIMIT_FSIZE, (unlimited, unlimited))
    stored = client.submit_bg(FUNCTION, "after")
    client.close()
    server.kill()

    log = server.log()
    assert "writes succeed again after" in log and "File too large" in log, log
    server = start(servers, db)
    assert drain(server) == [(kept, b"before"), (stored, b"after")]


def test_a_second_server_on_the_same_file_refuses_to_start(
    db: Path, servers: list[ServerProcess]
) -> None:
    start(servers, db)
    port = str(free_port())
    cmd = [
        sys.executable,
        "-m",
        "jobwire",
        "serve",
        "--port",
        port,
        "--http-port",
        "0",
        "--zmq-port",
        "0",
    ]
    second = subprocess.run(
        [*cmd, "--store", f"sqlite:{db}"], capture_output=True, text=True, timeout=60
    )
    assert second.returncode != 0
    assert "in use by another process" in second.stderr


def test_a_corrupt_file_is_refused_at_start_and_left_alone(db: Path) -> None:
    db.parent.mkdir(parents=True)
    garbage = b"not a database, and not to be overwritten\n" * 1000
    db.write_bytes(garbage)
    port = str(free_port())
    cmd = [
        sys.executable,
        "-m",
        "jobwire",
        "serve",
        "--port",
        port,
        "--http-port",
        "0",
        "--zmq-port",
        "0",
    ]
    started = subprocess.run(
        [*cmd, "--store", f"sqlite:{db}"], capture_output=True, text=True, timeout=60
    )
    assert started.returncode != 0
    assert f"cannot use {db}" in started.stderr
    assert db.read_bytes() == garbage


def syncer_pids(server: ServerProcess) -> list[int]:
    """The server's child processes that run the redo log syncer."""
    pid = server.proc.pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [
        int(child)
        for child in children
        if b"syncproc" in Path(f"/proc/{child}/cmdline").read_bytes()
    ]


def gone(pid: int, deadline: float = 15.0) -> bool:
    """Whether process `pid` has exited (it is not our child: poll /proc)."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        try:
            state = process_state(pid)
        except FileNotFoundError:
            return True
        if state == "Z":  # exited, its parent (init, after the kill) not yet reaped it
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize("fsync", ["batch", "always"])
def test_the_syncer_runs_before_the_first_job_and_acknowledges_it(
    db: Path, servers: list[ServerProcess], fsync: str
) -> None:
    """Started at the first sync instead, it made every client's first acknowledgement
    wait for a Python process to start."""
    server = start(servers, db, "--fsync", fsync)
    (syncer,) = syncer_pids(server)  # listening means started: no job has been submitted
    GearmanSocket(server).submit_bg(FUNCTION, "synced")
    assert syncer_pids(server) == [syncer]  # the same process synced it


def test_with_fsync_off_no_syncer_runs(db: Path, servers: list[ServerProcess]) -> None:
    server = start(servers, db, "--fsync", "off")
    GearmanSocket(server).submit_bg(FUNCTION, "written")
    assert syncer_pids(server) == []


@pytest.mark.parametrize("ending", ["SIGTERM", "SIGKILL"])
def test_the_syncer_process_ends_with_the_server(
    db: Path, servers: list[ServerProcess], ending: str
) -> None:
    server = start(servers, db)
    (syncer,) = syncer_pids(server)
    if ending == "SIGTERM":
        assert server.stop() == 0
    else:
        server.kill()
    assert gone(syncer)


@pytest.mark.parametrize(("flag", "window"), [((), "0.0001"), (("--busy-poll", "0"), "0.0")])
def test_the_syncer_polls_as_long_as_the_server(
    db: Path, servers: list[ServerProcess], flag: tuple[str, ...], window: str
) -> None:
    server = start(servers, db, *flag)
    (syncer,) = syncer_pids(server)
    argv = Path(f"/proc/{syncer}/cmdline").read_bytes().split(b"\0")
    # ... SOCKET_FD DIRECTORY PREFIX BUSY_POLL WRITTEN_FD, and an empty string after the last
    assert argv[-3].decode() == window  # seconds
