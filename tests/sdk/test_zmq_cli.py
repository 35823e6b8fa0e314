"""`jobwire submit --mdp` and `jobwire worker --mdp`."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from jobwire.cli import main
from jobwire.sdk.zmq import MdpClient, TitanicClient
from tests.interop.gearman_raw import DEADLINE
from tests.sdk.support import REPO, child_env
from tests.sdk.zmq_support import PATIENT, endpoint, fresh_worker, serving, wait_served
from tests.servers import ServerProcess, start_jobwire


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    proc = start_jobwire(["--mdp-heartbeat", "1", "--mdp-request-timeout", "0.3"], zmq=True)
    yield proc
    assert proc.stop() == 0, proc.log()


def run(*args: str, input: bytes | None = None) -> tuple[int, bytes, str]:
    result = CliRunner().invoke(main, list(args), input=input)
    return result.exit_code, result.stdout_bytes, result.stderr


def test_submit_mdp_prints_each_frame_on_a_line(server: ServerProcess) -> None:
    ep = endpoint(server)
    with serving(fresh_worker(server, "upper", "echo", "raise", version=2)):
        wait_served(server, "upper")
        assert run("submit", "--mdp", "--server", ep, "upper", "hello") == (0, b"HELLO\n", "")
        assert run("submit", "--mdp", "--version", "2", "--server", ep, "upper", "v2")[:2] == (
            0,
            b"V2\n",
        )
        code, out, _ = run("submit", "--mdp", "--server", ep, "echo", input=b"from stdin")
        assert (code, out) == (0, b"from stdin\n")
        code, out, err = run("submit", "--mdp", "--server", ep, "raise", "oops")
        assert (code, out) == (1, b"") and "500 ValueError: bad input: oops" in err
        host_port = ep.removeprefix("tcp://")  # tcp:// may be left out
        code, out, _ = run("submit", "--mdp", "--server", host_port, "mmi.service", "upper")
        assert (code, out) == (0, b"200\n")
        code, out, _ = run("submit", "--mdp", "-b", "--server", ep, "upper", "later")
        assert code == 0 and len(out.strip()) == 32
        with TitanicClient(ep, **PATIENT) as titanic:
            assert titanic.wait(out.strip().decode(), poll=0.05, timeout=30) == [b"LATER"]
    code, _, err = run("submit", "--mdp", "--server", ep, "--unique", "k", "upper", "x")
    assert code == 2 and "Gearman options" in err
    code, _, err = run("submit", "--mdp", "--server", ep, "nobody-cli", "x")
    assert code == 1 and "404" in err


@pytest.mark.parametrize(
    ("target", "service", "reply"),
    [
        ("tests.sdk.fixtures_mdp:worker", "upper", b"PROCESS"),
        # A Gearman Worker's tasks, served over Majordomo.
        ("tests.sdk.fixtures_tasks:worker", "reverse", b"ssecorp"),
    ],
)
def test_worker_mdp_serves_and_stops_on_sigterm(
    server: ServerProcess, target: str, service: str, reply: bytes
) -> None:
    command = [sys.executable, "-m", "jobwire", "worker", target, "--server", endpoint(server)]
    command += ["--mdp", "--version", "2", "--heartbeat", "1", "-c", "2"]
    proc = subprocess.Popen(
        command, cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        wait_served(server, service)
        with MdpClient(endpoint(server), version=2, **PATIENT) as client:
            assert client.request(service, b"process") == [reply]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(DEADLINE) == 0
        wait_served(server, service, served=False)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stdout is not None
    log = proc.stdout.read().decode(errors="replace")
    assert "READY" in log and "stopped" in log


def test_worker_mdp_refuses_what_is_not_a_worker() -> None:
    code, _, err = run("worker", "--mdp", "tests.sdk.fixtures_mdp:POLL")
    assert code == 2 and "not a jobwire worker" in err
    code, _, err = run(
        "worker", "--mdp", "tests.sdk.fixtures_mdp:worker", "--server", "a:1", "--server", "b:2"
    )
    assert code == 2 and "one broker" in err
