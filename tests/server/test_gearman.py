"""The Gearman listener against a real jobwire process: behaviour beyond gearmand's.

Ordering across connections is established with ECHO round trips (a connection's requests
are handled in order), never with sleeps. Waits for timers use generous deadlines only as
a safety net.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator

import pytest

from tests.interop.gearman_raw import Cmd, GearmanSocket, admin, list_lines, pack
from tests.servers import ServerProcess, start_jobwire


def sync(conn: GearmanSocket) -> list[Cmd]:
    """Wait until the server handled everything sent on `conn`; return what came before."""
    conn.send(Cmd.ECHO_REQ, b"sync")
    before = []
    while (packet := conn.recv()).type != Cmd.ECHO_RES:
        before.append(packet.type)
    return before


def sleeping_worker(server: ServerProcess, function: str) -> GearmanSocket:
    worker = GearmanSocket(server)
    worker.send(Cmd.CAN_DO, function)
    worker.send(Cmd.PRE_SLEEP)
    sync(worker)
    return worker


@pytest.fixture
def server_with(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    marker = request.node.get_closest_marker("server_args")
    args = list(marker.args) if marker else []
    server = start_jobwire(["--job-handle-prefix", "H:t", *args])
    yield server
    assert server.stop() == 0, server.log()


def test_one_job_wakes_one_sleeper(server_with: ServerProcess) -> None:
    sleepers = [sleeping_worker(server_with, "f") for _ in range(5)]
    with GearmanSocket(server_with) as client:
        client.submit_bg("f", "x")
    with GearmanSocket(server_with) as client:
        sync(client)  # the submit and its wake-ups are done
    # Each worker's NOOP, if any, arrives before the answer to its ECHO.
    woken = [worker for worker in sleepers if sync(worker) == [Cmd.NOOP]]
    assert len(woken) == 1


@pytest.mark.server_args("-w", "0")
def test_worker_wakeup_zero_wakes_all(server_with: ServerProcess) -> None:
    sleepers = [sleeping_worker(server_with, "f") for _ in range(3)]
    with GearmanSocket(server_with) as client:
        client.submit_bg("f", "x")
    for worker in sleepers:
        assert worker.recv().type == Cmd.NOOP


def test_epoch_job_wakes_sleeper_when_due(server_with: ServerProcess) -> None:
    worker = sleeping_worker(server_with, "later")
    with GearmanSocket(server_with) as client:
        due = int(time.time()) + 1
        client.request(
            Cmd.SUBMIT_JOB_EPOCH, "later", "", str(due), "payload", reply=Cmd.JOB_CREATED
        )
    assert worker.recv().type == Cmd.NOOP  # arrives once due, without polling
    assert time.time() >= due - 0.01
    assigned = worker.grab()
    assert assigned.args[-1] == b"payload"


def test_sched_job_is_accepted_and_scheduled(server_with: ServerProcess) -> None:
    with GearmanSocket(server_with) as client:
        created = client.request(
            Cmd.SUBMIT_JOB_SCHED, "cron", "", "", "", "", "", "", "data", reply=Cmd.JOB_CREATED
        )
        handle = created.args[0]
        status = client.request(Cmd.GET_STATUS, handle, reply=Cmd.STATUS_RES)
        assert status.args[1:3] == (b"1", b"0")
        # Not runnable before the next whole minute.
        worker = GearmanSocket(server_with)
        worker.send(Cmd.CAN_DO, "cron")
        assert worker.grab().type == Cmd.NO_JOB
        bad = client.request(
            Cmd.SUBMIT_JOB_SCHED, "cron", "", "61", "", "", "", "", "d", reply=Cmd.ERROR
        )
        assert bad.args[0] == b"INVALID_ARGUMENT"


def test_can_do_timeout_requeues_and_late_result_is_rejected(server_with: ServerProcess) -> None:
    slow = GearmanSocket(server_with)
    slow.send(Cmd.CAN_DO_TIMEOUT, "t", "100")
    with GearmanSocket(server_with) as client:
        handle = client.submit_bg("t", "x")
        assigned = slow.grab()
        assert assigned.args[0].decode() == handle
        # Another worker gets the job once the lease runs out.
        other = sleeping_worker(server_with, "t")
        assert other.recv().type == Cmd.NOOP
        again = other.grab()
        assert again.args[0].decode() == handle
        slow.send(Cmd.WORK_COMPLETE, handle, "late")
        error = slow.expect(Cmd.ERROR)
        assert error.args[0] == b"JOB_NOT_FOUND"
        jobs = list_lines(admin(server_with, "show jobs"))
        assert jobs == [f"{handle}\t1\t0\t1"]


@pytest.mark.server_args("--job-retries", "2")
def test_job_retries_exhausted_fails_clients(server_with: ServerProcess) -> None:
    with GearmanSocket(server_with) as client:
        handle = client.submit_fg("crash", "x")
        for _ in range(2):
            worker = GearmanSocket(server_with)
            worker.send(Cmd.CAN_DO, "crash")
            assert worker.grab().args[0].decode() == handle
            worker.close()  # dies mid-job
        fail = client.expect(Cmd.WORK_FAIL)
        assert fail.args[0].decode() == handle
    assert list_lines(admin(server_with, "show jobs")) == []


def test_background_job_survives_coalesced_foreground_client(server_with: ServerProcess) -> None:
    with GearmanSocket(server_with) as client:
        handle = client.submit_bg("f", "x", unique="u1")
        fg = GearmanSocket(server_with)
        assert fg.submit_fg("f", "x", unique="u1") == handle
        fg.close()
        sync(client)
        worker = GearmanSocket(server_with)
        worker.send(Cmd.CAN_DO, "f")
        assert worker.grab().args[0].decode() == handle


def test_foreground_job_dropped_when_its_only_client_leaves(server_with: ServerProcess) -> None:
    fg = GearmanSocket(server_with)
    fg.submit_fg("f", "x")
    fg.close()
    with GearmanSocket(server_with) as worker:
        worker.send(Cmd.CAN_DO, "f")
        # The server handles the close before later requests on other connections only
        # eventually; poll the queue rather than race it.
        deadline = time.monotonic() + 30
        while list_lines(admin(server_with, "show jobs")) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert worker.grab().type == Cmd.NO_JOB


def test_bad_input_closes_only_that_connection(server_with: ServerProcess) -> None:
    with GearmanSocket(server_with) as good:
        handle = good.submit_bg("f", "x")
        bad = socket.create_connection(("127.0.0.1", server_with.port))
        bad.sendall(b"\0BAD" + b"\0" * 8)
        reply = bad.recv(4096)
        assert b"INVALID_MAGIC" in reply
        assert bad.recv(4096) == b""  # closed
        bad.close()
        status = good.request(Cmd.GET_STATUS, handle, reply=Cmd.STATUS_RES)
        assert status.args[1] == b"1"


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_a_packet_over_several_reads_is_answered(store: str, tmp_path: os.PathLike[str]) -> None:
    """A packet that arrives in three or more reads is answered once it is whole (the reads
    that only add to it must not leave the connection unscheduled for its next write)."""
    where = "memory" if store == "memory" else f"sqlite:{os.path.join(tmp_path, 'jw.db')}"
    server = start_jobwire(["--store", where])
    try:
        packet = pack(Cmd.SUBMIT_JOB_BG, "f", "u1", b"x" * 300_000)
        with GearmanSocket(server) as client, GearmanSocket(server) as other:
            for start, stop in ((0, 100), (100, 100_000), (100_000, 200_000), (200_000, None)):
                client.sock.sendall(packet[start:stop])
                # The part was in the socket before this request: the server has read it
                # by the time it answers.
                sync(other)
            created = client.expect(Cmd.JOB_CREATED)
            assert created.args[0]
    finally:
        assert server.stop() == 0, server.log()


@pytest.mark.server_args("--max-packet-size", "1024")
def test_oversized_packet_is_refused_without_buffering(server_with: ServerProcess) -> None:
    bad = socket.create_connection(("127.0.0.1", server_with.port))
    bad.sendall(pack(Cmd.SUBMIT_JOB_BG, "f", "", b"x" * 2000))
    reply = bad.recv(4096)
    assert b"ARGUMENT_TOO_LARGE" in reply
    bad.close()
    with GearmanSocket(server_with) as good:
        sync(good)


def test_endless_admin_line_is_cut_off(server_with: ServerProcess) -> None:
    bad = socket.create_connection(("127.0.0.1", server_with.port))
    bad.sendall(b"x" * 100_000)
    reply = bad.recv(4096)
    assert b"ARGUMENT_TOO_LARGE" in reply
    bad.close()


def test_sigterm_exits_cleanly_and_removes_pid_file(tmp_path: os.PathLike[str]) -> None:
    pid_file = os.path.join(tmp_path, "jobwire.pid")
    server = start_jobwire(["--pid-file", pid_file])
    try:
        with open(pid_file) as f:
            assert int(f.read()) == server.proc.pid
        with GearmanSocket(server) as client:
            client.submit_bg("f", "x")
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(30) == 0
        assert not os.path.exists(pid_file)
    finally:
        server.kill()


def test_work_a_woken_worker_leaves_waiting_wakes_another(server_with: ServerProcess) -> None:
    # With -w 1 only one sleeper is woken; if it never grabs (busy elsewhere, or a dead
    # link), the wake-up fallback wakes the next one rather than stranding the job.
    first = sleeping_worker(server_with, "f")
    second = sleeping_worker(server_with, "f")
    with GearmanSocket(server_with) as client:
        handle = client.submit_bg("f", "x")
    woken, other = (first, second) if sync(first) == [Cmd.NOOP] else (second, first)
    assert other.recv().type == Cmd.NOOP  # the fallback, once its delay has passed
    assert other.grab().args[0].decode() == handle
    assert sync(woken) == []


def test_drop_function_refuses_while_jobs_are_queued(server_with: ServerProcess) -> None:
    # gearmand drops the function and orphans its queued jobs; jobwire keeps both.
    with GearmanSocket(server_with) as client:
        handle = client.submit_bg("f", "x")
        refused = admin(server_with, "drop function f")
        assert refused == "ERR there are still connected workers or executing clients\r\n"
        assert list_lines(admin(server_with, "status")) == ["f\t1\t0\t0"]
        status = client.request(Cmd.GET_STATUS, handle, reply=Cmd.STATUS_RES)
        assert status.args[1] == b"1"


def waiting_grabs(server: ServerProcess, function: str, grabs: int) -> GearmanSocket:
    """A worker with the grab-waits option and `grabs` GRAB_JOB_UNIQs held by the server."""
    worker = GearmanSocket(server)
    reply = worker.request(Cmd.OPTION_REQ, "grab-waits", reply=Cmd.OPTION_RES)
    assert reply.args == (b"grab-waits",)
    worker.send(Cmd.CAN_DO, function)
    for _ in range(grabs):
        worker.send(Cmd.GRAB_JOB_UNIQ)
    assert sync(worker) == []  # held: neither NO_JOB nor NOOP
    return worker


def test_grab_waits_hands_a_new_job_to_a_held_grab(server_with: ServerProcess) -> None:
    """The extension saves a sleeping worker's NOOP + GRAB round trip."""
    worker = waiting_grabs(server_with, "f", 1)
    with GearmanSocket(server_with) as client:
        handle = client.submit_bg("f", "pushed", unique="u1")
    assigned = worker.recv()
    assert assigned.type == Cmd.JOB_ASSIGN_UNIQ
    assert assigned.args == (handle.encode(), b"f", b"u1", b"pushed")
    worker.send(Cmd.WORK_COMPLETE, handle, "done")
    assert sync(worker) == []


