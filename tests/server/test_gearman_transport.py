"""A Gearman connection's reads and writes (server/gearman/transport.py).

However a stream is cut into reads, and whether each read has a loop turn of its own, a
connection writes the same bytes and leaves the engine in the same state as when the whole
stream arrives in one read; and each turn ends with the writes it queued.
"""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from jobwire.engine import Engine, EngineConfig
from jobwire.protocols.gearman.packets import HEADER, encode_request
from jobwire.protocols.gearman.packets import PacketType as T
from jobwire.server.gearman import GearmanConnection, GearmanOptions, GearmanServer
from jobwire.server.runtime import Runtime

MAX_PACKET = 256  # small, so that oversized packets are cheap to generate


class RecordingTransport:
    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.data += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str) -> None:
        return None


def handle(n: int) -> bytes:
    return f"H:{n}".encode()


def run(
    stream: bytes, cuts: list[int], turns: bool = False
) -> tuple[bytes, bool, list[tuple[str, str]]]:
    """Feed `stream` cut at `cuts`; with `turns`, each read in a loop turn of its own, after
    which nothing may be left unwritten (each turn ends with the writes it queued)."""

    async def main() -> tuple[bytes, bool, list[tuple[str, str]]]:
        engine = Engine(EngineConfig(id_prefix="H"), clock=lambda: 1000.0)
        options = GearmanOptions(max_packet=MAX_PACKET)
        server = GearmanServer(Runtime(engine, asyncio.get_running_loop()), options)
        conn = server.protocol_factory()
        transport = RecordingTransport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        start = 0
        for cut in [*sorted(cuts), len(stream)]:
            if cut > start and not transport.closed:
                conn.data_received(stream[start:cut])
                start = cut
                if turns:
                    await asyncio.sleep(0)  # the end of this read's turn
                    assert transport.closed or not conn.out, "output left unscheduled"
        await asyncio.sleep(0)  # end-of-turn flushes
        jobs = sorted((job.id, job.state.name) for job in engine.jobs.values())
        return bytes(transport.data), transport.closed, jobs

    return asyncio.run(main())


names = st.sampled_from([b"f", b"f", b"f", b"g"])
payloads = st.binary(max_size=12)
submit_types = st.sampled_from(
    [
        T.SUBMIT_JOB,
        T.SUBMIT_JOB_BG,
        T.SUBMIT_JOB_HIGH,
        T.SUBMIT_JOB_HIGH_BG,
        T.SUBMIT_JOB_LOW,
        T.SUBMIT_JOB_LOW_BG,
    ]
)
requests = st.one_of(
    st.builds(lambda t, f, p: encode_request(t, f, b"", p), submit_types, names, payloads),
    st.builds(encode_request, submit_types, names, st.sampled_from([b"u", b"v"]), payloads),
    st.builds(encode_request, st.sampled_from([T.GRAB_JOB, T.GRAB_JOB_UNIQ, T.GRAB_JOB_ALL])),
    st.just(encode_request(T.PRE_SLEEP)),
    st.builds(
        lambda n, r: encode_request(T.WORK_COMPLETE, handle(n), r), st.integers(0, 6), payloads
    ),
    st.builds(lambda n: encode_request(T.WORK_FAIL, handle(n)), st.integers(0, 6)),
    st.builds(lambda f: encode_request(T.CAN_DO, f), names),
    st.just(encode_request(T.ECHO_REQ, b"ping")),
    st.just(b"status\n"),
)
#: Input that ends the connection; at most one, at the end, so that most streams run long.
fatal = st.sampled_from(
    [
        b"",
        HEADER.pack(b"\0REQ", T.SUBMIT_JOB_BG, MAX_PACKET + 1),
        b"\0XYZ" + bytes(8),
        HEADER.pack(b"\0REQ", 99, 0),
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(requests, min_size=6, max_size=40),
    fatal,
    st.lists(st.integers(0, 2000), max_size=8),
    st.booleans(),
)
def test_a_stream_cut_anywhere_is_answered_as_one_read(
    packets: list[bytes], last: bytes, cuts: list[int], turns: bool
) -> None:
    # Most streams start as a worker's do, so that grabs find work.
    stream = encode_request(T.CAN_DO, b"f") + b"".join(packets) + last
    cuts = [cut for cut in cuts if cut < len(stream)]
    assert run(stream, cuts, turns=turns) == run(stream, [])


def test_every_common_packet_cut_anywhere() -> None:
    """Each submit type twice (priorities interleaved), then grab and complete them all;
    a unique id joins a job already queued."""
    stream = encode_request(T.CAN_DO, b"f")
    for n, ptype in enumerate(
        [T.SUBMIT_JOB_LOW_BG, T.SUBMIT_JOB, T.SUBMIT_JOB_HIGH, T.SUBMIT_JOB_BG]
        + [T.SUBMIT_JOB_LOW, T.SUBMIT_JOB_HIGH_BG] * 2
    ):
        stream += encode_request(ptype, b"f", b"", b"job %d" % n)
    stream += encode_request(T.SUBMIT_JOB_BG, b"f", b"u", b"x")  # H:9
    stream += encode_request(T.SUBMIT_JOB, b"f", b"u", b"y")  # joins H:9
    stream += encode_request(T.PRE_SLEEP)
    for n in [3, 6, 8, 2, 4, 9, 1, 5, 7]:  # the order grabs hand them out: priority, then age
        stream += encode_request(T.GRAB_JOB if n % 2 else T.GRAB_JOB_UNIQ)
        stream += encode_request(T.WORK_COMPLETE, handle(n), b"done %d" % n)
    stream += encode_request(T.GRAB_JOB) + encode_request(T.PRE_SLEEP)
    expected = run(stream, [])
    assert expected[0].count(b"\0RES\0\0\0\x0d") == 5  # the foreground jobs' results
    for cut in range(1, len(stream)):
        assert run(stream, [cut]) == expected, f"cut at {cut}"


def test_a_large_packet_in_many_reads_is_handled_once_complete() -> None:
    payload = bytes(range(256)) * 40
    stream = encode_request(T.SUBMIT_JOB_BG, b"f", b"", payload)
    cuts = list(range(1, len(stream), 7))
    big = GearmanOptions().max_packet

    async def main() -> tuple[bytes, bytes]:
        engine = Engine(EngineConfig(id_prefix="H"))
        server = GearmanServer(
            Runtime(engine, asyncio.get_running_loop()), GearmanOptions(max_packet=big)
        )
        conn: GearmanConnection = server.protocol_factory()
        transport = RecordingTransport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        start = 0
        for cut in [*cuts, len(stream)]:
            conn.data_received(stream[start:cut])
            start = cut
            await asyncio.sleep(0)  # each read in a turn of its own, as over a slow link
        return bytes(transport.data), engine.jobs["H:1"].payload

    written, stored = asyncio.run(main())
    assert written == HEADER.pack(b"\0RES", T.JOB_CREATED, 3) + b"H:1"
    assert stored == payload
