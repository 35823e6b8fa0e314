"""Gearman packet types, field-count tables and encoding (protocols/gearman/packets.py)."""

from __future__ import annotations

import struct

import pytest

from jobwire.protocols.gearman import packets
from jobwire.protocols.gearman.packets import (
    HEADER_SIZE,
    REQ_MAGIC,
    REQUEST_ARGC,
    RES_MAGIC,
    RESPONSE_ARGC,
    Packet,
    PacketType,
    encode,
    encode_request,
)
from tests.protocols.gearman_cases import (
    REQUEST_EXAMPLES,
    REQUESTS,
    RESPONSE_EXAMPLES,
    RESPONSES,
)


def test_all_42_packet_types_have_the_protocol_numbers() -> None:
    assert [member.value for member in PacketType] == list(range(1, 43))
    for name, (number, _argc) in {**REQUESTS, **RESPONSES}.items():
        assert PacketType[name] == number
    assert PacketType(5) is PacketType.UNUSED


def test_every_type_but_unused_is_a_request_or_a_response() -> None:
    covered = set(REQUEST_ARGC) | set(RESPONSE_ARGC)
    assert covered == set(range(1, 43)) - {PacketType.UNUSED}


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_request_field_counts_follow_gearmand(name: str) -> None:
    number, argc = REQUESTS[name]
    assert REQUEST_ARGC[number] == argc


@pytest.mark.parametrize("name", sorted(RESPONSES))
def test_response_field_counts_follow_gearmand(name: str) -> None:
    number, argc = RESPONSES[name]
    assert RESPONSE_ARGC[number] == argc


def test_tables_have_nothing_beyond_the_spec() -> None:
    assert set(REQUEST_ARGC) == {number for number, _ in REQUESTS.values()}
    assert set(RESPONSE_ARGC) == {number for number, _ in RESPONSES.values()}


def test_reduce_jobs_carry_the_libgearman_aggregator_field() -> None:
    # PROTOCOL says 3 NUL fields + data; libgearman/command.cc and add.cc use 4 + data.
    assert REQUEST_ARGC[PacketType.SUBMIT_REDUCE_JOB] == 5
    assert REQUEST_ARGC[PacketType.SUBMIT_REDUCE_JOB_BACKGROUND] == 5


def test_header_layout() -> None:
    assert HEADER_SIZE == 12
    assert REQ_MAGIC == b"\0REQ"
    assert RES_MAGIC == b"\0RES"


def test_encode_builds_a_response_packet_byte_for_byte() -> None:
    assert encode(PacketType.JOB_CREATED, b"H:vm:1") == b"\0RES\0\0\0\x08\0\0\0\x06H:vm:1"
    assert encode(PacketType.WORK_COMPLETE, b"H:1", b"ok") == (
        b"\0RES" + struct.pack(">II", 13, 6) + b"H:1\0ok"
    )


def test_encode_request_builds_a_request_packet_byte_for_byte() -> None:
    assert encode_request(PacketType.SUBMIT_JOB, b"fn", b"", b"x") == (
        b"\0REQ" + struct.pack(">II", 7, 5) + b"fn\0\0x"
    )
    assert encode_request(PacketType.GRAB_JOB) == b"\0REQ\0\0\0\x09\0\0\0\0"


def test_encode_without_fields_has_an_empty_body() -> None:
    assert encode(PacketType.NOOP) == b"\0RES\0\0\0\x06\0\0\0\0"
    assert encode(PacketType.NOOP) == packets.NOOP
    assert packets.NO_JOB == b"\0RES\0\0\0\x0a\0\0\0\0"


def test_encode_keeps_nuls_in_the_last_field() -> None:
    data = b"\0a\0\0b\0"
    raw = encode(PacketType.WORK_DATA, b"H:1", data)
    assert raw[HEADER_SIZE:] == b"H:1\0" + data
    assert struct.unpack(">I", raw[8:12])[0] == 4 + len(data)


@pytest.mark.parametrize("size", [0, 1, 1022, 1023, 1024, 70_000])
def test_headers_are_right_built_or_reused_at_every_size(size: int) -> None:
    # Headers of bodies under 1 KiB are kept per type and size once built; larger ones are
    # packed each time. Each size twice, and one type after another: a kept header must
    # be found for its own type and size only.
    data = b"d" * max(size - 4, 0)
    for _ in range(2):
        for ptype in (PacketType.WORK_COMPLETE, PacketType.WORK_DATA):
            raw = encode(ptype, b"H:1", data) if size >= 4 else encode(ptype, b"x" * size)
            assert raw[:HEADER_SIZE] == RES_MAGIC + struct.pack(">II", ptype, size)
            assert len(raw) == HEADER_SIZE + size


@pytest.mark.parametrize("name", sorted(REQUEST_EXAMPLES))
def test_encode_request_size_matches_body(name: str) -> None:
    number, _ = REQUESTS[name]
    args = REQUEST_EXAMPLES[name]
    raw = encode_request(number, *args)
    magic, ptype, size = struct.unpack(">4sII", raw[:12])
    assert (magic, ptype) == (REQ_MAGIC, number)
    assert size == len(raw) - 12 == len(b"\0".join(args))


@pytest.mark.parametrize("name", sorted(RESPONSE_EXAMPLES))
def test_encode_response_size_matches_body(name: str) -> None:
    number, _ = RESPONSES[name]
    args = RESPONSE_EXAMPLES[name]
    raw = encode(number, *args)
    magic, ptype, size = struct.unpack(">4sII", raw[:12])
    assert (magic, ptype) == (RES_MAGIC, number)
    assert size == len(raw) - 12 == len(b"\0".join(args))


def test_packet_equality_hash_and_repr() -> None:
    a = Packet(PacketType.CAN_DO, (b"fn",))
    assert a == Packet(1, (b"fn",))
    assert a != Packet(PacketType.CANT_DO, (b"fn",))
    assert a != Packet(PacketType.CAN_DO, (b"other",))
    assert a != (1, (b"fn",))
    assert hash(a) == hash(Packet(1, (b"fn",)))
    assert len({a, Packet(1, (b"fn",))}) == 1
    assert repr(a) == "Packet(CAN_DO, (b'fn',))"
    assert repr(Packet(99, ())) == "Packet(99, ())"
