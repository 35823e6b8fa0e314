"""The ZeroMQ listeners' start and stop (server/zmq/server.py)."""

from __future__ import annotations

import socket
import subprocess
import sys

from tests.servers import free_port

DEADLINE = 60.0


def test_a_zeromq_port_in_use_stops_the_start_with_why() -> None:
    """Several servers on one machine with the default ZeroMQ port: the second must say
    why it cannot start. It hung instead, waiting for a socket its failed start left open."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        serve = [sys.executable, "-m", "jobwire", "serve", "--store", "memory"]
        serve += ["--http-port", "0", "--port", str(free_port()), "--zmq-port", str(port)]
        done = subprocess.run(
            serve,
            capture_output=True,
            text=True,
            timeout=DEADLINE,
        )
    assert done.returncode == 1, done.stderr
    assert "cannot listen for ZeroMQ: Address already in use" in done.stderr, done.stderr
