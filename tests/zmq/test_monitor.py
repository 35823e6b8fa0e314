"""ZeroMQ connections by listener in `jobwire_connections`, from libzmq's socket monitor:
real pyzmq peers connect to each ROUTER and go away, and /metrics follows."""

from __future__ import annotations

import re

import zmq
from tests.server.dashboard_support import Browser, wait_until
from tests.servers import free_port, start_jobwire
from tests.zmq.support import zmq_peers


def connections(browser: Browser) -> dict[str, float]:
    text = browser.get("/metrics").text
    return {
        name: float(value)
        for name, value in re.findall(
            r'^jobwire_connections\{listener="([^"]+)"\} (\S+)$', text, re.M
        )
    }


def shows(browser: Browser, wanted: dict[str, float]) -> None:
    def probe() -> bool | None:
        seen = connections(browser)
        return all(seen.get(name) == count for name, count in wanted.items()) or None

    wait_until(probe, f"connections {wanted}")


def test_connections_to_each_zeromq_listener_are_counted() -> None:
    front, back, wmp = (f"tcp://127.0.0.1:{free_port()}" for _ in range(3))
    lance = free_port()
    server = start_jobwire(
        [
            "--ppp-frontend",
            front,
            "--ppp-backend",
            back,
            "--freelance-port",
            str(lance),
            "--wmp-port",
            wmp.rsplit(":", 1)[1],
        ],
        http=True,
        zmq=True,
    )
    try:
        assert server.http_port is not None
        browser = Browser(server.http_port)
        shows(browser, {"majordomo": 0, "ppp": 0, "freelance": 0, "wmp": 0})
        with zmq_peers(server) as peers:
            mdp_peers = [peers.peer(zmq.DEALER) for _ in range(3)]
            peers.peer(zmq.DEALER, front)
            peers.peer(zmq.DEALER, back)
            peers.peer(zmq.DEALER, f"tcp://127.0.0.1:{lance}")
            shows(browser, {"majordomo": 3, "ppp": 2, "freelance": 1, "wmp": 0})
            mdp_peers[0].close()
            shows(browser, {"majordomo": 2, "ppp": 2, "freelance": 1})
            peers.peer(zmq.DEALER, wmp)
            shows(browser, {"majordomo": 2, "wmp": 1})
        # Every peer closed with its context: each listener is back to none.
        shows(browser, {"majordomo": 0, "ppp": 0, "freelance": 0, "wmp": 0})
        assert 'jobwire_connections{listener="gearman"}' in browser.get("/metrics").text
    finally:
        assert server.stop() == 0, server.log()
