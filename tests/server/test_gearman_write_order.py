"""The order in which a loop turn's replies reach the sockets.

Replies are batched per connection and written at the end of the turn, except NOOP and
NO_JOB, which go out at once: what a job waits for (a sleeping worker's wake-up, a result
for its client) must not queue behind the replies that nobody is waiting for.
"""

from __future__ import annotations

import asyncio

from jobwire.engine import Engine, EngineConfig
from jobwire.protocols.gearman.packets import HEADER, NO_JOB, NOOP, encode, encode_request
from jobwire.protocols.gearman.packets import PacketType as T
from jobwire.server.gearman import GearmanConnection, GearmanOptions, GearmanServer
from jobwire.server.runtime import Runtime


class LoggingTransport:
    """Writes go to one log shared by every connection, tagged with the connection's name."""

    def __init__(self, name: str, log: list[tuple[str, bytes]]) -> None:
        self.name = name
        self.log = log

    def write(self, data: bytes) -> None:
        self.log.append((self.name, bytes(data)))

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str) -> None:
        return None


def created(handle: bytes) -> bytes:
    return HEADER.pack(b"\0RES", T.JOB_CREATED, len(handle)) + handle


def connect(*names: str) -> tuple[list[tuple[str, bytes]], list[GearmanConnection]]:
    """Connections to one new server (on the running loop), in the order named, whose
    writes all go to the returned log."""
    engine = Engine(EngineConfig(handle_prefix="H"))
    server = GearmanServer(Runtime(engine, asyncio.get_running_loop()), GearmanOptions())
    log: list[tuple[str, bytes]] = []
    conns = []
    for name in names:
        conn = server.protocol_factory()
        conn.connection_made(LoggingTransport(name, log))  # type: ignore[arg-type]
        conns.append(conn)
    return log, conns


def test_a_sleeping_worker_is_woken_before_the_submit_is_answered() -> None:
    async def main() -> list[tuple[str, bytes]]:
        log, (worker, client) = connect("worker", "client")
        worker.data_received(
            encode_request(T.CAN_DO, b"f")
            + encode_request(T.GRAB_JOB)
            + encode_request(T.PRE_SLEEP)
        )
        await asyncio.sleep(0)
        client.data_received(encode_request(T.SUBMIT_JOB, b"f", b"", b"x"))
        await asyncio.sleep(0)
        return log

    assert asyncio.run(main()) == [
        ("worker", NO_JOB),
        ("worker", NOOP),  # written while the submit is handled
        ("client", created(b"H:1")),  # at the end of the turn
    ]


def test_a_result_goes_out_with_the_replies_batched_in_its_turn() -> None:
    """A client's JOB_CREATED waits for the end of the turn, and leaves with the result of a
    job that finished in the same turn: one write."""

    async def main() -> list[tuple[str, bytes]]:
        log, (client, worker) = connect("client", "worker")
        client.data_received(encode_request(T.SUBMIT_JOB, b"f", b"", b"x"))
        worker.data_received(encode_request(T.CAN_DO, b"f") + encode_request(T.GRAB_JOB))
        await asyncio.sleep(0)
        del log[:]
        client.data_received(encode_request(T.SUBMIT_JOB, b"f", b"", b"y"))
        worker.data_received(
            encode_request(T.WORK_COMPLETE, b"H:1", b"done") + encode_request(T.GRAB_JOB)
        )
        await asyncio.sleep(0)
        return log

    log = asyncio.run(main())
    result = encode(T.WORK_COMPLETE, b"H:1", b"done")
    assign = encode(T.JOB_ASSIGN, b"H:2", b"f", b"y")
    assert log == [("client", created(b"H:2") + result), ("worker", assign)]