def test_grab_waits_answers_each_held_grab_once(server_with: ServerProcess) -> None:
    worker = waiting_grabs(server_with, "f", 3)
    with GearmanSocket(server_with) as client:
        handles = [client.submit_bg("f", str(n)) for n in range(2)]
    got = [worker.recv(), worker.recv()]
    assert [packet.args[0].decode() for packet in got] == handles
    # Resetting the abilities answers the GRAB still held.
    worker.send(Cmd.RESET_ABILITIES)
    assert sync(worker) == [Cmd.NO_JOB]
    # A job queued before the grab is assigned at once, as without the option.
    with GearmanSocket(server_with) as client:
        queued = client.submit_bg("g", "ready")
    worker.send(Cmd.CAN_DO, "g")
    worker.send(Cmd.GRAB_JOB)
    assert worker.expect(Cmd.JOB_ASSIGN).args[0].decode() == queued


def test_without_the_option_an_empty_grab_gets_no_job(server_with: ServerProcess) -> None:
    with GearmanSocket(server_with) as worker:
        worker.send(Cmd.CAN_DO, "f")
        worker.send(Cmd.GRAB_JOB)
        assert sync(worker) == [Cmd.NO_JOB]
        reply = worker.request(Cmd.OPTION_REQ, "no-such-option", reply=Cmd.ERROR)
        assert reply.args[0] == b"UNKNOWN_OPTION"


