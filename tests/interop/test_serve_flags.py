"""`jobwire serve` takes gearmand's command line: every flag, its exit codes, and the flags
that do something (README, "Command line").

The option checks run the same command line against gearmand (Debian's 1.1.20) and jobwire
and expect the same exit code; they are gearmand's own t/gearmand checks. The rest start a
server and look at what the flag did. Waits poll up to a deadline; nothing depends on how
long something takes.
"""

from __future__ import annotations

import os
import pwd
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwire.gearmand_compat import switch_user
from tests.interop.gearman_raw import DEADLINE, GearmanSocket, admin, wait_until
from tests.servers import (
    ServerProcess,
    free_port,
    gearmand_path,
    process_state,
    start_jobwire,
    wait_for_port,
)

JOBWIRE = [sys.executable, "-m", "jobwire", "serve"]

# gearmand 1.1.20's tests/gearmand.cc: (arguments, exit code), all with --check-args.
ACCEPTED = [
    [],
    ["--backlog=10"],
    ["-b", "10"],
    ["--coredump"],
    ["--daemon"],
    ["-d"],
    ["--file-descriptors=10"],
    ["-f", "10"],
    ["--help"],
    ["-h"],
    ["--keepalive"],
    ["--keepalive-idle=10"],
    ["--keepalive-interval=3"],
    ["--keepalive-count=10"],
    ["--log-file=tmp/foo"],
    ["--log-file=stderr"],
    ["-l", "tmp/foo"],
    ["--listen=10"],
    ["-L", "10"],
    ["--port=10"],
    ["-p", "10"],
    ["--pid-file=tmp/gearmand.pid"],
    ["-P", "tmp/gearmand.pid"],
    ["--round-robin"],
    ["-R"],
    ["--ssl"],
    ["--syslog"],
    ["--threads=10"],
    ["-t", "8"],
    ["--user=nobody"],
    ["-u", "nobody"],
    ["--version"],
    ["-V"],
    *[[f"--verbose={level}"] for level in ("FATAL", "ALERT", "CRITICAL", "ERROR")],
    *[[f"--verbose={level}"] for level in ("WARNING", "NOTICE", "INFO", "DEBUG")],
    ["--worker-wakeup=4"],
    ["-w", "4"],
    ["--protocol=http"],
    ["--protocol=http", "--http-port=8090"],
    ["--queue-type=builtin"],
    ["--job-retries=4"],
    ["-j", "6"],
    ["--job-handle-prefix=my_own_private_handle"],
    ["--hashtable-buckets=2000"],
]
REFUSED = [
    ["foo"],  # a positional argument
    ["--log"],  # a partial option name
    ["-vvv"],  # gearmand 1.x: "Option -v has been deprecated, please use --verbose"
    ["--verbose=BAD"],
    ["--config-file"],
    ["--config-file=etc/grmandfoo.conf"],
    ["--hashtable-buckets=0"],
]


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=DEADLINE, cwd=cwd)


@pytest.fixture(params=["jobwire", "gearmand"])
def binary(request: pytest.FixtureRequest) -> list[str]:
    return JOBWIRE if request.param == "jobwire" else [gearmand_path()]


@pytest.mark.parametrize("args", ACCEPTED, ids=" ".join)
def test_gearmand_options_are_accepted(binary: list[str], args: list[str], tmp_path: Path) -> None:
    result = run([*binary, "--check-args", *args], tmp_path)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("args", REFUSED, ids=" ".join)
def test_bad_arguments_exit_1(binary: list[str], args: list[str], tmp_path: Path) -> None:
    result = run([*binary, "--check-args", *args], tmp_path)
    assert result.returncode == 1, result.stderr


def test_short_verbose_is_refused_with_gearmands_message(tmp_path: Path) -> None:
    result = run([*JOBWIRE, "-vvv"], tmp_path)
    assert result.returncode == 1
    assert "Option -v has been deprecated, please use --verbose" in result.stderr


