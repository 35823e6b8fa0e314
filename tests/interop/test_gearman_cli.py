r"""libgearman's `gearman` CLI (Debian gearman-tools 1.1.20) as client and worker.

What this client sends (recorded against gearmand 1.1.20):
- client: one SUBMIT_JOB* per job with a fresh UUID unique unless `-u` is given
  (`rev\0<uuid>\0hello`); `-I` = high priority (SUBMIT_JOB_HIGH / _HIGH_BG), `-L` = low,
  `-b` = background (prints nothing, exits after JOB_CREATED). `-n`/`-N` submit one job per
  input line, one after the other (`-N` strips the newline). The result is printed as is,
  with no newline added; WORK_DATA chunks are printed as they come. WORK_FAIL prints
  "Job failed" on stderr and exits 1.
- worker (`-w`): CAN_DO per `-f` (no RESET_ABILITIES, no SET_CLIENT_ID), then GRAB_JOB_ALL;
  on NO_JOB it sends PRE_SLEEP, on NOOP GRAB_JOB_ALL again, and expects JOB_ASSIGN_UNIQ.
  Each job's workload goes to the command's stdin, its stdout becomes the WORK_COMPLETE data;
  a non-zero exit becomes WORK_FAIL. Without a command the workload is written to the worker's
  own stdout and the result is empty. `-c N` exits after N jobs.

No test depends on timing: jobs are queued before a worker exists when order matters, and
every wait polls the server's admin interface (or GET_STATUS_UNIQUE) up to a deadline.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from tests.interop.gearman_raw import (
    DEADLINE,
    Cmd,
    GearmanSocket,
    admin,
    list_lines,
    priority_status,
    status,
    wait_for_status,
    wait_for_workers,
    wait_until,
)
from tests.servers import ServerProcess

pytestmark = pytest.mark.interop

GEARMAN = "/usr/bin/gearman"


def gearman_argv(server: ServerProcess, *args: str) -> list[str]:
    return [GEARMAN, "-h", "127.0.0.1", "-p", str(server.port), *args]


def run_client(
    server: ServerProcess, *args: str, stdin: bytes = b""
) -> subprocess.CompletedProcess[bytes]:
    """Run a `gearman` client to completion (it reads stdin when no data argument is given)."""
    return subprocess.run(
        gearman_argv(server, *args), input=stdin, capture_output=True, timeout=DEADLINE, check=False
    )


def spawn(server: ServerProcess, *args: str) -> subprocess.Popen[bytes]:
    """Start `gearman` (a waiting client or a worker) without waiting for it."""
    return subprocess.Popen(
        gearman_argv(server, *args),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def finish(proc: subprocess.Popen[bytes]) -> tuple[int, bytes, bytes]:
    """Wait for a started process; (returncode, stdout, stderr)."""
    out, err = proc.communicate(timeout=DEADLINE)
    return proc.returncode, out, err


@contextmanager
def running(proc: subprocess.Popen[bytes]) -> Iterator[subprocess.Popen[bytes]]:
    """Make sure a started process is gone when the test ends, whatever happened."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        proc.wait()


def cli_worker(
    server: ServerProcess,
    functions: list[str],
    count: int,
    command: list[str],
    options: tuple[str, ...] = (),
) -> subprocess.Popen[bytes]:
    """`gearman -w -f F... -c COUNT [options] -- command...`; exits after `count` jobs."""
    args = ["-w", *(arg for f in functions for arg in ("-f", f)), "-c", str(count), *options]
    if command:
        args += ["--", *command]
    return spawn(server, *args)


def wait_for_priority_status(
    server: ServerProcess, function: str, want: tuple[int, int, int, int]
) -> None:
    def probe() -> bool:
        return priority_status(server).get(function) == want

    wait_until(probe, f"prioritystatus of {function!r} == {want}")


def recorder(path: Path) -> list[str]:
    """A worker command that returns the workload and appends it as a line to `path`."""
    return ["sh", "-c", 'tee -a "$1"; echo >> "$1"', "sh", str(path)]


