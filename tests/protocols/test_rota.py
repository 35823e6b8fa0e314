"""The Rota codec (protocols/rota): JSON frames in, typed messages out, and back."""

from __future__ import annotations

import contextlib
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobwire.protocols.rota import (
    NO_VALUE,
    Alert,
    Assignment,
    CloseCode,
    ErrorCode,
    ErrorMessage,
    Failure,
    Heartbeat,
    JobCopy,
    LogBatch,
    Progress,
    Registration,
    Revoke,
    RotaError,
    SpecRef,
    SpecsChanged,
    SpecVerdict,
    Status,
    Success,
    Welcome,
    decode_server_message,
    decode_worker_message,
    encode,
)

SETTINGS = settings(
    max_examples=150,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def frame(**fields: Any) -> bytes:
    return orjson.dumps({"v": 1, "type": "heartbeat", **fields})


def refused(data: bytes | str, **kwargs: Any) -> RotaError:
    with pytest.raises(RotaError) as info:
        decode_worker_message(data, **kwargs)
    return info.value


def test_first_heartbeat_registers() -> None:
    hb = decode_worker_message(
        frame(
            seq=0,
            register={
                "hostname": "box",
                "os": "Linux",
                "pid": 42,
                "queues": ["default", "images"],
                "specs": [{"name": "resize", "checksum": "ab" * 32}],
            },
            wants=4,
        )
    )
    assert hb == Heartbeat(
        seq=0,
        register=Registration(
            "box", "Linux", 42, ("default", "images"), (SpecRef("resize", "ab" * 32),)
        ),
        wants=4,
    )


def test_registration_without_queues_takes_every_queue() -> None:
    hb = decode_worker_message(frame(register={"specs": []}))
    assert hb.register == Registration("", "", None, None, ())


def test_status_and_results() -> None:
    hb = decode_worker_message(
        frame(
            status={
                "cpu": 12.5,
                "ram": 1024,
                "progress": [{"job": "j1", "current": 3, "total": 10}],
                "logs": [{"job": "j1", "lines": ["one", ""]}],
                "alerts": [{"level": "error", "message": "disk full", "job": "j1"}],
            },
            results=[
                {"job": "j1", "outcome": "success", "data": {"ok": True}},
                {"job": "j2", "outcome": "success", "data": "text"},
                {"job": "j3", "outcome": "success", "data_base64": "AAE="},
                {"job": "j4", "outcome": "failure", "error": {"code": "boom", "message": "m"}},
                {"job": "j5", "outcome": "failure", "error": {"retryable": True}},
            ],
        )
    )
    assert hb.status == Status(
        12.5,
        1024,
        (Progress("j1", 3, 10),),
        (LogBatch("j1", ("one", "")),),
        (Alert("error", "disk full", "j1"),),
    )
    assert hb.results == (
        Success("j1", b'{"ok":true}', {"ok": True}),
        Success("j2", b"text", "text"),
        Success("j3", b"\x00\x01"),
        Failure("j4", "boom", "m", False, None),
        Failure("j5", "error", "", True, None),
    )
    assert hb.results[2].value is NO_VALUE  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"{not json", ErrorCode.MALFORMED_JSON),
        (b"\xff\xfe", ErrorCode.MALFORMED_JSON),
        (b"[1, 2]", ErrorCode.INVALID_MESSAGE),
        (
            b'{"v": 1, "type": "heartbeat", "x": ' + b"[" * 200 + b"]" * 200 + b"}",
            ErrorCode.INVALID_MESSAGE,
        ),
        (b'{"type": "heartbeat"}', ErrorCode.UNSUPPORTED_VERSION),
        (b'{"v": 2, "type": "heartbeat"}', ErrorCode.UNSUPPORTED_VERSION),
        (b'{"v": true, "type": "heartbeat"}', ErrorCode.UNSUPPORTED_VERSION),
        (b'{"v": 1}', ErrorCode.INVALID_MESSAGE),
        (b'{"v": 1, "type": "dance", "seq": 7}', ErrorCode.UNKNOWN_TYPE),
        (frame(wants=-1), ErrorCode.INVALID_MESSAGE),
        (frame(wants=True), ErrorCode.INVALID_MESSAGE),
        (frame(wants=1.5), ErrorCode.INVALID_MESSAGE),
        (frame(seq="x"), ErrorCode.INVALID_MESSAGE),
        (frame(register=[]), ErrorCode.INVALID_MESSAGE),
        (frame(register={"specs": [{"name": "a"}]}), ErrorCode.INVALID_MESSAGE),
        (frame(register={"queues": [""]}), ErrorCode.INVALID_MESSAGE),
        (frame(status={"cpu": -1}), ErrorCode.INVALID_MESSAGE),
        (frame(status={"progress": [{"job": "j", "current": 1}]}), ErrorCode.INVALID_MESSAGE),
        (frame(status={"alerts": [{"level": "panic", "message": "x"}]}), ErrorCode.INVALID_MESSAGE),
        (frame(status={"logs": [{"job": "j", "lines": [1]}]}), ErrorCode.INVALID_MESSAGE),
        (frame(results={"job": "j"}), ErrorCode.INVALID_MESSAGE),
        (frame(results=[{"job": "j", "outcome": "maybe"}]), ErrorCode.INVALID_MESSAGE),
        (frame(results=[{"outcome": "success"}]), ErrorCode.INVALID_MESSAGE),
        (
            frame(results=[{"job": "j", "outcome": "success", "data_base64": "!!"}]),
            ErrorCode.INVALID_MESSAGE,
        ),
        (
            frame(results=[{"job": "j", "outcome": "success", "data": 1, "data_base64": ""}]),
            ErrorCode.INVALID_MESSAGE,
        ),
    ],
)
def test_bad_input_is_refused_with_a_code(data: bytes, code: ErrorCode) -> None:
    assert refused(data).code is code


