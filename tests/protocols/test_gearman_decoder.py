"""The incremental Gearman decoder (protocols/gearman/decoder.py): bytes in, messages out."""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobwire.protocols.gearman.decoder import (
    DEFAULT_MAX_LINE,
    DEFAULT_MAX_PACKET,
    AdminCommand,
    Decoder,
    Message,
    ProtocolError,
)
from jobwire.protocols.gearman.packets import (
    HEADER_SIZE,
    Packet,
    PacketType,
    encode,
    encode_request,
)
from tests.protocols.gearman_cases import (
    CLIENT_ONLY,
    REQUEST_EXAMPLES,
    REQUESTS,
    RESPONSE_EXAMPLES,
    RESPONSES,
    SERVER_ONLY,
)

T = PacketType
SETTINGS = settings(
    max_examples=150,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

NOT_EXPECTED = ProtocolError("INVALID_COMMAND", "Command not expected", fatal=False)


def header(magic: bytes, ptype: int, size: int) -> bytes:
    return struct.pack(">4sII", magic, ptype, size)


def feed_all(decoder: Decoder, chunks: Sequence[bytes]) -> list[Message]:
    out: list[Message] = []
    for chunk in chunks:
        out += decoder.feed(chunk)
    return out


def fatal(out: Sequence[Message]) -> ProtocolError:
    """The last message, which must be a fatal error."""
    last = out[-1]
    assert isinstance(last, ProtocolError), out
    assert last.fatal
    return last


# ---------------------------------------------------------------------- every request type


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_every_request_type_decodes_with_its_fields(name: str) -> None:
    number, argc = REQUESTS[name]
    args = REQUEST_EXAMPLES[name]
    assert len(args) == argc
    out = Decoder().feed(encode_request(number, *args))
    assert out == [Packet(number, args)]
    packet = out[0]
    assert isinstance(packet, Packet)
    assert len(packet.args) == argc
    assert all(type(arg) is bytes for arg in packet.args)


@pytest.mark.parametrize("name", sorted(RESPONSES))
def test_every_response_type_round_trips_through_a_client_decoder(name: str) -> None:
    number, argc = RESPONSES[name]
    args = RESPONSE_EXAMPLES[name]
    assert len(args) == argc
    assert Decoder(server_side=False).feed(encode(number, *args)) == [Packet(number, args)]


def test_submit_reduce_job_libgearman_layout() -> None:
    body = b"count\0u1\0sum\0\0map\0data"
    for ptype in (T.SUBMIT_REDUCE_JOB, T.SUBMIT_REDUCE_JOB_BACKGROUND):
        out = Decoder().feed(header(b"\0REQ", ptype, len(body)) + body)
        assert out == [Packet(ptype, (b"count", b"u1", b"sum", b"", b"map\0data"))]


def test_submit_reduce_job_protocol_document_layout_is_one_field_short() -> None:
    # What the PROTOCOL text describes (no aggregator): too few fields for gearmand's parser.
    body = b"count\0u1\0sum\0data"
    decoder = Decoder()
    out = decoder.feed(header(b"\0REQ", T.SUBMIT_REDUCE_JOB, len(body)) + body)
    assert out == [ProtocolError("INVALID_PACKET", "Expected 5 arguments, got 4", fatal=False)]
    assert not decoder.failed


def test_submit_job_sched_has_eight_fields() -> None:
    body = b"fn\0u\0" + b"30\0" + b"2\0" + b"\0" + b"\0" + b"1\0" + b"da\0ta"
    out = Decoder().feed(header(b"\0REQ", T.SUBMIT_JOB_SCHED, len(body)) + body)
    assert out == [
        Packet(T.SUBMIT_JOB_SCHED, (b"fn", b"u", b"30", b"2", b"", b"", b"1", b"da\0ta"))
    ]


def test_submit_job_epoch_has_four_fields() -> None:
    body = b"fn\0u\x001700000000\0data"
    out = Decoder().feed(header(b"\0REQ", T.SUBMIT_JOB_EPOCH, len(body)) + body)
    assert out == [Packet(T.SUBMIT_JOB_EPOCH, (b"fn", b"u", b"1700000000", b"data"))]


@pytest.mark.parametrize("name", sorted(name for name, (_, argc) in REQUESTS.items() if argc >= 1))
def test_last_field_keeps_its_nuls(name: str) -> None:
    number, argc = REQUESTS[name]
    data = b"\0x\0\0y\0"
    args = (*(b"f%d" % i for i in range(argc - 1)), data)
    assert Decoder().feed(encode_request(number, *args)) == [Packet(number, args)]


@pytest.mark.parametrize("name", sorted(name for name, (_, argc) in RESPONSES.items() if argc >= 1))
def test_response_last_field_keeps_its_nuls(name: str) -> None:
    number, argc = RESPONSES[name]
    args = (*(b"f%d" % i for i in range(argc - 1)), b"\0\0z\0")
    assert Decoder(server_side=False).feed(encode(number, *args)) == [Packet(number, args)]


def test_empty_fields_are_kept() -> None:
    out = Decoder().feed(encode_request(T.SUBMIT_JOB, b"", b"", b""))
    assert out == [Packet(T.SUBMIT_JOB, (b"", b"", b""))]
    out = Decoder().feed(encode_request(T.CAN_DO))
    assert out == [Packet(T.CAN_DO, (b"",))]


@pytest.mark.parametrize("name", sorted(name for name, (_, argc) in REQUESTS.items() if argc == 0))
def test_fieldless_packet_ignores_a_stray_body_and_stays_in_sync(name: str) -> None:
    number, _ = REQUESTS[name]
    stream = header(b"\0REQ", number, 3) + b"a\0b" + encode_request(T.ECHO_REQ, b"next")
    assert Decoder().feed(stream) == [Packet(number, ()), Packet(T.ECHO_REQ, (b"next",))]


# ---------------------------------------------------------------------- framing


def all_requests_stream() -> tuple[bytes, list[Message]]:
    stream = b""
    expected: list[Message] = []
    for name in sorted(REQUESTS):
        number, _ = REQUESTS[name]
        args = REQUEST_EXAMPLES[name]
        stream += encode_request(number, *args)
        expected.append(Packet(number, args))
    return stream, expected


def test_every_request_split_at_every_byte_boundary() -> None:
    stream, expected = all_requests_stream()
    for cut in range(len(stream) + 1):
        decoder = Decoder()
        assert feed_all(decoder, [stream[:cut], stream[cut:]]) == expected, cut
        assert decoder.buffered == 0


def test_every_response_split_at_every_byte_boundary() -> None:
    stream = b""
    expected: list[Message] = []
    for name in sorted(RESPONSES):
        number, _ = RESPONSES[name]
        stream += encode(number, *RESPONSE_EXAMPLES[name])
        expected.append(Packet(number, RESPONSE_EXAMPLES[name]))
    for cut in range(len(stream) + 1):
        assert feed_all(Decoder(server_side=False), [stream[:cut], stream[cut:]]) == expected


def test_one_byte_at_a_time() -> None:
    stream, expected = all_requests_stream()
    decoder = Decoder()
    out = feed_all(decoder, [stream[i : i + 1] for i in range(len(stream))])
    assert out == expected
    assert decoder.buffered == 0


def test_partial_packet_waits_and_is_buffered() -> None:
    raw = encode_request(T.SUBMIT_JOB, b"fn", b"u", b"payload")
    decoder = Decoder()
    assert decoder.feed(raw[:5]) == []
    assert decoder.buffered == 5
    assert decoder.feed(raw[5:-1]) == []
    assert decoder.buffered == len(raw) - 1
    assert decoder.feed(raw[-1:]) == [Packet(T.SUBMIT_JOB, (b"fn", b"u", b"payload"))]
    assert decoder.buffered == 0


def test_many_packets_in_one_feed_come_out_in_order() -> None:
    stream = b"".join(encode_request(T.SUBMIT_JOB_BG, b"fn", b"", b"%d" % i) for i in range(1000))
    out = Decoder().feed(stream)
    assert out == [Packet(T.SUBMIT_JOB_BG, (b"fn", b"", b"%d" % i)) for i in range(1000)]


def test_empty_feed() -> None:
    decoder = Decoder()
    assert decoder.feed(b"") == []
    assert decoder.buffered == 0


def test_defaults() -> None:
    decoder = Decoder()
    assert decoder.max_packet == DEFAULT_MAX_PACKET == 64 * 1024 * 1024
    assert decoder.max_line == DEFAULT_MAX_LINE
    assert not decoder.failed


# ---------------------------------------------------------------------- admin text lines


def test_text_line_becomes_an_admin_command() -> None:
    out = Decoder().feed(b"status\n")
    assert out == [AdminCommand(b"status")]
    command = out[0]
    assert isinstance(command, AdminCommand)
    assert command.args == ["status"]
    assert command.name == "status"


def test_crlf_is_stripped_and_the_name_is_case_insensitive() -> None:
    (command,) = Decoder().feed(b"STATUS\r\n")
    assert isinstance(command, AdminCommand)
    assert command.line == b"STATUS"
    assert command.name == "status"
    assert command.args == ["STATUS"]


def test_only_one_carriage_return_is_stripped() -> None:
    (command,) = Decoder().feed(b"version\r\r\n")
    assert isinstance(command, AdminCommand)
    assert command.line == b"version\r"


def test_runs_of_spaces_separate_arguments() -> None:
    (command,) = Decoder().feed(b"maxqueue   reverse  1   2 3\r\n")
    assert isinstance(command, AdminCommand)
    assert command.args == ["maxqueue", "reverse", "1", "2", "3"]
    assert command.line == b"maxqueue   reverse  1   2 3"


def test_leading_and_trailing_spaces() -> None:
    (command,) = Decoder().feed(b"  show   jobs  \n")
    assert isinstance(command, AdminCommand)
    assert command.args == ["show", "jobs"]
    assert command.name == "show"


def test_empty_line() -> None:
    (command,) = Decoder().feed(b"\r\n")
    assert isinstance(command, AdminCommand)
    assert command.line == b""
    assert command.args == []
    assert command.name == ""


def test_non_utf8_admin_line_does_not_raise() -> None:
    (command,) = Decoder().feed(b"cancel job H:\xff\xfe\n")
    assert isinstance(command, AdminCommand)
    assert command.args[2].encode("utf-8", "surrogateescape") == b"H:\xff\xfe"


def test_several_lines_in_one_feed() -> None:
    out = Decoder().feed(b"status\nworkers\r\nversion\n")
    assert out == [AdminCommand(b"status"), AdminCommand(b"workers"), AdminCommand(b"version")]


def mixed_stream() -> tuple[bytes, list[Message]]:
    parts: list[tuple[bytes, Message]] = [
        (b"status\r\n", AdminCommand(b"status")),
        (encode_request(T.ECHO_REQ, b"a\nb"), Packet(T.ECHO_REQ, (b"a\nb",))),
        (b"show  jobs\n", AdminCommand(b"show  jobs")),
        (encode_request(T.CAN_DO, b"fn"), Packet(T.CAN_DO, (b"fn",))),
        (encode_request(T.PRE_SLEEP), Packet(T.PRE_SLEEP, ())),
        (b"workers\n", AdminCommand(b"workers")),
        (
            encode_request(T.SUBMIT_JOB, b"f", b"u", b"x\0y\n"),
            Packet(T.SUBMIT_JOB, (b"f", b"u", b"x\0y\n")),
        ),
        (b"version\r\n", AdminCommand(b"version")),
    ]
    return b"".join(raw for raw, _ in parts), [message for _, message in parts]


def test_text_and_binary_mixed_on_one_stream() -> None:
    stream, expected = mixed_stream()
    assert Decoder().feed(stream) == expected


def test_mixed_stream_split_at_every_byte_boundary() -> None:
    stream, expected = mixed_stream()
    for cut in range(len(stream) + 1):
        decoder = Decoder()
        assert feed_all(decoder, [stream[:cut], stream[cut:]]) == expected, cut
        assert decoder.buffered == 0


def test_mixed_stream_one_byte_at_a_time() -> None:
    stream, expected = mixed_stream()
    assert feed_all(Decoder(), [stream[i : i + 1] for i in range(len(stream))]) == expected


def test_partial_admin_line_is_kept_whole() -> None:
    decoder = Decoder()
    assert decoder.feed(b"stat") == []
    assert decoder.buffered == 4
    assert decoder.feed(b"us\r") == []
    assert decoder.feed(b"\n") == [AdminCommand(b"status")]
    assert decoder.buffered == 0


def test_packet_then_partial_line_keeps_the_line() -> None:
    decoder = Decoder()
    out = decoder.feed(encode_request(T.PRE_SLEEP) + b"work")
    assert out == [Packet(T.PRE_SLEEP, ())]
    assert decoder.buffered == 4
    assert decoder.feed(b"ers\n") == [AdminCommand(b"workers")]


def test_line_one_byte_over_max_line_is_refused() -> None:
    decoder = Decoder(max_line=16)
    assert decoder.feed(b"x" * 16) == []
    out = decoder.feed(b"x")
    assert out == [ProtocolError("ARGUMENT_TOO_LARGE", "Command line too long", fatal=True)]


def test_line_of_exactly_max_line_is_accepted() -> None:
    decoder = Decoder(max_line=16)
    assert decoder.feed(b"y" * 16) == []
    assert decoder.feed(b"\n") == [AdminCommand(b"y" * 16)]


# ---------------------------------------------------------------------- errors


def test_invalid_magic_is_fatal() -> None:
    decoder = Decoder()
    out = decoder.feed(encode_request(T.ECHO_REQ, b"ok") + b"\0XYZ" + bytes(8))
    assert out[0] == Packet(T.ECHO_REQ, (b"ok",))
    assert out[1:] == [ProtocolError("INVALID_MAGIC", "Request magic expected", fatal=True)]
    assert decoder.failed
    assert decoder.buffered == 0
    assert decoder.feed(encode_request(T.ECHO_REQ, b"after")) == []


def test_response_magic_from_a_client_is_skipped_with_a_non_fatal_error() -> None:
    # gearmand answers ERROR INVALID_MAGIC and keeps reading: the packet is framed correctly.
    decoder = Decoder()
    stream = encode(T.JOB_CREATED, b"H:1") + encode_request(T.ECHO_REQ, b"next")
    out = decoder.feed(stream)
    assert out == [
        ProtocolError("INVALID_MAGIC", "Request magic expected", fatal=False),
        Packet(T.ECHO_REQ, (b"next",)),
    ]
    assert not decoder.failed
    assert decoder.buffered == 0


def test_response_magic_packet_is_skipped_whole_when_split() -> None:
    stream = encode(T.WORK_DATA, b"H:1", b"\0REQ" + bytes(8)) + encode_request(T.GRAB_JOB)
    for cut in range(len(stream) + 1):
        out = feed_all(Decoder(), [stream[:cut], stream[cut:]])
        assert out == [
            ProtocolError("INVALID_MAGIC", "Request magic expected", fatal=False),
            Packet(T.GRAB_JOB, ()),
        ]


def test_request_magic_to_a_client_decoder_is_skipped() -> None:
    decoder = Decoder(server_side=False)
    out = decoder.feed(encode_request(T.GRAB_JOB) + encode(T.NOOP))
    assert out[1:] == [Packet(T.NOOP, ())]
    error = out[0]
    assert isinstance(error, ProtocolError)
    assert (error.code, error.fatal) == ("INVALID_MAGIC", False)
    assert not decoder.failed


def test_text_to_a_client_decoder_is_fatal() -> None:
    decoder = Decoder(server_side=False)
    out = decoder.feed(b"OK\r\n")
    assert out == [ProtocolError("INVALID_MAGIC", "Response magic expected", fatal=True)]
    assert decoder.buffered == 0


def test_invalid_magic_waits_for_a_whole_header() -> None:
    decoder = Decoder()
    assert decoder.feed(b"\0RE") == []
    assert decoder.feed(b"X\0\0\0\x06") == []
    assert fatal(decoder.feed(b"\0\0\0\0")).code == "INVALID_MAGIC"


@pytest.mark.parametrize("ptype", [0, 43, 100, 0xFFFFFFFF])
def test_unknown_type_is_fatal(ptype: int) -> None:
    decoder = Decoder()
    out = decoder.feed(header(b"\0REQ", ptype, 2) + b"ab" + encode_request(T.ECHO_REQ, b"x"))
    assert out == [ProtocolError("INVALID_COMMAND", f"Unknown packet type {ptype}", fatal=True)]
    assert decoder.failed
    assert decoder.buffered == 0


@pytest.mark.parametrize("ptype", [0, 43])
def test_unknown_type_is_fatal_for_a_client_decoder(ptype: int) -> None:
    decoder = Decoder(server_side=False)
    assert fatal(decoder.feed(header(b"\0RES", ptype, 0))).code == "INVALID_COMMAND"


@pytest.mark.parametrize("server_side", [True, False])
def test_unused_type_5_is_not_fatal(server_side: bool) -> None:
    magic = b"\0REQ" if server_side else b"\0RES"
    decoder = Decoder(server_side=server_side)
    out = decoder.feed(header(magic, PacketType.UNUSED, 1) + b"?" + header(magic, T.ECHO_RES, 0))
    assert out[0] == NOT_EXPECTED
    assert not decoder.failed


@pytest.mark.parametrize("name", sorted(SERVER_ONLY))
def test_server_only_type_from_a_client_is_not_fatal(name: str) -> None:
    number, argc = SERVER_ONLY[name]
    body = b"\0".join(b"x" for _ in range(argc))
    decoder = Decoder()
    stream = header(b"\0REQ", number, len(body)) + body + encode_request(T.ECHO_REQ, b"next")
    assert decoder.feed(stream) == [NOT_EXPECTED, Packet(T.ECHO_REQ, (b"next",))]
    assert not decoder.failed


@pytest.mark.parametrize("name", sorted(CLIENT_ONLY))
def test_client_only_type_to_a_client_decoder_is_not_fatal(name: str) -> None:
    number, _ = CLIENT_ONLY[name]
    decoder = Decoder(server_side=False)
    stream = header(b"\0RES", number, 1) + b"z" + encode(T.NOOP)
    assert decoder.feed(stream) == [NOT_EXPECTED, Packet(T.NOOP, ())]


@pytest.mark.parametrize("name", sorted(name for name, (_, argc) in REQUESTS.items() if argc >= 2))
def test_missing_separators_are_not_fatal(name: str) -> None:
    number, argc = REQUESTS[name]
    body = b"\0".join(b"f" for _ in range(argc - 1))  # one field short
    decoder = Decoder()
    stream = header(b"\0REQ", number, len(body)) + body + encode_request(T.ECHO_REQ, b"next")
    out = decoder.feed(stream)
    assert out == [
        ProtocolError("INVALID_PACKET", f"Expected {argc} arguments, got {argc - 1}", fatal=False),
        Packet(T.ECHO_REQ, (b"next",)),
    ]
    assert not decoder.failed


@pytest.mark.parametrize("name", sorted(name for name, (_, argc) in RESPONSES.items() if argc >= 2))
def test_missing_separators_in_responses(name: str) -> None:
    number, argc = RESPONSES[name]
    out = Decoder(server_side=False).feed(header(b"\0RES", number, 4) + b"only")
    assert out == [
        ProtocolError("INVALID_PACKET", f"Expected {argc} arguments, got 1", fatal=False)
    ]


def test_oversize_declared_size_is_fatal_before_the_body_arrives() -> None:
    decoder = Decoder(max_packet=100)
    ok = encode_request(T.ECHO_REQ, b"x" * 100)  # exactly the limit
    out = decoder.feed(ok + header(b"\0REQ", T.SUBMIT_JOB, 101))
    assert out == [
        Packet(T.ECHO_REQ, (b"x" * 100,)),
        ProtocolError("ARGUMENT_TOO_LARGE", "Packet of 101 bytes exceeds the limit", fatal=True),
    ]
    assert decoder.buffered == 0
    # The body that follows is never buffered.
    assert decoder.feed(b"y" * 1000) == []
    assert decoder.buffered == 0


def test_oversize_declared_size_with_the_default_limit() -> None:
    decoder = Decoder()
    out = decoder.feed(header(b"\0REQ", T.SUBMIT_JOB, 0xFFFFFFFF))
    assert fatal(out).code == "ARGUMENT_TOO_LARGE"
    assert decoder.buffered == 0


def test_packet_of_exactly_max_packet_is_buffered_until_complete() -> None:
    decoder = Decoder(max_packet=64)
    raw = encode_request(T.ECHO_REQ, b"e" * 64)
    assert decoder.feed(raw[:-1]) == []
    assert decoder.buffered == HEADER_SIZE + 63
    assert decoder.feed(raw[-1:]) == [Packet(T.ECHO_REQ, (b"e" * 64,))]


def test_endless_text_line_is_fatal_with_bounded_memory() -> None:
    decoder = Decoder(max_line=64)
    fed = 0
    out: list[Message] = []
    while not decoder.failed:
        out += decoder.feed(b"a" * 7)
        fed += 7
        assert decoder.buffered <= 64
        assert fed < 1000
    assert out == [ProtocolError("ARGUMENT_TOO_LARGE", "Command line too long", fatal=True)]
    assert decoder.buffered == 0
    assert decoder.feed(b"a" * 100_000) == []
    assert decoder.buffered == 0


def test_endless_text_line_in_one_big_feed() -> None:
    decoder = Decoder(max_line=64)
    assert fatal(decoder.feed(b"z" * 1_000_000)).code == "ARGUMENT_TOO_LARGE"
    assert decoder.buffered == 0


def test_too_long_line_with_newline_is_fatal() -> None:
    decoder = Decoder(max_line=8)
    out = decoder.feed(b"ok\n" + b"q" * 9 + b"\nstatus\n")
    assert out == [
        AdminCommand(b"ok"),
        ProtocolError("ARGUMENT_TOO_LARGE", "Command line too long", fatal=True),
    ]


def test_messages_before_a_fatal_error_are_delivered() -> None:
    decoder = Decoder()
    stream = b"status\n" + encode_request(T.GRAB_JOB) + b"\0BAD" + bytes(8) + b"workers\n"
    out = decoder.feed(stream)
    assert out[:2] == [AdminCommand(b"status"), Packet(T.GRAB_JOB, ())]
    assert fatal(out).code == "INVALID_MAGIC"
    assert len(out) == 3


def test_protocol_error_equality_hash_repr() -> None:
    a = ProtocolError("X", "y", fatal=True)
    assert a == ProtocolError("X", "y", fatal=True)
    assert a != ProtocolError("X", "y", fatal=False)
    assert a != "X"
    assert hash(a) == hash(ProtocolError("X", "y", fatal=True))
    assert repr(a) == "ProtocolError('X', 'y', fatal=True)"


def test_admin_command_equality_hash_repr() -> None:
    a = AdminCommand(b"status")
    assert a == AdminCommand(b"status")
    assert a != AdminCommand(b"STATUS")
    assert a != b"status"
    assert hash(a) == hash(AdminCommand(b"status"))
    assert repr(a) == "AdminCommand(b'status')"


# ---------------------------------------------------------------------- properties

MAX_PACKET = 48
MAX_LINE = 24

field = st.binary(max_size=12).map(lambda raw: raw.replace(b"\0", b""))
last_field = st.binary(max_size=20)


@st.composite
def request_args(draw: st.DrawFn) -> tuple[int, tuple[bytes, ...]]:
    name = draw(st.sampled_from(sorted(REQUESTS)))
    number, argc = REQUESTS[name]
    if argc == 0:
        return number, ()
    head = draw(st.lists(field, min_size=argc - 1, max_size=argc - 1))
    return number, (*head, draw(last_field))


@st.composite
def response_args(draw: st.DrawFn) -> tuple[int, tuple[bytes, ...]]:
    name = draw(st.sampled_from(sorted(RESPONSES)))
    number, argc = RESPONSES[name]
    if argc == 0:
        return number, ()
    head = draw(st.lists(field, min_size=argc - 1, max_size=argc - 1))
    return number, (*head, draw(last_field))


admin_line = st.binary(max_size=30).map(
    lambda raw: b"s" + raw.replace(b"\n", b"").replace(b"\0", b"") + b"\n"
)

# Pieces of plausible and hostile input: whole packets, admin lines, bad headers, junk.
stream_piece = st.one_of(
    request_args().map(lambda spec: encode_request(spec[0], *spec[1])),
    admin_line,
    st.tuples(
        st.sampled_from([b"\0REQ", b"\0RES", b"\0RQE", b"\0\0\0\0"]),
        st.integers(0, 50),
        st.integers(0, 2 * MAX_PACKET),
    ).map(lambda spec: header(*spec)),
    st.binary(max_size=40),
)


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(cut, len(data)) for cut in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


@SETTINGS
@given(spec=request_args())
def test_property_every_request_round_trips(spec: tuple[int, tuple[bytes, ...]]) -> None:
    number, args = spec
    assert Decoder().feed(encode_request(number, *args)) == [Packet(number, args)]


@SETTINGS
@given(spec=response_args())
def test_property_every_response_round_trips(spec: tuple[int, tuple[bytes, ...]]) -> None:
    number, args = spec
    assert Decoder(server_side=False).feed(encode(number, *args)) == [Packet(number, args)]


@SETTINGS
@given(
    data=st.binary(max_size=400) | st.lists(stream_piece, max_size=12).map(b"".join),
    cuts=st.lists(st.integers(0, 400), max_size=12),
    server_side=st.booleans(),
)
def test_property_arbitrary_bytes_never_raise_and_memory_stays_bounded(
    data: bytes, cuts: list[int], server_side: bool
) -> None:
    decoder = Decoder(max_packet=MAX_PACKET, max_line=MAX_LINE, server_side=server_side)
    bound = max(MAX_PACKET + HEADER_SIZE, MAX_LINE)
    for chunk in chunked(data, cuts):
        out = decoder.feed(chunk)
        assert all(isinstance(m, Packet | AdminCommand | ProtocolError) for m in out)
        assert decoder.buffered <= bound
        if any(isinstance(m, ProtocolError) and m.fatal for m in out):
            assert decoder.failed
            assert isinstance(out[-1], ProtocolError)
            assert decoder.buffered == 0


@SETTINGS
@given(
    data=st.lists(stream_piece, max_size=12).map(b"".join),
    cuts=st.lists(st.integers(0, 600), max_size=20),
)
def test_property_chunking_does_not_change_the_messages(data: bytes, cuts: list[int]) -> None:
    whole = Decoder(max_packet=MAX_PACKET, max_line=MAX_LINE).feed(data)
    pieces = feed_all(Decoder(max_packet=MAX_PACKET, max_line=MAX_LINE), chunked(data, cuts))
    assert pieces == whole


@SETTINGS
@given(specs=st.lists(request_args(), max_size=10), cuts=st.lists(st.integers(0, 600)))
def test_property_valid_request_stream_in_any_chunking(
    specs: list[tuple[int, tuple[bytes, ...]]], cuts: list[int]
) -> None:
    data = b"".join(encode_request(number, *args) for number, args in specs)
    decoder = Decoder()
    assert feed_all(decoder, chunked(data, cuts)) == [
        Packet(number, args) for number, args in specs
    ]
    assert decoder.buffered == 0


@SETTINGS
@given(
    lines=st.lists(
        st.binary(min_size=1, max_size=20).map(
            lambda raw: b"a" + raw.replace(b"\n", b"").replace(b"\0", b"")
        ),
        max_size=8,
    ),
    cuts=st.lists(st.integers(0, 200)),
)
def test_property_admin_lines_in_any_chunking(lines: list[bytes], cuts: list[int]) -> None:
    data = b"".join(line + b"\r\n" for line in lines)
    out = feed_all(Decoder(), chunked(data, cuts))
    assert out == [AdminCommand(line) for line in lines]
