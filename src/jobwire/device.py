"""A WMP intermediate device (docs/wmp.md): a worker toward its managers, a manager toward
its workers, and otherwise stateless, so devices chain and many-to-many works.

- Its manager side is a bound ROUTER; its worker side a DEALER connected to each manager.
- READY, HEARTBEAT and DISCONNECT from a worker go to *all* managers (RFC 14: READY is the
  first message of a conversation); the ROUTER's identity of the sender is pushed on the
  envelope, so the managers' replies retrace the path.
- A message coming down from manager link K is sent to the hop on top of its envelope,
  with K added to its `via` header; the worker echoes `via` in its GIVE, DONE and STATUS,
  and each device going up takes its own link off `via` to pick the manager.
- TAKE's explicit `manager` header passes through untouched: the worker learns the end
  manager, whatever the path.

Invalid input: a message that is not WMP is dropped; a WMP message that cannot be routed
(an upward command without `via`, an unknown link) is answered ERROR.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Sequence
from typing import Any

import click

import zmq
from jobwire.protocols.zmq import wmp
from jobwire.protocols.zmq.wmp import WmpError

log = logging.getLogger("jobwire.device")


class Device:
    def __init__(
        self,
        managers: Sequence[str],
        bind: str,
        *,
        context: zmq.Context[Any] | None = None,
    ) -> None:
        if not managers:
            raise ValueError("a device needs at least one manager")
        self.context: zmq.Context[Any] = context or zmq.Context()
        self.frontend: zmq.Socket[Any] = self.context.socket(zmq.ROUTER)
        self.frontend.setsockopt(zmq.LINGER, 0)
        self.frontend.bind(bind)
        self.endpoint = self.frontend.getsockopt_string(zmq.LAST_ENDPOINT)
        self.backends: list[zmq.Socket[Any]] = []
        for endpoint in managers:
            sock: zmq.Socket[Any] = self.context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(endpoint)
            self.backends.append(sock)
        self.stopped = threading.Event()

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.frontend, zmq.POLLIN)
        for sock in self.backends:
            poller.register(sock, zmq.POLLIN)
        index = {sock: k for k, sock in enumerate(self.backends)}
        while not self.stopped.is_set():
            for sock, _ in poller.poll(100):
                while True:
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    try:
                        if sock is self.frontend:
                            self.up(frames[0], frames[1:])
                        else:
                            self.down(index[sock], frames)
                    except Exception:  # one bad message must not stop the device
                        log.exception("forwarding a message failed")
        self.close()

    def up(self, identity: bytes, frames: list[bytes]) -> None:
        """A message from a worker (or a device below): to all managers, or along `via`."""
        try:
            hops, body = wmp.split_envelope(frames)
            message = wmp.decode(body)
            if message.command not in wmp.WORKER_COMMANDS:
                raise WmpError(f"{message.command.decode()} is not sent to a manager")
            envelope = [identity, *hops, b""]
            if message.command in wmp.BROADCAST:
                for sock in self.backends:
                    sock.send_multipart([*envelope, *body], zmq.NOBLOCK)
                return
            link, message = wmp.pop_via(message)
            if link >= len(self.backends):
                raise WmpError(f"via names link {link}, which this device does not have")
            body = wmp.encode(message.command, message.headers, message.payload)
            self.backends[link].send_multipart([*envelope, *body], zmq.NOBLOCK)
        except WmpError as exc:
            if not exc.answerable:
                log.info("dropped a message from %r: %s", identity[:32], exc)
                return
            reply = wmp.encode(wmp.ERROR, {"reason": exc.reason})
            self.frontend.send_multipart([identity, b"", *reply], zmq.NOBLOCK)
        except zmq.Again:
            log.info("a manager link is full: dropped a message")

    def down(self, link: int, frames: list[bytes]) -> None:
        """A message from manager link `link`: to the hop on top of its envelope."""
        try:
            hops, body = wmp.split_envelope(frames)
            if not hops:
                raise WmpError("a message from a manager without a path", answerable=False)
            message = wmp.push_via(wmp.decode(body), link)
        except WmpError as exc:
            log.info("dropped a message from manager link %d: %s", link, exc)
            return
        body = wmp.encode(message.command, message.headers, message.payload)
        try:
            self.frontend.send_multipart([*hops, b"", *body], zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            log.debug("dropped a message to %r: %s", hops[0][:32], exc)

    def stop(self) -> None:
        self.stopped.set()

    def close(self) -> None:
        for sock in (self.frontend, *self.backends):
            sock.close(linger=0)


@click.command("device")
@click.option(
    "--manager",
    "managers",
    multiple=True,
    required=True,
    metavar="ENDPOINT",
    help="A WMP manager (or a device) to connect to; repeat for several.",
)
@click.option("--bind", required=True, metavar="ENDPOINT", help="Where workers connect.")
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="WARNING",
    show_default=True,
)
def device_command(managers: Sequence[str], bind: str, log_level: str) -> None:
    """Run a WMP intermediate device between workers (--bind) and managers (--manager)."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        device = Device(managers, bind)
    except zmq.ZMQError as exc:
        raise click.ClickException(f"cannot bind {bind}: {exc}") from exc
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: device.stop())
    log.warning("WMP device on %s for %s", device.endpoint, ", ".join(managers))
    device.run()
