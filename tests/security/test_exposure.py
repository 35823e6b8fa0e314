"""Without --auth: the server says so at start, and will not listen beyond this machine
unless --insecure says it may; a bad --auth file stops the start with why."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.servers import ServerProcess, free_port, start_jobwire

DEADLINE = 30.0
SERVE = [sys.executable, "-m", "jobwire", "serve", "--store", "memory", "--http-port", "0",
         "--zmq-port", "0"]  # fmt: skip


def test_without_auth_the_start_says_so(tmp_path: Path) -> None:
    server = start_jobwire(workdir=tmp_path)
    try:
        end = time.monotonic() + DEADLINE
        while "without authentication" not in server.log():
            assert time.monotonic() < end, server.log()
            time.sleep(0.02)
    finally:
        assert server.stop() == 0


def test_a_non_loopback_address_without_auth_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [*SERVE, "--listen", "0.0.0.0", "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        cwd=tmp_path,
    )
    assert done.returncode != 0
    assert "refusing to listen on 0.0.0.0 without authentication" in done.stderr


def start_on_any_address(args: list[str], tmp_path: Path) -> ServerProcess:
    """`free_port` checks 127.0.0.1 only: another process may hold the port on another
    address. That (and only that) is retried, on another port."""
    for attempt in range(5):
        workdir = tmp_path / f"attempt-{attempt}"
        workdir.mkdir()
        try:
            return start_jobwire(["--listen", "0.0.0.0", *args], workdir=workdir)
        except RuntimeError:
            log = (workdir / "server.log").read_text(errors="replace")
            if "address already in use" not in log.lower():
                raise AssertionError(log) from None
    raise AssertionError("no free port on 0.0.0.0 in five tries")


def test_insecure_allows_a_non_loopback_address(tmp_path: Path) -> None:
    server = start_on_any_address(["--insecure"], tmp_path)
    assert server.stop() == 0


def test_auth_allows_a_non_loopback_address(tmp_path: Path, auth_file: Path) -> None:
    server = start_on_any_address(["--auth", str(auth_file)], tmp_path)
    assert "without authentication" not in server.log()
    assert server.stop() == 0


def test_a_bad_auth_file_stops_the_start(tmp_path: Path) -> None:
    bad = tmp_path / "auth.toml"
    bad.write_text('[principals.x]\ntoken_sha256 = "abc"\nroles = ["client"]\n')
    done = subprocess.run(
        [*SERVE, "--port", str(free_port()), "--auth", str(bad)],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        cwd=tmp_path,
    )
    assert done.returncode != 0 and "64 hex digits" in done.stderr
    bad.write_text('[principals.x]\ntoken_sha256 = "' + "0" * 64 + '"\nroles = ["root"]\n')
    done = subprocess.run(
        [*SERVE, "--port", str(free_port()), "--auth", str(bad)],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        cwd=tmp_path,
    )
    assert done.returncode != 0 and "client, worker, admin" in done.stderr


def test_hash_token_matches_what_the_server_accepts(tmp_path: Path) -> None:
    made = subprocess.run(
        [sys.executable, "-m", "jobwire", "auth", "new-token"],
        capture_output=True, text=True, timeout=DEADLINE, check=True,
    )  # fmt: skip
    token, digest = made.stdout.split()
    hashed = subprocess.run(
        [sys.executable, "-m", "jobwire", "auth", "hash-token"],
        input=token + "\n", capture_output=True, text=True, timeout=DEADLINE, check=True,
    )  # fmt: skip
    assert hashed.stdout.strip() == digest and len(digest) == 64
