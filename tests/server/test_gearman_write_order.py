"""The order in which a loop turn's replies reach the sockets.

Replies are batched per connection and written at the end of the turn, except NOOP and
NO_JOB, which go out at once: what a job waits for (a sleeping worker's wake-up, a result
for its client) must not queue behind the replies that nobody is waiting for. A read whose
replies are all for its own connection, in a turn where no other connection waits for the
end, is answered at the end of the read: there is nothing to batch it with.
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
    engine = Engine(EngineConfig(id_prefix="H"))
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
        ("client", created(b"H:1")),  # after it
    ]


def test_a_result_goes_out_with_the_replies_batched_in_its_turn() -> None:
    """A read that made events for another connection waits for the end of the turn; a
    client's JOB_CREATED of that turn leaves with the result: one write."""

    async def main() -> list[tuple[str, bytes]]:
        log, (client, worker) = connect("client", "worker")
        client.data_received(encode_request(T.SUBMIT_JOB, b"f", b"", b"x"))
        worker.data_received(encode_request(T.CAN_DO, b"f") + encode_request(T.GRAB_JOB))
        await asyncio.sleep(0)
        del log[:]
        worker.data_received(
            encode_request(T.WORK_COMPLETE, b"H:1", b"done") + encode_request(T.GRAB_JOB)
        )
        client.data_received(encode_request(T.SUBMIT_JOB, b"f", b"", b"y"))
        await asyncio.sleep(0)
        return log

    log = asyncio.run(main())
    result = encode(T.WORK_COMPLETE, b"H:1", b"done")
    assert log == [("worker", NO_JOB), ("client", result + created(b"H:2"))]


def test_a_read_alone_in_its_turn_is_answered_before_the_turn_ends() -> None:
    """Nothing else is batched in the turn: the JOB_CREATED and the JOB_ASSIGN of a serial
    round trip are written by the reads themselves, not a loop pass later."""

    async def main() -> None:
        log, (client, worker) = connect("client", "worker")
        worker.data_received(encode_request(T.CAN_DO, b"f"))
        client.data_received(encode_request(T.SUBMIT_JOB, b"f", b"", b"x"))
        assert log == [("client", created(b"H:1"))]  # no loop turn has passed
        worker.data_received(encode_request(T.GRAB_JOB))
        assert log[1:] == [("worker", encode(T.JOB_ASSIGN, b"H:1", b"f", b"x"))]
        # A read that makes an event for another connection still waits for the turn's end.
        worker.data_received(encode_request(T.WORK_COMPLETE, b"H:1", b"done"))
        assert log[2:] == []
        await asyncio.sleep(0)
        assert log[2:] == [("client", encode(T.WORK_COMPLETE, b"H:1", b"done"))]

    asyncio.run(main())