def test_a_queue_type_jobwire_lacks_names_what_it_supports(tmp_path: Path) -> None:
    result = run([*JOBWIRE, "--check-args", "-q", "redis"], tmp_path)
    assert result.returncode == 1
    assert "'redis'" in result.stderr
    assert "builtin" in result.stderr and "libsqlite3" in result.stderr


def test_queue_type_and_a_different_store_conflict(tmp_path: Path) -> None:
    cmd = [*JOBWIRE, "-q", "libsqlite3", "--libsqlite3-db", "q.db", "--store", "memory"]
    result = run(cmd, tmp_path)
    assert result.returncode == 1 and "--store sqlite:q.db" in result.stderr


def test_version_is_printed_as_gearmand_does(tmp_path: Path) -> None:
    for flag in ("-V", "--version"):
        result = run([*JOBWIRE, flag], tmp_path)
        assert result.returncode == 0
        assert result.stdout.startswith("\njobwire ")
        assert "gearmand 1.1.20" in result.stdout


def test_help_with_h(tmp_path: Path) -> None:
    result = run([*JOBWIRE, "-h"], tmp_path)
    assert result.returncode == 0 and "--queue-type" in result.stdout


def test_ssl_without_certificate_files_is_refused_at_start(tmp_path: Path) -> None:
    result = run([*JOBWIRE, "--ssl", "--store", "memory"], tmp_path)
    assert result.returncode == 1 and "--ssl-certificate" in result.stderr


# -- flags that act -----------------------------------------------------------------------


@pytest.fixture
def stopped() -> Iterator[list[ServerProcess]]:
    servers: list[ServerProcess] = []
    yield servers
    for server in servers:
        server.stop()


def start(args: list[str], port: int, workdir: Path) -> ServerProcess:
    """`jobwire serve ARGS` as given (start_jobwire adds --port and --store of its own)."""
    cmd = [*JOBWIRE, "--http-port", "0", "--zmq-port", "0", *args]
    log = open(workdir / "server.log", "wb")  # noqa: SIM115 - owned by the process
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    wait_for_port(port, proc)
    return ServerProcess("jobwire", proc, port, workdir)


def admin_at(port: int, command: str) -> str:
    """One admin command to the server on `port` (one not started by this test process)."""
    with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE) as conn:
        conn.sendall(command.encode() + b"\n")
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = conn.recv(4096)
            assert chunk, f"connection closed after {reply!r}"
            reply += chunk
    return reply.decode()


def test_config_file_options_apply_and_the_command_line_wins(
    tmp_path: Path, stopped: list[ServerProcess]
) -> None:
    in_file, on_line = free_port(), free_port()
    config = tmp_path / "gearmand.conf"
    config.write_text(
        f"# as gearmand reads it\n--port {in_file} --store memory\n--job-handle-prefix=fromfile\n"
    )
    server = start(["--config-file", str(config)], in_file, tmp_path)
    stopped.append(server)
    assert admin(server, "version").startswith("OK")
    with_line = start([f"--config-file={config}", "--port", str(on_line)], on_line, tmp_path)
    stopped.append(with_line)
    with GearmanSocket(with_line) as conn:
        assert conn.submit_bg("f", "x").startswith("fromfile:")


def test_file_descriptors_sets_the_open_files_limit(stopped: list[ServerProcess]) -> None:
    server = start_jobwire(["-f", "777"])
    stopped.append(server)
    limits = Path(f"/proc/{server.proc.pid}/limits").read_text()
    line = next(row for row in limits.splitlines() if row.startswith("Max open files"))
    assert line.split()[3] == "777", line


def test_queue_type_libsqlite3_is_the_sqlite_store(
    tmp_path: Path, stopped: list[ServerProcess]
) -> None:
    db, port = tmp_path / "queue.db", free_port()
    sqlite = ["-q", "libsqlite3", "--libsqlite3-db", str(db), "--libsqlite3-table", "t"]
    server = start(["-p", str(port), *sqlite], port, tmp_path)
    stopped.append(server)
    wait_until(db.exists, f"{db} to be created")


