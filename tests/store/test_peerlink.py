"""The peer links' pieces that need no cluster: addresses and frames (store/peerlink.py).
The links themselves are driven between real nodes in tests/cluster/test_peerlink.py."""

from __future__ import annotations

import asyncio
import base64
import socket
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from jobwire.engine.job import JobState
from jobwire.store.peerlink import (
    CHALLENGE_BYTES,
    FRAME_MAX,
    GREETING,
    SILENT_LINK,
    Carried,
    Inbound,
    Outbound,
    _tune,
    answer,
    encode,
    read_frame,
    split_address,
)


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


def _dial_fake_node(proof: str | None) -> tuple[BaseException | None, dict[str, int]]:
    """An `Outbound` dialing a listener that knows the secret (`proof` None: it answers
    rightly) or not (it answers `proof`): how the dial ended, and the free workers heard."""
    secret = b"cluster secret"
    links: Any = SimpleNamespace(node=1, secret=secret)

    async def listener(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        challenge = b"c" * CHALLENGE_BYTES
        writer.write(GREETING + challenge)
        header, _ = await read_frame(reader, 1024)
        assert header["mac"] == answer(secret, b"dialer", challenge)
        mac = proof or answer(secret, b"listener", bytes.fromhex(header["c"]))
        writer.write(
            encode({"o": "ok", "mac": mac})
            + encode({"o": "free", "f": "fn", "n": 3})
            + encode({"o": "ready"})
        )
        await writer.drain()
        writer.close()

    async def main() -> tuple[BaseException | None, dict[str, int]]:
        server = await asyncio.start_server(listener, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        link = Outbound(links, 2, f"127.0.0.1:{port}")
        try:
            await link._serve()
        except (ValueError, asyncio.IncompleteReadError) as exc:
            return exc, link.free
        finally:
            server.close()
        return None, link.free

    return asyncio.run(main())


def test_a_dialer_links_only_to_a_node_that_proves_it_knows_the_secret() -> None:
    ended, free = _dial_fake_node(None)
    assert isinstance(ended, asyncio.IncompleteReadError)  # linked, until the node closed
    assert free == {"fn": 3}
    ended, free = _dial_fake_node("00" * 32)
    assert isinstance(ended, ValueError) and "secret" in str(ended)
    assert free == {}  # nothing heard, nothing handed: the link never began


def test_a_link_notices_an_other_end_gone_silent() -> None:
    """Keepalive probes and a bound on unacknowledged data: a link whose packets are
    dropped breaks in `SILENT_LINK` seconds, and its jobs are dealt with as on any break."""

    async def main() -> tuple[int, ...]:
        server = await asyncio.start_server(lambda _r, _w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        _tune(writer)
        sock = writer.get_extra_info("socket")
        options = (
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
        )
        writer.close()
        server.close()
        return options

    assert asyncio.run(main()) == (1, 1, SILENT_LINK * 1000)


class _Writer:
    """A link's writer: what was written, and whether it is closing (the link broke)."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closing = False

    def is_closing(self) -> bool:
        return self.closing

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None:
        self.closing = True


def test_a_link_keeps_what_its_dialer_did_not_read_and_settles_once() -> None:
    writer = _Writer()
    link = Inbound(writer, 1, "ab" * CHALLENGE_BYTES)  # type: ignore[arg-type]
    link.send({"o": "free", "f": "fn", "n": 1})  # frame 1: never kept
    link.send({"o": "got", "j": "a"})  # 2
    link.send({"o": "f", "j": "a", "s": 4}, b"result")  # 3
    link.read_up_to(2)  # the dialer read frames 1 and 2
    writer.closing = True  # broken on this side: kept, not written
    link.send({"o": "p", "j": "b", "d": 1, "t": 2})  # 4
    assert len(writer.written) == 3
    kept_client, gone_client = object(), object()
    link.jobs = {"b": kept_client, "c": gone_client, "d": kept_client}  # type: ignore[dict-item]
    jobs = {
        "b": SimpleNamespace(state=JobState.ACTIVE, subscribers=[kept_client]),
        "c": SimpleNamespace(state=JobState.COMPLETED, subscribers=[gone_client]),
        "d": SimpleNamespace(state=JobState.ACTIVE, subscribers=[object()]),  # another's now
    }
    answered = link.settle(2, jobs)
    assert answered == {
        "f": [
            ({"o": "f", "j": "a", "s": 4}, base64.b64encode(b"result").decode()),
            ({"o": "p", "j": "b", "d": 1, "t": 2}, ""),
        ],
        "k": ["b"],
    }
    link.send({"o": "f", "j": "b", "s": 4}, b"later")  # by notification once settled
    assert link.sent == 4 and len(link.unread) == 2


def test_a_settling_hears_the_frames_it_missed_before_the_news_that_came_meanwhile() -> None:
    """The other node's answer carries what it sent on the link before it stopped; news by
    notification of the same jobs, which came after, waits for it. Jobs it does not keep
    come back; kept ones stay detached, their news heard at once from then on."""
    heard: list[tuple[Any, ...]] = []
    cluster = SimpleNamespace(
        tell_progress=lambda job_id, done, total: heard.append(("p", job_id)),
        tell_output=lambda job_id, kind, data: heard.append(("o", job_id, data)),
        tell_finished=lambda job_id, state, result, error: heard.append(("f", job_id, result)),
        deliver=lambda message: heard.append(("news", message["j"], message["e"])),
        take_back=lambda job: heard.append(("back", job.id)),
        waits={"a": ["client"]},
    )
    links = SimpleNamespace(cluster=cluster, remote=None, closing=False)

    async def main() -> None:
        link = Outbound(links, 2, "127.0.0.1:1")  # type: ignore[arg-type]
        carried = Carried("ab" * CHALLENGE_BYTES)
        jobs = {name: SimpleNamespace(id=name, function="fn") for name in "abc"}
        carried.handed = jobs  # type: ignore[assignment]
        link.settling.append(carried)
        assert link.hold_news("a", {"j": "a", "e": "f"})  # before the answer: held
        assert not link.hold_news("z", {"j": "z", "e": "f"})  # not of this link
        missed = [
            ({"o": "o", "j": "a", "k": 1}, base64.b64encode(b"part").decode()),
            ({"o": "f", "j": "c", "s": 4, "n": 0, "r": True}, base64.b64encode(b"done").decode()),
        ]
        link._answered(carried, {"f": missed, "k": ["a"]})
        assert heard == [
            ("o", "a", b"part"),
            ("f", "c", b"done"),
            ("news", "a", "f"),
            ("back", "b"),
        ]
        assert link.detached == {"a": jobs["a"]} and link.settling == []
        assert not link.hold_news("a", {"j": "a", "e": "p"})  # settled: heard at once
        assert link._watching is not None
        link._watching.cancel()

    asyncio.run(main())