def recorded(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_foreground_job(any_server: ServerProcess) -> None:
    with running(cli_worker(any_server, ["rev"], 1, ["rev"])) as worker:
        wait_for_workers(any_server, "rev")
        client = run_client(any_server, "-f", "rev", "hello world")
        assert (client.returncode, client.stdout, client.stderr) == (0, b"dlrow olleh", b"")
        assert finish(worker)[0] == 0


def test_large_workload_and_result(any_server: ServerProcess) -> None:
    """2 MB each way, which the server reads over many reads: a workload the worker counts,
    then a result it makes. (Not one `cat`: the CLI worker writes the whole workload to the
    command before it reads any output, so a large echo fills the pipe and stalls.)"""
    size = 2 * 1024 * 1024
    make = f"cat > /dev/null; head -c {size} /dev/zero | tr '\\0' x"
    with running(cli_worker(any_server, ["count"], 1, ["wc", "-c"])) as counter:
        client = run_client(any_server, "-f", "count", stdin=bytes(range(256)) * (size // 256))
        assert (client.returncode, client.stdout.strip()) == (0, str(size).encode())
        assert finish(counter)[0] == 0
    with running(cli_worker(any_server, ["make"], 1, ["sh", "-c", make])) as maker:
        client = run_client(any_server, "-f", "make", "go")
        assert (client.returncode, client.stdout) == (0, b"x" * size)
        assert finish(maker)[0] == 0


def test_worker_command_with_arguments(any_server: ServerProcess) -> None:
    with running(cli_worker(any_server, ["upper"], 1, ["tr", "a-z", "A-Z"])) as worker:
        wait_for_workers(any_server, "upper")
        client = run_client(any_server, "-f", "upper", "shout it")
        assert (client.returncode, client.stdout) == (0, b"SHOUT IT")
        assert finish(worker)[0] == 0


def test_workload_from_stdin(any_server: ServerProcess) -> None:
    # Without a data argument the whole of stdin is one job.
    with running(cli_worker(any_server, ["rev"], 1, ["rev"])) as worker:
        client = run_client(any_server, "-f", "rev", stdin=b"line one\nline two\n")
        assert (client.returncode, client.stdout) == (0, b"eno enil\nowt enil\n")
        assert finish(worker)[0] == 0


def test_send_without_stdin(any_server: ServerProcess) -> None:
    # -s: an empty workload, stdin is not read.
    with running(cli_worker(any_server, ["count"], 1, ["wc", "-c"])) as worker:
        client = run_client(any_server, "-f", "count", "-s", stdin=b"not sent")
        assert (client.returncode, client.stdout) == (0, b"0\n")
        assert finish(worker)[0] == 0


@pytest.mark.parametrize(
    ("flag", "output"),
    [
        ("-n", b"cba\nfed\n"),  # jobs "abc\n" and "def\n"
        ("-N", b"cbafed"),  # jobs "abc" and "def"
    ],
)
def test_one_job_per_line(any_server: ServerProcess, flag: str, output: bytes) -> None:
    # The worker stops after exactly two jobs, so the client must have sent two.
    with running(cli_worker(any_server, ["rev"], 2, ["rev"])) as worker:
        client = run_client(any_server, "-f", "rev", flag, stdin=b"abc\ndef\n")
        assert (client.returncode, client.stdout) == (0, output)
        assert finish(worker)[0] == 0


def test_prefix_output_with_function_name(any_server: ServerProcess) -> None:
    with running(cli_worker(any_server, ["rev"], 1, ["rev"])) as worker:
        client = run_client(any_server, "-f", "rev", "-P", "hello")
        assert (client.returncode, client.stdout) == (0, b"rev: olleh")
        assert finish(worker)[0] == 0


def test_several_functions(any_server: ServerProcess) -> None:
    # A client with two -f sends the data to both; a worker with two -f does both.
    with running(cli_worker(any_server, ["one", "two"], 2, ["cat"])) as worker:
        wait_for_workers(any_server, "one")
        wait_for_workers(any_server, "two")
        client = run_client(any_server, "-f", "one", "-f", "two", "-P", "same\n")
        assert client.returncode == 0
        assert sorted(client.stdout.splitlines()) == [b"one: same", b"two: same"]
        assert finish(worker)[0] == 0


def test_worker_without_command(any_server: ServerProcess) -> None:
    # With no command the worker prints the workload itself and returns an empty result.
    with running(cli_worker(any_server, ["sink"], 1, [])) as worker:
        client = run_client(any_server, "-f", "sink", "payload")
        assert (client.returncode, client.stdout) == (0, b"")
        code, out, _ = finish(worker)
        assert (code, out) == (0, b"payload")


def test_failing_command_fails_the_job(any_server: ServerProcess) -> None:
    with running(cli_worker(any_server, ["bad"], 1, ["false"])) as worker:
        client = run_client(any_server, "-f", "bad", "x")
        assert (client.returncode, client.stdout, client.stderr) == (1, b"", b"Job failed\n")
        finish(worker)


def test_worker_sends_data_per_line(any_server: ServerProcess) -> None:
    """Worker -n: a WORK_DATA packet per output line, observed by a raw client.

    The 1.1.20 CLI never clears its line buffer, so each packet repeats all lines so far, and
    WORK_COMPLETE is then empty. The server must relay every packet verbatim and in order.
    """
    with running(cli_worker(any_server, ["lines"], 1, ["cat"], ("-n",))) as worker:
        with GearmanSocket(any_server) as client:
            handle = client.submit_fg("lines", b"l1\nl2\nl3").encode()
            packets = client.results_until_done()
        assert [(p.type, p.args) for p in packets] == [
            (Cmd.WORK_DATA, (handle, b"l1\n")),
            (Cmd.WORK_DATA, (handle, b"l1\nl2\n")),
            (Cmd.WORK_DATA, (handle, b"l1\nl2\nl3")),
            (Cmd.WORK_COMPLETE, (handle, b"")),
        ]
        assert finish(worker)[0] == 0


def test_background_jobs(any_server: ServerProcess, tmp_path: Path) -> None:
    for i in range(3):
        client = run_client(any_server, "-b", "-f", "bg", f"job-{i}")
        # -b prints nothing and returns once the server has created the job.
        assert (client.returncode, client.stdout, client.stderr) == (0, b"", b"")
    assert status(any_server)["bg"] == (3, 0, 0)
    assert len(list_lines(admin(any_server, "show jobs"))) == 3

    log = tmp_path / "done"
    with running(cli_worker(any_server, ["bg"], 3, recorder(log))) as worker:
        assert finish(worker)[0] == 0
    assert recorded(log) == ["job-0", "job-1", "job-2"]
    wait_for_status(any_server, "bg", lambda row: row[0] == 0, "queue drained")


def test_background_priorities(any_server: ServerProcess, tmp_path: Path) -> None:
    for flags, data in [(["-L"], "low"), ([], "normal"), (["-I"], "high")]:
        assert run_client(any_server, "-b", *flags, "-f", "prio", data).returncode == 0
    assert priority_status(any_server)["prio"] == (1, 1, 1, 0)

    log = tmp_path / "done"
    with running(cli_worker(any_server, ["prio"], 3, recorder(log))) as worker:
        assert finish(worker)[0] == 0
    assert recorded(log) == ["high", "normal", "low"]


def test_foreground_priorities(any_server: ServerProcess, tmp_path: Path) -> None:
    # Queue three waiting clients, low first, each confirmed in `prioritystatus` (HIGH, NORMAL,
    # LOW, WORKERS) before the next starts; then one worker serves them by priority.
    clients: dict[str, subprocess.Popen[bytes]] = {}
    for flags, data, want in [
        (["-L"], "low", (0, 0, 1, 0)),
        ([], "normal", (0, 1, 1, 0)),
        (["-I"], "high", (1, 1, 1, 0)),
    ]:
        clients[data] = spawn(any_server, *flags, "-f", "prio", data)
        wait_for_priority_status(any_server, "prio", want)
    log = tmp_path / "done"
    with (
        running(clients["low"]),
        running(clients["normal"]),
        running(clients["high"]),
        running(cli_worker(any_server, ["prio"], 3, recorder(log))) as worker,
    ):
        assert finish(worker)[0] == 0
        for data, proc in clients.items():
            assert finish(proc)[:2] == (0, data.encode())
    assert recorded(log) == ["high", "normal", "low"]


def test_background_unique_coalesces(any_server: ServerProcess, tmp_path: Path) -> None:
    for unique, data in [("same", "first"), ("same", "second"), ("other", "third")]:
        assert run_client(any_server, "-b", "-u", unique, "-f", "uq", data).returncode == 0
    assert sorted(list_lines(admin(any_server, "show unique jobs"))) == ["other", "same"]
    assert status(any_server)["uq"] == (2, 0, 0)

    log = tmp_path / "done"
    with running(cli_worker(any_server, ["uq"], 2, recorder(log))) as worker:
        assert finish(worker)[0] == 0
    assert recorded(log) == ["first", "third"]


def test_foreground_unique_coalesces(any_server: ServerProcess) -> None:
    # Two waiting clients with the same -u share one job and both get its result. The number of
    # clients waiting on the job is read with GET_STATUS_UNIQUE (its last field).
    with GearmanSocket(any_server) as probe, ExitStack() as stack:
        first = stack.enter_context(
            running(spawn(any_server, "-u", "shared", "-f", "rev", "first"))
        )
        wait_until(lambda: probe.status_unique("shared")[2] == 1, "first client queued")
        second = stack.enter_context(
            running(spawn(any_server, "-u", "shared", "-f", "rev", "second"))
        )
        wait_until(lambda: probe.status_unique("shared")[2] == 2, "second client joined")
        # One job only: a worker that stops after one job serves both clients.
        worker = stack.enter_context(running(cli_worker(any_server, ["rev"], 1, ["rev"])))
        assert finish(worker)[0] == 0
        assert finish(first)[:2] == (0, b"tsrif")
        assert finish(second)[:2] == (0, b"tsrif")
