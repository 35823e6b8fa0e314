"""`jobwire_errors_total{kind=...}` counts the errors of every listener, provoked here through
the real wire protocols against a real server: Gearman ERROR packets by code, `/work`
sockets closed for bad input, ZeroMQ messages dropped and DISCONNECTs sent."""

from __future__ import annotations

import asyncio
import re

import aiohttp

import zmq
from jobwire.protocols.zmq import mdp
from jobwire.protocols.zmq.mdp import Version
from tests.interop.gearman_raw import Cmd, GearmanSocket
from tests.server.dashboard_support import Browser, wait_until
from tests.servers import ServerProcess, free_port, start_jobwire
from tests.zmq.support import DEADLINE, zmq_peers


def errors(browser: Browser) -> dict[str, float]:
    text = browser.get("/metrics").text
    return {
        kind: float(value)
        for kind, value in re.findall(r'^jobwire_errors_total\{kind="([^"]+)"\} (\S+)$', text, re.M)
    }


def counted(browser: Browser, kind: str, count: float) -> None:
    """Wait until /metrics shows `count` errors of `kind` (the server may still be at it)."""
    wait_until(lambda: errors(browser).get(kind) == count or None, f"{count} {kind} errors")


def start() -> tuple[ServerProcess, dict[str, str]]:
    endpoints = {
        name: f"tcp://127.0.0.1:{free_port()}" for name in ("ppp_front", "ppp_back", "wmp")
    }
    freelance_port = free_port()
    endpoints["freelance"] = f"tcp://127.0.0.1:{freelance_port}"
    server = start_jobwire(
        [
            "--ppp-frontend",
            endpoints["ppp_front"],
            "--ppp-backend",
            endpoints["ppp_back"],
            "--freelance-port",
            str(freelance_port),
            "--wmp-port",
            endpoints["wmp"].rsplit(":", 1)[1],
            "--mdp-heartbeat",
            "10",
        ],
        http=True,
        zmq=True,
    )
    return server, endpoints


def test_gearman_error_packets_are_counted_by_code() -> None:
    server, _ = start()
    try:
        assert server.http_port is not None
        browser = Browser(server.http_port)
        with GearmanSocket(server) as gearman:
            for _ in range(2):
                gearman.send(Cmd.WORK_COMPLETE, "H:nobody:1", "x")
                reply = gearman.expect(Cmd.ERROR)
                assert reply.args[0] == b"JOB_NOT_FOUND"
            gearman.send(Cmd.OPTION_REQ, "no-such-option")
            assert gearman.expect(Cmd.ERROR).args[0] == b"UNKNOWN_OPTION"
        counted(browser, "gearman_job_not_found", 2.0)
        counted(browser, "gearman_unknown_option", 1.0)
    finally:
        assert server.stop() == 0, server.log()


def test_websocket_closes_for_bad_input_are_counted() -> None:
    server, _ = start()

    async def send_bad(frame: str | bytes) -> int | None:
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{server.http_port}/work"
            async with session.ws_connect(url, autoclose=False) as ws:
                if isinstance(frame, bytes):
                    await ws.send_bytes(frame)
                else:
                    await ws.send_str(frame)
                while True:  # the error message, then the close
                    msg = await ws.receive(timeout=DEADLINE)
                    if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED):
                        return ws.close_code

    try:
        assert server.http_port is not None
        browser = Browser(server.http_port)
        assert asyncio.run(send_bad("{not json")) == 1007
        assert asyncio.run(send_bad(b"{}")) == 1003
        counted(browser, "ws_malformed_json", 1.0)
        counted(browser, "ws_binary_message", 1.0)
    finally:
        assert server.stop() == 0, server.log()


def test_zeromq_messages_dropped_and_disconnects_sent_are_counted() -> None:
    server, endpoints = start()
    try:
        assert server.http_port is not None
        browser = Browser(server.http_port)
        with zmq_peers(server) as peers:
            # Majordomo: a message that is not MDP is dropped; a HEARTBEAT from a worker that
            # never said READY is answered DISCONNECT.
            peers.peer(zmq.DEALER).send([b"", b"not-mdp"])
            stranger = peers.peer(zmq.DEALER)
            stranger.send(mdp.heartbeat(Version.V1))
            reply = mdp.decode_for_worker(stranger.recv())
            assert isinstance(reply, mdp.Disconnect)
            # Paranoid Pirate (both sides), Freelance and WMP: invalid messages dropped.
            peers.peer(zmq.DEALER, endpoints["ppp_back"]).send([b"\x09", b"junk"])
            peers.peer(zmq.DEALER, endpoints["ppp_front"]).send([b"no-delimiter"])
            peers.peer(zmq.DEALER, endpoints["freelance"]).send([b"", b"\xff"])
            peers.peer(zmq.DEALER, endpoints["wmp"]).send([b"", b"not wmp"])
            counted(browser, "mdp_invalid", 1.0)
            counted(browser, "mdp_disconnect", 1.0)
            counted(browser, "ppp_invalid", 2.0)
            counted(browser, "freelance_invalid", 1.0)
            counted(browser, "wmp_invalid", 1.0)
    finally:
        assert server.stop() == 0, server.log()
