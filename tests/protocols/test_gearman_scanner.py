"""The server's Gearman reader (protocols/gearman/scanner.py): bytes in, sink calls out.

The scanner reads the common packets in place and leaves the rest to the decoder; whatever
the stream (well-formed or not) and however it is cut into reads, the sink must hear the
same calls, in the same order, as from one whole read.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobwire.protocols.gearman.decoder import AdminCommand, ProtocolError
from jobwire.protocols.gearman.packets import HEADER, REQUEST_ARGC, Packet, encode_request
from jobwire.protocols.gearman.packets import PacketType as T
from jobwire.protocols.gearman.scanner import (
    HIGH,
    LOW,
    MAX_UNIQUE,
    NORMAL,
    SERVER_ERROR,
    Scanner,
    Sink,
    handle_number,
)

PREFIX = b"H:x:"
MAX_PACKET = 256  # small, so that oversized packets are cheap to generate

Call = tuple[Any, ...]


class RecordingSink(Sink):
    """Records every call but `tick` (whose count depends on how the input was cut)."""

    def __init__(self, fail_on: bytes = b"") -> None:
        self.calls: list[Call] = []
        self.ticks = 0
        self.fail_on = fail_on  # a payload whose submit raises

    def submit_plain(
        self, function: bytes, unique: bytes, payload: bytes, priority: int, background: bool
    ) -> None:
        if self.fail_on and payload == self.fail_on:
            raise RuntimeError("boom")
        self.calls.append(("submit", function, unique, payload, priority, background))

    def work_complete(self, number: int, handle: bytes, result: bytes) -> None:
        if number:
            # The handle may be left out: it is then the prefix and the number.
            assert handle in (b"", PREFIX + str(number).encode())
            handle = PREFIX + str(number).encode()
        self.calls.append(("complete", number, handle, result))

    def grab(self, kind: int) -> None:
        self.calls.append(("grab", kind))

    def pre_sleep(self) -> None:
        self.calls.append(("sleep",))

    def packet(self, packet: Packet) -> None:
        self.calls.append(("packet", packet.type, packet.args))

    def admin(self, command: AdminCommand) -> None:
        self.calls.append(("admin", command.line))

    def protocol_error(self, error: ProtocolError) -> None:
        self.calls.append(("error", error.code, error.fatal))

    def tick(self) -> None:
        self.ticks += 1


def scan(stream: bytes, cuts: list[int] | None = None, **kwargs: Any) -> list[Call]:
    """The sink calls for `stream` fed in reads cut at `cuts` (one read if None)."""
    sink = RecordingSink(**kwargs)
    scanner = Scanner(sink, PREFIX, MAX_PACKET)
    start = 0
    for cut in [*sorted(cuts or []), len(stream)]:
        if cut > start:
            scanner.feed(stream[start:cut])
            start = cut
    return sink.calls


def handle(n: int) -> bytes:
    return PREFIX + str(n).encode()


PLAIN_SUBMITS = {
    T.SUBMIT_JOB: (NORMAL, False),
    T.SUBMIT_JOB_BG: (NORMAL, True),
    T.SUBMIT_JOB_HIGH: (HIGH, False),
    T.SUBMIT_JOB_HIGH_BG: (HIGH, True),
    T.SUBMIT_JOB_LOW: (LOW, False),
    T.SUBMIT_JOB_LOW_BG: (LOW, True),
}
GRABS = (T.GRAB_JOB, T.GRAB_JOB_UNIQ, T.GRAB_JOB_ALL)


def example(ptype: int) -> bytes:
    """A well-formed request of `ptype`."""
    argc = REQUEST_ARGC[ptype]
    if ptype == T.WORK_COMPLETE:
        return encode_request(ptype, handle(7), b"result")
    fields = [b"f%d" % i for i in range(argc)]
    return encode_request(ptype, *fields)


@pytest.mark.parametrize("ptype", sorted(REQUEST_ARGC), ids=lambda t: T(t).name)
def test_every_request_type_reaches_its_sink_method(ptype: int) -> None:
    calls = scan(example(ptype))
    args = tuple(b"f%d" % i for i in range(REQUEST_ARGC[ptype]))
    if ptype in PLAIN_SUBMITS:
        assert calls == [("submit", b"f0", b"f1", b"f2", *PLAIN_SUBMITS[ptype])]
    elif ptype == T.WORK_COMPLETE:
        assert calls == [("complete", 7, handle(7), b"result")]
    elif ptype in GRABS:
        assert calls == [("grab", ptype)]
    elif ptype == T.PRE_SLEEP:
        assert calls == [("sleep",)]
    else:
        assert calls == [("packet", ptype, args)]


@pytest.mark.parametrize("ptype", [t for t in T if t not in REQUEST_ARGC])
def test_a_response_type_is_refused_and_reading_goes_on(ptype: int) -> None:
    stream = HEADER.pack(b"\0REQ", ptype, 0) + encode_request(T.PRE_SLEEP)
    assert scan(stream) == [("error", "INVALID_COMMAND", False), ("sleep",)]


def test_an_unknown_type_ends_the_stream() -> None:
    stream = HEADER.pack(b"\0REQ", 99, 0) + encode_request(T.PRE_SLEEP)
    assert scan(stream) == [("error", "INVALID_COMMAND", True)]


def test_a_type_whose_low_bits_are_a_submits_is_not_taken_for_one() -> None:
    stream = HEADER.pack(b"\0REQ", 0x10000 + T.SUBMIT_JOB_BG, 6) + b"f\0\0pay"
    assert scan(stream) == [("error", "INVALID_COMMAND", True)]


def test_the_unique_id_limit_is_checked_by_the_listener() -> None:
    longest = encode_request(T.SUBMIT_JOB_BG, b"f", b"u" * MAX_UNIQUE, b"x")
    too_long = encode_request(T.SUBMIT_JOB_BG, b"f", b"u" * (MAX_UNIQUE + 1), b"x")
    assert scan(longest + too_long) == [
        ("submit", b"f", b"u" * MAX_UNIQUE, b"x", NORMAL, True),
        ("packet", T.SUBMIT_JOB_BG, (b"f", b"u" * (MAX_UNIQUE + 1), b"x")),
    ]


def test_a_malformed_common_packet_is_reported_by_the_decoder() -> None:
    stream = (
        encode_request(T.SUBMIT_JOB_BG, b"f\0only-two-fields")
        + encode_request(T.WORK_COMPLETE, handle(1))
        + encode_request(T.GRAB_JOB)
    )
    assert scan(stream) == [
        ("error", "INVALID_PACKET", False),
        ("error", "INVALID_PACKET", False),
        ("grab", T.GRAB_JOB),
    ]


def test_a_result_under_another_handle_comes_with_its_bytes_and_no_number() -> None:
    stream = b"".join(
        encode_request(T.WORK_COMPLETE, raw, b"r")
        for raw in (b"H:x:0", b"H:x:07", b"H:y:7", b"H:x:", b"H:x:7a", b"client-id")
    )
    assert [call[1:3] for call in scan(stream)] == [
        (0, b"H:x:0"),
        (0, b"H:x:07"),
        (0, b"H:y:7"),
        (0, b"H:x:"),
        (0, b"H:x:7a"),
        (0, b"client-id"),
    ]


def test_admin_lines_and_packets_mix() -> None:
    stream = (
        encode_request(T.PRE_SLEEP)
        + b"status\r\n"
        + encode_request(T.SUBMIT_JOB, b"f", b"", b"x")
        + b"workers\n"
        + encode_request(T.GRAB_JOB)
    )
    expected = [
        ("sleep",),
        ("admin", b"status"),
        ("submit", b"f", b"", b"x", NORMAL, False),
        ("admin", b"workers"),
        ("grab", T.GRAB_JOB),
    ]
    assert scan(stream) == expected
    for cut in range(1, len(stream)):
        assert scan(stream, [cut]) == expected, f"cut at {cut}"


def test_a_request_whose_handling_raises_is_answered_and_reading_goes_on() -> None:
    stream = b"".join(
        encode_request(T.SUBMIT_JOB_BG, b"f", b"", payload) for payload in (b"a", b"bad", b"c")
    )
    expected = [
        ("submit", b"f", b"", b"a", NORMAL, True),
        ("error", SERVER_ERROR.code, False),
        ("submit", b"f", b"", b"c", NORMAL, True),
    ]
    assert scan(stream, fail_on=b"bad") == expected
    # The same through the decoder (the stream starts with an admin line).
    assert scan(b"version\n" + stream, fail_on=b"bad") == [("admin", b"version"), *expected]


def test_a_long_read_ticks_every_16_packets() -> None:
    sink = RecordingSink()
    Scanner(sink, PREFIX, MAX_PACKET).feed(encode_request(T.GRAB_JOB) * 40)
    assert (sink.ticks, len(sink.calls)) == (2, 40)


def test_a_large_packet_in_many_reads_is_handled_once_complete() -> None:
    payload = bytes(range(256)) * 40
    stream = encode_request(T.SUBMIT_JOB_BG, b"f", b"", payload) + encode_request(T.GRAB_JOB)
    sink = RecordingSink()
    scanner = Scanner(sink, PREFIX, 64 * 1024)
    for start in range(0, len(stream), 7):
        scanner.feed(stream[start : start + 7])
        if start + 7 < len(stream) - 12:
            assert sink.calls == []
    assert sink.calls == [("submit", b"f", b"", payload, NORMAL, True), ("grab", T.GRAB_JOB)]


def test_nothing_is_read_after_a_fatal_error() -> None:
    sink = RecordingSink()
    scanner = Scanner(sink, PREFIX, MAX_PACKET)
    scanner.feed(b"\0XYZ" + bytes(8) + encode_request(T.PRE_SLEEP))
    scanner.feed(encode_request(T.PRE_SLEEP))
    assert sink.calls == [("error", "INVALID_MAGIC", True)]
    assert scanner.failed


def test_every_common_packet_cut_anywhere() -> None:
    stream = encode_request(T.CAN_DO, b"f")
    for n, ptype in enumerate(PLAIN_SUBMITS):
        stream += encode_request(ptype, b"f", b"", b"job %d" % n)
        stream += encode_request(ptype, b"f", b"u%d" % n, b"")
    for n, kind in enumerate(GRABS):
        stream += encode_request(kind) + encode_request(T.WORK_COMPLETE, handle(n + 1), b"ok")
    stream += encode_request(T.WORK_COMPLETE, b"chosen", b"") + encode_request(T.PRE_SLEEP)
    expected = scan(stream)
    assert len(expected) == 1 + 12 + 6 + 2
    for cut in range(1, len(stream)):
        assert scan(stream, [cut]) == expected, f"cut at {cut}"
    assert scan(stream, list(range(1, len(stream)))) == expected  # a byte at a time


def test_handle_number() -> None:
    data = b"xxH:x:1234yy"
    assert handle_number(data, 2, 10, PREFIX) == 1234
    assert handle_number(data, 2, 11, PREFIX) == 0  # "1234y"
    assert handle_number(b"H:x:" + b"9" * 18, 0, 22, PREFIX) == int("9" * 18)
    assert handle_number(b"H:x:" + b"9" * 19, 0, 23, PREFIX) == 0  # too many digits
    for raw in (b"H:x:", b"H:x:0", b"H:x:01", b"H:y:1", b"h:x:1", b"H:x1", b"", b"1"):
        assert handle_number(raw, 0, len(raw), PREFIX) == 0, raw


# -- any stream, any cuts -------------------------------------------------------------------

names = st.sampled_from([b"f", b"f", b"g"])
payloads = st.binary(max_size=12)
submit_types = st.sampled_from(sorted(PLAIN_SUBMITS))
common = st.one_of(
    st.builds(lambda t, f, p: encode_request(t, f, b"", p), submit_types, names, payloads),
    st.builds(
        encode_request, submit_types, names, st.sampled_from([b"u", b"v", b"\xff"]), payloads
    ),
    st.builds(encode_request, st.sampled_from(GRABS)),
    st.just(encode_request(T.PRE_SLEEP)),
    st.builds(
        lambda n, r: encode_request(T.WORK_COMPLETE, handle(n), r), st.integers(0, 12), payloads
    ),
)
other = st.one_of(
    st.builds(lambda t, f, p: encode_request(t, f, b"u" * 65, p), submit_types, names, payloads),
    st.builds(lambda f: encode_request(T.CAN_DO, f), names),
    st.builds(lambda n: encode_request(T.WORK_FAIL, handle(n)), st.integers(0, 6)),
    st.builds(lambda n: encode_request(T.WORK_COMPLETE, handle(n)), st.integers(0, 3)),
    st.just(encode_request(T.SUBMIT_JOB_BG, b"f\0only-two-fields")),
    st.just(HEADER.pack(b"\0RES", T.NOOP, 0)),
    st.just(encode_request(T.ECHO_REQ, b"ping")),
    st.just(b"status\n"),
)
fatal = st.sampled_from(
    [
        b"",
        HEADER.pack(b"\0REQ", T.SUBMIT_JOB_BG, MAX_PACKET + 1),
        b"\0XYZ" + bytes(8),
        HEADER.pack(b"\0REQ", 99, 0),
        HEADER.pack(b"\0REQ", 0x10000 + T.SUBMIT_JOB_BG, 6) + b"f\0\0pay",
        HEADER.pack(b"\0REQ", 0x1000000 + T.GRAB_JOB, 0),
        b"x" * 9000,  # an admin line over the limit
    ]
)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.one_of(common, common, common, other), min_size=1, max_size=40),
    fatal,
    st.lists(st.integers(0, 2000), max_size=8),
)
def test_any_stream_cut_anywhere_makes_the_calls_of_one_read(
    packets: list[bytes], last: bytes, cuts: list[int]
) -> None:
    stream = b"".join(packets) + last
    cuts = [cut for cut in cuts if cut < len(stream)]
    assert scan(stream, cuts) == scan(stream)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200), st.lists(st.integers(0, 200), max_size=6))
def test_arbitrary_bytes_never_crash_the_scanner(data: bytes, cuts: list[int]) -> None:
    calls = scan(data, [cut for cut in cuts if cut < len(data)])
    assert all(call[0] != "error" or call[1] != SERVER_ERROR.code for call in calls)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(common, other), max_size=10), st.binary(max_size=40))
def test_arbitrary_bytes_after_requests_never_crash_the_scanner(
    packets: list[bytes], tail: bytes
) -> None:
    stream = b"".join(packets) + tail
    for cut in range(0, len(stream), 5):
        scan(stream, [cut])