def test_only_unknown_types_leave_the_connection_open() -> None:
    unknown = refused(b'{"v": 1, "type": "dance", "seq": 7}')
    assert not unknown.fatal and unknown.close_code is None
    assert unknown.seq == 7
    assert refused(b"{").close_code is CloseCode.INVALID_PAYLOAD
    assert refused(frame(wants=-1)).close_code is CloseCode.PROTOCOL_ERROR
    assert refused(b'{"v": 9}').close_code is CloseCode.PROTOCOL_ERROR


def test_field_errors_name_the_path() -> None:
    error = refused(frame(seq=3, status={"progress": [{"job": "j", "current": "1", "total": 2}]}))
    assert "status.progress[0].current" in error.message
    assert error.seq == 3


def test_oversized_messages_are_refused_before_parsing() -> None:
    error = refused(frame(pad="x" * 100), max_size=50)
    assert error.code is ErrorCode.MESSAGE_TOO_BIG
    assert error.close_code is CloseCode.MESSAGE_TOO_BIG


def test_unknown_fields_are_ignored() -> None:
    assert decode_worker_message(frame(future={"x": 1}, wants=1)).wants == 1


HEARTBEATS = [
    Heartbeat(),
    Heartbeat(
        seq=5,
        register=Registration("h", "Linux", 1, None, (SpecRef("a", "c" * 64),)),
        wants=2,
        status=Status(
            1.5, 10, (Progress("j", 1, 2),), (LogBatch("j", ("x",)),), (Alert("info", "hi"),)
        ),
        results=(
            Success("j", b"ok", "ok"),
            Success("k", b"\xff"),
            Success("l", b"[1]", [1]),
            Failure("m", "c", "msg", False, {"trace": "t"}),
        ),
    ),
]


@pytest.mark.parametrize("hb", HEARTBEATS)
def test_heartbeats_round_trip(hb: Heartbeat) -> None:
    assert decode_worker_message(encode(hb)) == hb


SERVER_MESSAGES = [
    Welcome("rota:1", 5.0, 1024, (SpecVerdict("a", "c", True), SpecVerdict("b", "d", False, "x"))),
    Assignment(JobCopy("j1", "resize", "default", b"[1]", [1], 0, 1, 3, "2026-01-01T00:00:00Z")),
    Assignment(
        JobCopy("j2", "raw", "raw", b"\xff\x00", ["\ufffd\x00"], -1, 2, None, None, {}), True
    ),
    Revoke("j1", "cancelled"),
    SpecsChanged((SpecVerdict("a", "c", True),)),
    ErrorMessage("job_not_held", "nope", False, "j1", 4),
]


@pytest.mark.parametrize("message", SERVER_MESSAGES)
def test_server_messages_round_trip(message: Any) -> None:
    assert decode_server_message(encode(message)) == message


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=20,
)


@SETTINGS
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_crash_the_decoder(data: bytes) -> None:
    with contextlib.suppress(RotaError):
        decode_worker_message(data)


@SETTINGS
@given(st.dictionaries(st.sampled_from(["register", "status", "results", "wants", "seq"]), _json))
def test_arbitrary_heartbeat_fields_never_crash_the_decoder(fields: dict[str, Any]) -> None:
    try:
        decode_worker_message(frame(**fields))
    except RotaError as exc:
        assert exc.code in (ErrorCode.INVALID_MESSAGE,)


_name = st.text(min_size=1, max_size=20)
_ints = st.integers(min_value=0, max_value=2**53 - 1)


@SETTINGS
@given(
    st.builds(
        Heartbeat,
        seq=st.none() | _ints,
        wants=st.none() | st.integers(min_value=0, max_value=100_000),
        status=st.none()
        | st.builds(
            Status,
            cpu=st.none() | st.floats(min_value=0, max_value=1e6),
            ram=st.none() | _ints,
            progress=st.lists(st.builds(Progress, _name, _ints, _ints), max_size=3).map(tuple),
            logs=st.lists(
                st.builds(LogBatch, _name, st.lists(st.text(), max_size=3).map(tuple)), max_size=3
            ).map(tuple),
        ),
        results=st.lists(
            st.builds(Success, _name, st.binary(max_size=20))
            | st.builds(Failure, _name, _name, st.text(), st.booleans()),
            max_size=3,
        ).map(tuple),
    )
)
def test_encoded_heartbeats_decode_to_themselves(hb: Heartbeat) -> None:
    assert decode_worker_message(encode(hb)) == hb
