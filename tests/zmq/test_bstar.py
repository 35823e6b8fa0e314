"""Binary Star through real processes: the passive server serves nobody on any listener,
a killed primary fails over to the backup on the first client that asks, a restarted
primary comes back passive, and two actives stop the server loudly."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from jobwire.sdk import Client
from tests.ojs.dsl import Runner
from tests.servers import ServerProcess, free_port, start_jobwire
from tests.zmq.support import DEADLINE, wait_until

# The Guide's interval: a peer is dead after two silent beats (2 s). Shorter beats make a
# busy machine's scheduling hiccup look like a dead peer, and a client's vote then makes two
# actives, which is fatal by design.
BEAT = "1.0"


@pytest.fixture
def servers() -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    yield started
    for server in started:
        server.kill()


def start(
    servers: list[ServerProcess], role: str, local: int, remote: int, port: int | None = None
) -> ServerProcess:
    args = ["--bstar", role, "--bstar-heartbeat", BEAT, "--verbose", "INFO"]
    args += ["--bstar-local", f"tcp://127.0.0.1:{local}"]
    args += ["--bstar-remote", f"tcp://127.0.0.1:{remote}"]
    server = start_jobwire(args, port=port, http=True)
    servers.append(server)
    return server


def serves(server: ServerProcess) -> bool:
    """Does the server answer a Gearman ECHO? (Asking is a client's vote.)"""
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(b"\0REQ" + (16).to_bytes(4, "big") + (2).to_bytes(4, "big") + b"hi")
            return sock.recv(64).endswith(b"hi")
    except OSError:
        return False


def role(server: ServerProcess) -> str | None:
    """The Binary Star state a refusing server reports (None while it serves)."""
    refused = Runner(f"http://127.0.0.1:{server.http_port}").request("GET", "/ojs/v1/health")
    if refused.status != 503:
        return None
    state: str = refused.body["error"]["details"]["binary_star"]
    return state


def test_the_passive_refuses_every_listener_and_failover_follows_a_kill(
    servers: list[ServerProcess],
) -> None:
    one, two = free_port(), free_port()
    primary = start(servers, "primary", one, two)
    backup = start(servers, "backup", two, one)
    wait_until(lambda: serves(primary), "the primary serves")
    assert not serves(backup)
    refused = Runner(f"http://127.0.0.1:{backup.http_port}").request("GET", "/ojs/v1/health")
    assert refused.status == 503 and refused.headers["retry-after"] == "1"
    assert refused.body["error"]["code"] == "backend_error"
    # A backup that never heard the primary active never takes over (the Guide's rule):
    # wait until it is passive, which its refusals say.
    wait_until(lambda: role(backup) == "passive", "the backup is passive")

    with Client(
        [primary.address, backup.address], retries=200, backoff=0.02, backoff_cap=0.1
    ) as client:
        assert client.submit_background("nobody-runs-this", b"")
        primary.kill()
        killed = time.monotonic()
        handle = client.submit_background("after-failover", b"")
        resumed = time.monotonic() - killed
    assert handle
    # Reported, not asserted: the pair's target is under 3 s with 1 s beats.
    print(f"\nbinary star: service resumed on the backup {resumed:.2f} s after the kill")
    assert serves(backup)
    restarted = start(servers, "primary", one, two, port=primary.port)
    wait_until(lambda: role(restarted) == "passive", "the restarted primary is passive")
    assert not serves(restarted)
    assert serves(backup)


def test_dual_actives_stop_the_server_loudly(servers: list[ServerProcess]) -> None:
    one, two, nowhere = free_port(), free_port(), free_port()
    first = start(servers, "primary", one, two)
    wait_until(lambda: serves(first), "the first primary serves")
    # A second primary that cannot hear the first (its remote is wrong) becomes active on a
    # client's vote; the first then hears two actives.
    second = start(servers, "primary", two, nowhere)
    wait_until(lambda: serves(second), "the second primary serves")
    end = time.monotonic() + DEADLINE
    while first.proc.poll() is None and time.monotonic() < end:
        time.sleep(0.02)
    assert first.proc.returncode not in (None, 0)
    assert "dual actives" in first.log()


def test_junk_on_the_state_channel_is_ignored(servers: list[ServerProcess]) -> None:
    """Bad input on the Binary Star endpoint: a peer that publishes anything but a state
    digit is ignored (logged), and the server goes on as if it had heard nothing."""
    import zmq

    remote = free_port()
    context = zmq.Context()
    rogue = context.socket(zmq.PUB)
    rogue.setsockopt(zmq.LINGER, 0)
    rogue.bind(f"tcp://127.0.0.1:{remote}")
    try:
        server = start(servers, "primary", free_port(), remote)
        end = time.monotonic() + DEADLINE
        while time.monotonic() < end and "ignored" not in server.log():
            for junk in (b"", b"9", b"active", b"\x00" * 64):
                rogue.send(junk)
            time.sleep(0.05)
        assert "ignored" in server.log()
        wait_until(lambda: serves(server), "it serves as a primary without a peer")
        assert server.proc.poll() is None
    finally:
        rogue.close()
        context.term()