def test_protocol_http_serves_http(stopped: list[ServerProcess]) -> None:
    http_port = free_port()
    server = start_jobwire(["-r", "http", "--http-port", str(http_port)])
    stopped.append(server)
    wait_for_port(http_port, server.proc)


def _usable_by_others(path: Path) -> bool:
    """Whether users other than the owner can reach `path` (every directory down to it)."""
    return all(os.stat(part).st_mode & 0o005 == 0o005 for part in [path, *path.parents])


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_switch_user_drops_root() -> None:
    nobody = pwd.getpwnam("nobody")
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        try:
            switch_user("nobody")
            os.write(write_end, f"{os.getuid()} {os.geteuid()} {os.getgid()}".encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        report = pipe.read().decode()
    os.waitpid(child, 0)
    assert report == f"{nobody.pw_uid} {nobody.pw_uid} {nobody.pw_gid}"


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
@pytest.mark.skipif(
    not _usable_by_others(Path(sys.base_prefix)), reason="Python is not readable by nobody"
)
def test_user_drops_root(stopped: list[ServerProcess]) -> None:
    nobody = pwd.getpwnam("nobody")
    server = start_jobwire(["-u", "nobody"])
    stopped.append(server)
    status = Path(f"/proc/{server.proc.pid}/status").read_text()
    uid_line = next(row for row in status.splitlines() if row.startswith("Uid:"))
    assert uid_line.split()[1:] == [str(nobody.pw_uid)] * 4


def test_user_that_one_already_is_is_a_no_op(stopped: list[ServerProcess]) -> None:
    me = pwd.getpwuid(os.geteuid()).pw_name
    server = start_jobwire(["-u", me])
    stopped.append(server)
    assert admin(server, "version").startswith("OK")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may switch to anyone")
def test_user_switch_without_root_exits_1(tmp_path: Path) -> None:
    result = run([*JOBWIRE, "-u", "nobody", "--store", "memory"], tmp_path)
    assert result.returncode == 1 and "root" in result.stderr


def _daemon_cmd(port: int, pid_file: Path) -> list[str]:
    return [
        *JOBWIRE,
        "-d",
        "-P",
        str(pid_file),
        "-p",
        str(port),
        "--store",
        "memory",
        "--http-port",
        "0",
        "--zmq-port",
        "0",
    ]


def test_daemon_detaches_and_writes_the_pid_file(tmp_path: Path) -> None:
    port, pid_file = free_port(), tmp_path / "jobwire.pid"
    # capture_output: run() only returns once nobody holds our stdout/stderr any more, so
    # returning at all shows the daemon let go of them.
    result = run(_daemon_cmd(port, pid_file), tmp_path)
    assert result.returncode == 0, result.stderr
    pid = int(pid_file.read_text())
    try:
        assert pid != os.getpid()
        # A session of its own, which it does not lead (so it can never take a terminal).
        assert os.getsid(pid) not in (os.getsid(0), pid)
        with open(f"/proc/{pid}/stat") as stat:  # parent: init or a subreaper, not us
            assert int(stat.read().rsplit(")", 1)[1].split()[1]) != os.getpid()
        assert admin_at(port, "getpid") == f"OK {pid}\n"
    finally:
        os.kill(pid, signal.SIGTERM)

    def gone() -> bool:
        try:
            return process_state(pid) == "Z"
        except FileNotFoundError:
            return True

    wait_until(gone, "the daemon to exit")
    wait_until(lambda: not pid_file.exists(), "the pid file to be removed")


def test_daemon_that_cannot_start_exits_1(tmp_path: Path, stopped: list[ServerProcess]) -> None:
    taken = start_jobwire()
    stopped.append(taken)
    result = run(_daemon_cmd(taken.port, tmp_path / "jobwire.pid"), tmp_path)
    assert result.returncode == 1
