"""The ZeroMQ codecs (protocols/zmq), sans-IO: every Majordomo command of both versions
round-trips, arbitrary frames never raise anything but the codec's own error, PPP frames,
the frames <-> payload rule and Titanic's names."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobwire.protocols.zmq import frames, freelance, mdp, ppp, services
from jobwire.protocols.zmq.mdp import MdpError, Version

V1, V2 = Version.V1, Version.V2
versions = st.sampled_from([V1, V2])
frame = st.binary(max_size=40)
body = st.lists(frame, min_size=1, max_size=5)
name = st.binary(min_size=1, max_size=20)


@given(versions, name, body)
def test_client_request_round_trips(version: Version, service: bytes, parts: list[bytes]) -> None:
    assert mdp.decode(mdp.request(version, service, parts)) == mdp.Request(
        version, service, tuple(parts)
    )


@given(versions, name, body, st.booleans())
def test_replies_round_trip(
    version: Version, service: bytes, parts: list[bytes], final: bool
) -> None:
    if version is V1 and not final:
        with pytest.raises(ValueError):
            mdp.reply(version, service, parts, final=False)
        return
    assert mdp.decode_reply(mdp.reply(version, service, parts, final=final)) == mdp.Reply(
        version, service, tuple(parts), final
    )


@given(versions, name, frame, body, st.booleans())
def test_worker_commands_round_trip(
    version: Version, service: bytes, client: bytes, parts: list[bytes], final: bool
) -> None:
    assert mdp.decode(mdp.ready(version, service)) == mdp.Ready(version, service)
    assert mdp.decode(mdp.heartbeat(version)) == mdp.Heartbeat(version)
    assert mdp.decode(mdp.disconnect(version)) == mdp.Disconnect(version)
    if version is V2 or final:
        sent = mdp.worker_reply(version, client, parts, final=final)
        assert mdp.decode(sent) == mdp.WorkerReply(version, client, tuple(parts), final)
    to_worker = mdp.worker_request(version, client, parts)
    assert mdp.decode_for_worker(to_worker) == mdp.WorkerRequest(version, client, tuple(parts))
    assert mdp.decode_for_worker(mdp.heartbeat(version)) == mdp.Heartbeat(version)
    assert mdp.decode_for_worker(mdp.disconnect(version)) == mdp.Disconnect(version)


def test_the_command_bytes_differ_between_versions() -> None:
    """HEARTBEAT is 0x04 in 0.1 and 0x05 in 0.2; DISCONNECT 0x05 and 0x06."""
    assert mdp.heartbeat(V1) == [b"", b"MDPW01", b"\x04"]
    assert mdp.heartbeat(V2) == [b"MDPW02", b"\x05"]
    assert mdp.disconnect(V1) == [b"", b"MDPW01", b"\x05"]
    assert mdp.disconnect(V2) == [b"MDPW02", b"\x06"]
    assert mdp.reply(V2, b"s", [b"x"], final=False)[1] == b"\x02"
    assert mdp.reply(V2, b"s", [b"x"])[1] == b"\x03"


@pytest.mark.parametrize(
    "bad",
    [
        [],
        [b""],
        [b"", b"MDPX01", b"s", b"x"],
        [b"", b"MDPC01", b"s"],  # no body
        [b"MDPC02", b"\x02", b"s", b"x"],  # a client may only send REQUEST
        [b"", b"MDPW01", b"\x01"],  # READY without service
        [b"", b"MDPW01", b"\x01", b"s", b"extra"],  # READY with too much
        [b"", b"MDPW01", b"\x03", b"client", b"not-empty", b"x"],
        [b"", b"MDPW01", b"\x04", b"extra"],  # HEARTBEAT has exactly 3 frames
        [b"MDPW02", b"\x07"],  # unknown command byte
        [b"MDPW02"],
    ],
)
def test_invalid_messages_raise_the_codec_error(bad: list[bytes]) -> None:
    with pytest.raises(MdpError):
        mdp.decode(bad)


@given(st.lists(frame, max_size=8))
def test_arbitrary_frames_never_crash_the_decoders(parts: list[bytes]) -> None:
    for decoder in (mdp.decode, mdp.decode_reply, mdp.decode_for_worker):
        with contextlib.suppress(MdpError):
            decoder(parts)
    for ppp_decoder in (ppp.decode_backend, ppp.decode_frontend):
        with contextlib.suppress(ppp.PppError):
            ppp_decoder(parts)


@given(st.lists(frame, min_size=1, max_size=3), body)
def test_ppp_envelopes_round_trip(address: list[bytes], parts: list[bytes]) -> None:
    address = [a or b"x" for a in address]  # an address frame is never empty
    assert ppp.decode_backend(ppp.request(address, parts)) == ppp.Reply(
        tuple(address), tuple(parts)
    )
    assert ppp.decode_frontend(ppp.request(address, parts)) == ppp.ClientRequest(
        tuple(address), tuple(parts)
    )
    assert ppp.decode_backend([ppp.READY]) == ppp.Ready()
    assert ppp.decode_backend([ppp.HEARTBEAT]) == ppp.Heartbeat()


@given(body)
def test_frames_and_payload_round_trip(parts: list[bytes]) -> None:
    payload, sizes = frames.join(parts)
    assert payload == b"".join(parts)
    assert frames.split(payload, sizes) == parts
    assert (sizes is None) == (len(parts) == 1)


def test_sizes_that_do_not_fit_the_payload_give_one_frame() -> None:
    assert frames.split(b"abc", [1, 1]) == [b"abc"]
    assert frames.split(b"abc", [4, -1]) == [b"abc"]
    assert frames.split(b"abc", None) == [b"abc"]


def test_internal_service_names() -> None:
    assert services.is_internal(b"mmi.service") and services.is_internal(b"mmi.anything")
    assert services.is_internal(b"titanic.request")
    assert not services.is_internal(b"echo")
    assert services.is_uuid(b"0123456789abcdef0123456789abcdef")
    assert not services.is_uuid(b"0123456789ABCDEF0123456789ABCDEF")
    assert not services.is_uuid(b"short")


@given(st.booleans(), name, name, body)
def test_freelance_requests_and_replies(
    dealer: bool, control: bytes, service: bytes, parts: list[bytes]
) -> None:
    """A control frame is never empty: an empty first frame is the DEALER envelope."""
    envelope = [b""] if dealer else []
    message = freelance.decode([*envelope, control, service, *parts])
    assert message == freelance.Request(tuple(envelope), control, service, tuple(parts))
    assert freelance.reply(message, [b"r"]) == [*envelope, control, b"r"]
    ping = freelance.decode([*envelope, freelance.PING])
    assert freelance.pong(ping) == [*envelope, freelance.PONG]  # type: ignore[arg-type]


@given(st.lists(frame, max_size=6))
def test_arbitrary_frames_never_crash_the_freelance_decoder(parts: list[bytes]) -> None:
    with contextlib.suppress(freelance.FreelanceError):
        freelance.decode(parts)
