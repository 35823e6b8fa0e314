"""`jobwire submit`, `jobwire status` and `jobwire worker` argument handling."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from jobwire import Client
from jobwire.cli import main
from jobwire.sdk.cli import format_table
from tests.interop.gearman_raw import priority_status
from tests.sdk.support import REPO, child_env
from tests.servers import ServerProcess


def run(*args: str, input: bytes | None = None) -> tuple[int, bytes, str]:
    result = CliRunner().invoke(main, list(args), input=input)
    return result.exit_code, result.stdout_bytes, result.stderr


def test_submit_prints_the_result_bytes(served: ServerProcess) -> None:
    assert run("submit", "reverse", "hello", "--server", served.address) == (0, b"olleh", "")
    code, out, _ = run("submit", "echo", "--server", served.address, input=b"\x00\xffstdin")
    assert (code, out) == (0, b"\x00\xffstdin")


def test_submit_as_a_process_reads_stdin(served: ServerProcess) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "jobwire", "submit", "echo", "--server", served.address],
        input=b"raw\nbytes\x00",
        capture_output=True,
        cwd=REPO,
        env=child_env(),
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (0, b"raw\nbytes\x00"), done.stderr


def test_submit_background_prints_the_handle(served: ServerProcess) -> None:
    code, out, _ = run(
        "submit", "-b", "--priority", "low", "--unique", "cli-k", "nobody-cli", "x",
        "--server", served.address,
    )  # fmt: skip
    assert code == 0 and out.startswith(b"H:") and out.endswith(b"\n")
    assert priority_status(served)["nobody-cli"][:3] == (0, 0, 1)
    with Client([served.address]) as client:
        assert client.status(out.decode().strip()).known
        assert client.status_unique("cli-k").known


def test_submit_reports_a_failed_job(served: ServerProcess) -> None:
    code, out, err = run("submit", "raise", "oops", "--server", served.address)
    assert (code, out) == (1, b"")
    assert "ValueError: bad input: oops" in err


def test_submit_with_no_server() -> None:
    code, _, err = run("submit", "echo", "x", "--server", "127.0.0.1:1", "--timeout", "5")
    assert code == 1 and "gave up" in err


def test_status_table(served: ServerProcess) -> None:
    code, out, _ = run("status", "--server", served.address)
    assert code == 0
    lines = out.decode().splitlines()
    assert lines[0] == f"== {served.address}"
    assert lines[1].split() == ["FUNCTION", "TOTAL", "RUNNING", "WORKERS"]
    assert ["echo", "0", "0", "1"] in [line.split() for line in lines]
    header = next(line for line in lines if line.startswith("FD"))
    assert header.split() == ["FD", "IP", "CLIENT-ID", "FUNCTIONS"]
    worker_line = lines[lines.index(header) + 1]
    assert "echo" in worker_line.split() and "127.0.0.1" in worker_line


def test_status_of_a_dead_server() -> None:
    code, _, err = run("status", "--server", "127.0.0.1:1")
    assert code == 1 and "error:" in err


def test_format_table_aligns_columns() -> None:
    table = format_table(["NAME", "N"], [("a", 1), ("long-name", 200)])
    assert table.splitlines() == ["NAME         N", "a            1", "long-name  200"]


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_colon", "expected MODULE:ATTR"),
        ("tests.sdk.no_such_module:worker", "cannot import"),
        ("tests.sdk.fixtures_tasks:nothing", "has no attribute"),
        ("tests.sdk.fixtures_tasks:echo", "not a jobwire Worker"),
    ],
)
def test_worker_target_errors(target: str, message: str) -> None:
    code, _, err = run("worker", target)
    assert code == 2 and message in err


def test_a_handle_prefix_that_would_make_handles_over_64_bytes_is_refused() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "jobwire", "serve", "--job-handle-prefix", "x" * 45],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1  # gearmand's exit code for a bad argument
    assert "--job-handle-prefix" in result.stderr and "64 bytes" in result.stderr


def run_in_terminal(args: list[str]) -> tuple[int, bytes]:
    """`jobwire ARGS` with stdout on a pseudo-terminal: its exit status and what it wrote."""
    import os
    import pty

    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobwire", *args],
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env={**child_env(), "COLUMNS": "80", "TERM": "xterm"},
    )
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else b""
    return proc.returncode, out


def test_submit_shows_work_status_as_a_progress_bar_on_a_terminal(
    served: ServerProcess,
) -> None:
    """Promise: on a terminal, a foreground job's WORK_STATUS updates draw a progress bar
    (its last state, 3 of 3, stays) before the result; piped, the output is the result only."""
    _, out = run_in_terminal(["submit", "updates", "x", "--server", served.address])
    text = out.decode(errors="replace")
    assert "updates" in text and "3/3" in text and "100%" in text, text
    assert text.rstrip().endswith("done"), text
    assert run("submit", "updates", "x", "--server", served.address) == (0, b"done", "")
