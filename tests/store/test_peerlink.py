"""The peer links' pieces that need no cluster: addresses and frames (store/peerlink.py).
The links themselves are driven between real nodes in tests/cluster/test_peerlink.py."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from jobwire.store.peerlink import FRAME_MAX, encode, read_frame, split_address


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1", ("127.0.0.1", 0)),
        ("10.0.0.7:4740", ("10.0.0.7", 4740)),
        (":4740", ("0.0.0.0", 4740)),
        ("[::1]:4740", ("::1", 4740)),
        ("::", ("::", 0)),
        ("node-a.internal", ("node-a.internal", 0)),
    ],
)
def test_an_address_gives_its_host_and_port(address: str, expected: tuple[str, int]) -> None:
    assert split_address(address) == expected


def frames(data: bytes, limit: int = FRAME_MAX) -> list[tuple[dict[str, object], bytes]]:
    async def read() -> list[tuple[dict[str, object], bytes]]:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        got = []
        while not reader.at_eof():
            got.append(await read_frame(reader, limit))
        return got

    return asyncio.run(read())


def test_frames_carry_a_header_and_raw_bytes() -> None:
    payload = bytes(range(256)) * 4
    data = encode({"o": "run", "j": "H:n1:7"}, payload) + encode({"o": "ok"})
    assert frames(data) == [({"o": "run", "j": "H:n1:7"}, payload), ({"o": "ok"}, b"")]


@pytest.mark.parametrize(
    "data",
    [
        b"\0\0\0\x02\0\0\0\0",  # shorter than its own header length field
        b"\0\0\0\x08\0\0\0\x09abcd",  # a header longer than the frame
        b"\0\0\0\x06\0\0\0\x02[]",  # a header that is not an object
        encode({"o": "x"}, b"y" * 2000),  # larger than the limit
    ],
)
def test_a_malformed_frame_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        frames(data, limit=1024)


def test_serve_refuses_a_peer_address_it_cannot_listen_on() -> None:
    ran = subprocess.run(
        [sys.executable, "-m", "jobwire", "serve", "--peer-listen", "127.0.0.1:port"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode != 0
    assert "--peer-listen" in ran.stderr and "expected HOST" in ran.stderr