def serial_round_trips(server: ServerProcess, count: int) -> None:
    """Foreground jobs one at a time through a sleeping worker: NOOP, grab, result."""
    with GearmanSocket(server) as worker, GearmanSocket(server) as client:
        worker.send(Cmd.CAN_DO, "echo")
        for n in range(count):
            worker.send(Cmd.PRE_SLEEP)
            sync(worker)
            client.send(Cmd.SUBMIT_JOB, "echo", "", f"job {n}")
            handle = client.expect(Cmd.JOB_CREATED).args[0]
            assert worker.recv().type == Cmd.NOOP
            assigned = worker.grab()
            worker.send(Cmd.WORK_COMPLETE, handle, assigned.args[-1])
            result = client.expect(Cmd.WORK_COMPLETE)
            assert result.args == (handle, f"job {n}".encode())


def cpu_ticks(pid: int) -> int:
    """User and system CPU time of a process, in clock ticks."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


@pytest.mark.server_args("--busy-poll", "2000")
def test_a_busy_polling_server_serves_and_then_stops_polling(server_with: ServerProcess) -> None:
    serial_round_trips(server_with, 50)
    time.sleep(0.1)  # far more than the 2 ms window
    before = cpu_ticks(server_with.proc.pid)
    time.sleep(1.0)
    # Still polling, it would use a whole CPU (about 100 ticks a second); idle, next to none.
    assert cpu_ticks(server_with.proc.pid) - before < 30


@pytest.mark.server_args("--busy-poll", "0")
def test_without_busy_polling_the_server_serves_the_same(server_with: ServerProcess) -> None:
    serial_round_trips(server_with, 20)


@pytest.mark.parametrize(
    "prefix", ["H:t", "H:" + "long-host-name." * 2 + "x" * 12]
)  # the longest allowed
def test_job_created_names_every_job_by_its_number_across_blocks(prefix: str) -> None:
    # Replies of numbers from 1000 on are built from a block's start (`created_reply`);
    # with the longest prefix allowed the handles reach 64 bytes with the largest numbers.
    server = start_jobwire(["--job-handle-prefix", prefix, "--store", "memory"])
    try:
        with GearmanSocket(server) as client:
            count = 2100
            client.sock.sendall(pack(Cmd.SUBMIT_JOB_BG, "f", "", "x") * count)
            handles = [client.expect(Cmd.JOB_CREATED).args[0] for _ in range(count)]
            assert handles == [f"{prefix}:{number}".encode() for number in range(1, count + 1)]
            status = client.request(Cmd.GET_STATUS, handles[1500], reply=Cmd.STATUS_RES)
            assert status.args[:2] == (handles[1500], b"1")  # known, by the handle it was given
    finally:
        assert server.stop() == 0, server.log()


def test_a_result_under_a_handle_that_only_ends_with_the_jobs_number_is_refused(
    server_with: ServerProcess,
) -> None:
    # Workers' handles are matched by number first (`scanner.handle_number`): the
    # rest of the handle must still be the job's id, byte for byte.
    with GearmanSocket(server_with) as client, GearmanSocket(server_with) as worker:
        worker.send(Cmd.CAN_DO, "f")
        handle = client.submit_fg("f", "x")
        assert worker.grab().args[0].decode() == handle
        number = handle.rsplit(":", 1)[1]
        for other in (f"H:u:{number}", f"X:t:{number}", f"H:t:0{number}", f"H:t{number}"):
            worker.send(Cmd.WORK_COMPLETE, other, "wrong")
            assert worker.expect(Cmd.ERROR).args[0] == b"JOB_NOT_FOUND", other
        worker.send(Cmd.WORK_COMPLETE, handle, "right")
        assert client.expect(Cmd.WORK_COMPLETE).args == (handle.encode(), b"right")


def test_job_assign_names_each_function_by_the_bytes_it_was_submitted_under(
    server_with: ServerProcess,
) -> None:
    # Names are decoded once and encoded back once (`GearmanServer.raw_name`), bytes that
    # are not UTF-8 included; alternating names take the cache's every way.
    names = [b"f\xff\xfe", b"plain", "ünï".encode(), b"f\xff\xfe", b"plain"]
    with GearmanSocket(server_with) as client, GearmanSocket(server_with) as worker:
        for name in dict.fromkeys(names):
            worker.send(Cmd.CAN_DO, name)
        for number, name in enumerate(names):
            client.request(Cmd.SUBMIT_JOB_BG, name, b"", str(number), reply=Cmd.JOB_CREATED)
        sync(worker)
        for number, name in enumerate(names):
            worker.send(Cmd.GRAB_JOB)
            assigned = worker.expect(Cmd.JOB_ASSIGN)
            assert assigned.args[1:] == (name, str(number).encode())
