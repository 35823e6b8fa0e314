"""The WMP codec (protocols/zmq/wmp.py), sans-IO: every command round-trips with any
headers and payload, envelopes split at their delimiter, `via` is a stack, the role rule,
and arbitrary frames never raise anything but the codec's own error."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobwire.protocols.zmq import wmp
from jobwire.protocols.zmq.wmp import Message, WmpError

commands = st.sampled_from(sorted(wmp.COMMANDS))
keys = st.from_regex(r"[a-z0-9-]{1,12}", fullmatch=True)
values = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r"), max_size=30
)
headers = st.dictionaries(keys, values, max_size=6)
payload = st.lists(st.binary(max_size=40), max_size=4)
hop = st.binary(min_size=1, max_size=8)


@given(commands, headers, payload)
def test_every_command_round_trips(
    command: bytes, heads: dict[str, str], frames: list[bytes]
) -> None:
    body = wmp.encode(command, heads, frames)
    assert body[0] == wmp.SIGNATURE and body[1] == command
    assert wmp.decode(body) == Message(command, heads, tuple(frames))


@given(st.lists(hop, max_size=wmp.MAX_HOPS), commands, headers, payload)
def test_envelopes_split_at_the_delimiter(
    hops: list[bytes], command: bytes, heads: dict[str, str], frames: list[bytes]
) -> None:
    body = wmp.encode(command, heads, frames)
    assert wmp.split_envelope(wmp.with_envelope(hops, body)) == (tuple(hops), body)


@given(st.lists(st.binary(max_size=12), max_size=8))
def test_arbitrary_frames_raise_only_wmp_error(frames: list[bytes]) -> None:
    with contextlib.suppress(WmpError):
        wmp.decode(frames)
    with contextlib.suppress(WmpError):
        wmp.decode(wmp.split_envelope(frames)[1])


@given(st.binary(max_size=200))
def test_arbitrary_header_frames_raise_only_wmp_error(raw: bytes) -> None:
    with contextlib.suppress(WmpError):
        heads = wmp.decode_headers(raw)
        assert wmp.decode_headers(wmp.encode_headers(heads)) == heads


@given(st.lists(st.integers(min_value=0, max_value=999), min_size=1, max_size=6), commands)
def test_via_is_a_stack(links: list[int], command: bytes) -> None:
    message = Message(command, {"job": "j"})
    for link in links:
        message = wmp.push_via(message, link)
    assert message.get("via") == ".".join(map(str, links))
    for link in reversed(links):
        popped, message = wmp.pop_via(message)
        assert popped == link
    assert message == Message(command, {"job": "j"})


def test_the_signature_decides_what_is_answered() -> None:
    with pytest.raises(WmpError) as dropped:
        wmp.decode([b"WMP02", wmp.READY, b""])
    assert not dropped.value.answerable
    with pytest.raises(WmpError) as answered:
        wmp.decode([wmp.SIGNATURE, b"NOPE", b""])
    assert answered.value.answerable
    with pytest.raises(WmpError, match="without via"):
        wmp.pop_via(Message(wmp.GIVE))


def test_headers_refuse_what_cannot_be_framed() -> None:
    with pytest.raises(ValueError):
        wmp.encode_headers({"Bad": 1})
    with pytest.raises(ValueError):
        wmp.encode_headers({"reason": "two\nlines"})
    assert wmp.encode_headers({"a": 1, "skip": None}) == b"a=1"
    assert Message(wmp.READY, {"functions": " a, ,b "}).items("functions") == ["a", "b"]
    with pytest.raises(WmpError):
        Message(wmp.READY, {"lease": "-1"}).number("lease")


def test_the_role_rule() -> None:
    assert wmp.role_functions("resize", []) == ["resize"]
    assert wmp.role_functions("resize", ["gpu", "eu"]) == [
        "resize",
        "resize@eu",
        "resize@gpu",
        "resize@eu+gpu",
    ]
    assert wmp.split_function("resize@eu+gpu") == ("resize", ("eu", "gpu"))
    assert wmp.split_function("resize") == ("resize", ())
    assert not wmp.valid_name("a,b") and not wmp.valid_name("a@b") and wmp.valid_name("gpu")
