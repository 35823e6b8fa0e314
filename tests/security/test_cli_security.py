"""`jobwire submit`, `jobwire worker` and `jobwire status` with --token/$JOBWIRE_TOKEN and
--tls-ca against a server run with --auth and --tls-cert: real processes on both sides."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.security.conftest import TOKENS
from tests.security.http_util import call
from tests.security.pki import PKI
from tests.servers import ServerProcess, start_jobwire

DEADLINE = 60.0


@pytest.fixture(scope="module")
def secured(
    pki: PKI, auth_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    cert, key = pki.server()
    server = start_jobwire(
        ["--auth", str(auth_file), "--tls-cert", str(cert), "--tls-key", str(key)],
        http=True,
        workdir=tmp_path_factory.mktemp("cli-tls"),
    )
    yield server
    assert server.stop() == 0, server.log()


def jobwire(
    *args: str, token: str | None = None, timeout: float = DEADLINE
) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "JOBWIRE_TOKEN"}
    if token is not None:
        env["JOBWIRE_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "jobwire", *args],
        capture_output=True,
        env=env,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def gearman_worker(secured: ServerProcess, pki: PKI) -> Iterator[subprocess.Popen[bytes]]:
    """`jobwire worker` over TLS, its worker token from $JOBWIRE_TOKEN."""
    env = dict(os.environ, JOBWIRE_TOKEN=TOKENS["runner"], PYTHONPATH=os.getcwd())
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "jobwire", "worker", "tests.sdk.fixtures_tasks:worker",
            "--server", secured.address, "--tls-ca", str(pki.ca),
        ],
        env=env,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    yield proc
    proc.terminate()
    proc.wait(timeout=DEADLINE)


def test_submit_and_worker_run_a_job_over_tls_with_tokens(
    secured: ServerProcess, pki: PKI, gearman_worker: subprocess.Popen[bytes]
) -> None:
    done = jobwire(
        "submit", "echo", "over tls", "--server", secured.address,
        "--tls-ca", str(pki.ca), "--token", TOKENS["submitter"],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout == b"over tls"
    # The admin CLI: `jobwire status` with an admin token lists the worker's function.
    status = jobwire(
        "status", "--server", secured.address, "--tls-ca", str(pki.ca),
        token=TOKENS["operator"],
    )  # fmt: skip
    assert status.returncode == 0, status.stderr.decode()
    assert "echo" in status.stdout.decode()


def test_submit_without_a_client_token_is_refused(secured: ServerProcess, pki: PKI) -> None:
    common = ["submit", "echo", "x", "--server", secured.address, "--tls-ca", str(pki.ca)]
    missing = jobwire(*common, "--timeout", "5")
    assert missing.returncode != 0
    wrong_role = jobwire(*common, "--timeout", "5", token=TOKENS["runner"])
    assert wrong_role.returncode != 0
    assert b"over tls" not in wrong_role.stdout
    bad = jobwire(*common, "--token", "not-a-token")
    assert bad.returncode != 0
    assert "refused the token" in bad.stderr.decode()


def test_without_the_ca_the_server_certificate_is_not_trusted(secured: ServerProcess) -> None:
    done = jobwire("submit", "echo", "x", "--server", secured.address, token=TOKENS["submitter"])
    assert done.returncode != 0


def test_tls_cert_needs_tls_key(secured: ServerProcess, pki: PKI) -> None:
    cert, _ = pki.server()
    done = jobwire("submit", "echo", "x", "--server", secured.address, "--tls-cert", str(cert))
    assert done.returncode == 2
    assert "--tls-cert and --tls-key go together" in done.stderr.decode()


def test_an_ojs_worker_process_fetches_over_https_with_its_token(
    secured: ServerProcess, pki: PKI
) -> None:
    base = f"https://127.0.0.1:{secured.http_port}"
    context = ssl.create_default_context(cafile=str(pki.ca))
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    env.pop("JOBWIRE_TOKEN", None)
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "jobwire", "worker", "tests.sdk.fixtures_tasks:worker",
            "--ojs", base, "--queue", "cli-ojs", "--tls-ca", str(pki.ca),
            "--token", TOKENS["runner"],
        ],
        env=env,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        status, _, body = call(
            base + "/ojs/v1/jobs",
            "POST",
            {"type": "echo", "args": ["hi"], "options": {"queue": "cli-ojs"}},
            token=TOKENS["submitter"],
            context=context,
        )
        assert status == 201, body
        job_id = body["job"]["id"]
        end = time.monotonic() + DEADLINE
        while True:
            _, _, job = call(
                base + f"/ojs/v1/jobs/{job_id}", token=TOKENS["submitter"], context=context
            )
            if job["job"]["state"] == "completed":
                break
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < end, job
            time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(timeout=DEADLINE)


def test_worker_state_sends_the_admin_token_over_https(secured: ServerProcess, pki: PKI) -> None:
    url = f"https://127.0.0.1:{secured.http_port}"
    common = ["worker-state", "no-such-worker", "quiet", "--url", url, "--tls-ca", str(pki.ca)]
    anonymous = jobwire(*common)
    assert anonymous.returncode == 1
    assert "401" in anonymous.stderr.decode()
    client = jobwire(*common, token=TOKENS["submitter"])
    assert "403" in client.stderr.decode()
    admin = jobwire(*common, "--token", TOKENS["operator"])
    assert admin.returncode == 1  # past the guard: the server knows no such worker
    assert "401" not in admin.stderr.decode() and "403" not in admin.stderr.decode()
    assert "no-such-worker" in admin.stderr.decode() or "404" in admin.stderr.decode()
