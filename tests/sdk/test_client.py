"""Client and AsyncClient round trips against jobwire and gearmand, and Lazy Pirate retries."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator

import pytest

from jobwire import AsyncClient, Client, JobException, JobFailed, ServerUnavailable, Timeout
from jobwire.protocols.gearman import Packet, encode_request
from jobwire.sdk import Handle, JobStatus, Update
from jobwire.sdk.connection import Connection
from jobwire.sdk.session import Request, Session, submit_type
from tests.interop.gearman_raw import priority_status, wait_until
from tests.sdk.support import Markers, P, as_json, fake_server
from tests.servers import ServerProcess, free_port


@pytest.fixture
def client(served: ServerProcess) -> Iterator[Client]:
    with Client([served.address], timeout=10.0) as client:
        yield client


def test_submit_payload_rule(client: Client) -> None:
    assert client.submit("echo", b"\x00raw\xff") == b"\x00raw\xff"
    assert client.submit("echo", "héllo") == "héllo".encode()
    assert client.submit("echo") == b""
    assert client.submit("reverse", bytearray(b"abc")) == b"cba"
    assert as_json(client.submit("json", {"a": [1, 2]})) == {"got": {"a": [1, 2]}}
    assert client.submit("text", "shout") == b"SHOUT"


def test_submit_each_priority(client: Client) -> None:
    for priority in ("high", "normal", "low"):
        assert client.submit("reverse", "abc", priority=priority) == b"cba"  # type: ignore[arg-type]


def test_background_priorities_reach_their_queues(any_server: ServerProcess) -> None:
    with Client([any_server.address]) as client:
        for priority in ("high", "normal", "normal", "low"):
            client.submit_background("nobody", b"x", priority=priority)  # type: ignore[arg-type]
    assert priority_status(any_server)["nobody"] == (1, 2, 1, 0)


def test_task_errors_reach_the_client(client: Client) -> None:
    with pytest.raises(JobException) as raised:
        client.submit("raise", "zap")
    assert raised.value.data == b"ValueError: bad input: zap"
    with pytest.raises(JobException, match="KeyError"):
        client.submit("async_raise")
    with pytest.raises(JobException, match="cannot send object"):
        client.submit("bad_return")
    with pytest.raises(JobException, match="SystemExit"):
        client.submit("system_exit")
    with pytest.raises(JobFailed) as failed:
        client.submit("fail")
    assert not isinstance(failed.value, JobException)
    # The worker is still there and well.
    assert client.submit("echo", "alive") == b"alive"


def test_task_timeouts_fail_the_job_and_spare_the_worker(client: Client) -> None:
    for function in ("stuck_thread", "stuck_async"):
        with pytest.raises(JobFailed) as failed:
            client.submit(function)
        assert not isinstance(failed.value, JobException)
    assert client.submit_many("echo", ["a", "b", "c"]) == [b"a", b"b", b"c"]


def test_updates_reach_callbacks(client: Client) -> None:
    seen: list[object] = []
    result = client.submit(
        "updates",
        on_data=lambda data: seen.append(("data", data)),
        on_warning=lambda data: seen.append(("warning", data)),
        on_status=lambda n, d: seen.append(("status", n, d)),
    )
    assert result == b"done"
    assert seen == [("status", 1, 3), ("data", b"first"), ("warning", b"careful"), ("status", 3, 3)]
    seen.clear()
    assert client.submit("thread_updates", on_data=seen.append) == b"done"
    assert seen == [b"from a thread"]


def test_sync_stream(client: Client) -> None:
    assert list(client.stream("thread_updates")) == [
        Update("status", numerator=1, denominator=2),
        Update("data", b"from a thread"),
        Update("complete", b"done"),
    ]


def test_async_client_round_trips(served: ServerProcess) -> None:
    async def main() -> None:
        async with AsyncClient([served.address]) as client:
            assert await client.submit("reverse", "async") == b"cnysa"
            kinds = [update.kind async for update in client.stream("updates")]
            assert kinds == ["status", "data", "warning", "status", "complete"]
            results = await asyncio.gather(*(client.submit("echo", str(i)) for i in range(20)))
            assert results == [str(i).encode() for i in range(20)]
            with pytest.raises(JobException):
                async for _ in client.stream("raise", "x"):
                    pass
            handle = await client.submit_background("echo", "bg")
            assert isinstance(handle, Handle)

    asyncio.run(main())


def test_submit_many_pipelined(client: Client) -> None:
    payloads = [f"job {i}" for i in range(100)]
    assert client.submit_many("reverse", payloads) == [p[::-1].encode() for p in payloads]
    handles = client.submit_many("echo", payloads[:10], background=True)
    assert len(set(handles)) == 10 and all(isinstance(h, Handle) for h in handles)


class StubConnection(Connection):
    """A Connection never connected, that keeps what a Session writes (a subclass: the SDK's
    compiled Session takes nothing else)."""

    def __init__(self) -> None:
        super().__init__(("stub", 4730), lambda packet: None)
        self.is_open = True
        self.writes: list[bytes] = []
        self.wrote = asyncio.Event()

    def write(self, data: bytes) -> None:
        self.writes.append(data)
        self.wrote.set()


def test_submit_many_is_one_write_with_replies_matched_in_order() -> None:
    async def main() -> None:
        conn = StubConnection()
        session = Session(conn)
        bg = submit_type("normal", True)
        requests = [Request(encode_request(bg, b"f", b"u%d" % i, b"x")) for i in range(5)]
        batch = asyncio.ensure_future(session.run(requests, timeout=30))
        await conn.wrote.wait()
        assert len(conn.writes) == 1 and conn.writes[0].count(b"\0REQ") == 5
        for i in range(5):
            session.packet(Packet(P.JOB_CREATED, (b"H:%d" % i,)))
        assert await batch == [f"H:{i}" for i in range(5)]

    asyncio.run(main())


def test_submit_many_errors(client: Client) -> None:
    with pytest.raises(JobException):
        client.submit_many("raise", ["a", "b"])
    outcomes = client.submit_many("raise", ["a"], return_exceptions=True)
    assert isinstance(outcomes[0], JobException)


def test_background_status(served: ServerProcess, client: Client) -> None:
    markers = Markers()
    handle = client.submit_background("block", markers.spec("bg"), unique="bg-1")
    assert handle.server == served.address
    markers.wait_started("bg")
    assert client.status(handle) == JobStatus(True, True, 0, 0)
    assert client.status(str(handle)).known  # a plain string is asked of every server
    unique_status = client.status_unique("bg-1")
    assert unique_status.known and unique_status.running
    markers.release("bg")
    wait_until(lambda: not client.status(handle).known, "the job to finish")
    assert client.status_unique("bg-1") == JobStatus(False, False, clients=0)


def test_unique_coalesces_foreground_jobs(served: ServerProcess) -> None:
    markers = Markers()
    spec = markers.spec("co")

    async def main() -> list[bytes]:
        async with AsyncClient([served.address]) as one, AsyncClient([served.address]) as two:
            first = asyncio.ensure_future(one.submit("block", spec, unique="co"))
            await asyncio.to_thread(markers.wait_started, "co")
            second = asyncio.ensure_future(two.submit("block", spec, unique="co"))
            await asyncio.to_thread(
                wait_until, lambda: client_count(served) == 2, "two waiting clients"
            )
            markers.release("co")
            return list(await asyncio.gather(first, second))

    def client_count(server: ServerProcess) -> int | None:
        with Client([server.address]) as other:
            return other.status_unique("co").clients

    assert asyncio.run(main()) == [b"released co", b"released co"]
    assert len(markers.starts("co")) == 1


def test_threads_share_one_client(served: ServerProcess, client: Client) -> None:
    """Calls from several threads run at once over one Client: each thread runs the Client's
    loop in turn, and a call made while another thread runs it rides along."""
    markers = Markers()
    results: dict[str, object] = {}

    def submit(job_id: str) -> None:
        results[job_id] = client.submit("block", markers.spec(job_id))

    first = threading.Thread(target=submit, args=("first",))
    first.start()
    markers.wait_started("first")
    # The first call is running the loop, blocked on its job: this one must not wait for it.
    assert client.submit("reverse", "abc") == b"cba"
    second = threading.Thread(target=submit, args=("second",))
    second.start()
    markers.wait_started("second")
    markers.release("first")
    first.join(30)
    assert results.get("first") == b"released first"
    # The first thread has returned; the second now runs the loop for its own job.
    markers.release("second")
    second.join(30)
    assert results.get("second") == b"released second"


def test_timeout_raises_and_leaves_the_job(served: ServerProcess, client: Client) -> None:
    markers = Markers()
    with pytest.raises(Timeout):
        client.submit("block", markers.spec("slow"), unique="slow", timeout=0.2)
    assert client.status_unique("slow").known
    markers.release("slow")


def test_busy_polls_while_waiting_and_only_then(served: ServerProcess) -> None:
    """The client polls without sleeping while a job it waits on runs (the budget here is
    far longer than the test), and stops once nothing is outstanding."""
    markers = Markers()

    async def main() -> None:
        async with AsyncClient([served.address], busy_poll=600.0) as client:
            job = asyncio.ensure_future(client.submit("block", markers.spec("polled")))
            await asyncio.to_thread(markers.wait_started, "polled")
            conn = client._sessions[0].conn
            assert conn.polling
            markers.release("polled")
            assert await job == b"released polled"
            for _ in range(3):  # the poll callback queued before the result sees it
                await asyncio.sleep(0)
            assert not conn.polling
        async with AsyncClient([served.address], busy_poll=0) as client:
            job = asyncio.ensure_future(client.submit("block", markers.spec("slept")))
            await asyncio.to_thread(markers.wait_started, "slept")
            assert not client._sessions[0].conn.polling
            markers.release("slept")
            assert await job == b"released slept"

    asyncio.run(main())


def dead_port() -> str:
    """An address where nothing listens: connections are refused."""
    return f"127.0.0.1:{free_port()}"


def test_gives_up_after_bounded_retries() -> None:
    with (
        Client([dead_port(), dead_port()], retries=3, backoff=0.01) as client,
        pytest.raises(ServerUnavailable, match="gave up after 4 attempt"),
    ):
        client.submit("echo", "x")


def test_refused_server_is_skipped(served: ServerProcess) -> None:
    with Client([dead_port(), served.address], retries=1, backoff=0.01) as client:
        for _ in range(4):  # round robin starts on each server in turn
            assert client.submit("echo", "ok") == b"ok"
            assert client.submit_background("echo", "ok").server == served.address


@pytest.fixture
def black_hole() -> Iterator[str]:
    """A server that accepts connections and never answers (a hung server)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    yield f"127.0.0.1:{listener.getsockname()[1]}"
    listener.close()


def test_silent_server_times_out_and_the_next_one_answers(
    served: ServerProcess, black_hole: str
) -> None:
    with Client([black_hole, served.address], timeout=0.5, retries=5) as client:
        # Round robin starts on the silent server: the request times out there, goes on.
        assert client.submit_background("echo", "x").server == served.address


def test_foreground_job_on_a_server_that_hangs_is_retried(served: ServerProcess) -> None:
    """The server accepts the job (JOB_CREATED), then stops answering pings: Paranoid Pirate
    on the client side gives up on it and resubmits to the next server."""
    with fake_server() as hung:
        hung.answer_pings = False
        with Client([hung.address, served.address], heartbeat=0.05, retries=5) as client:
            # Round robin: every other submission starts on the hung server.
            assert [client.submit("echo", str(i)) for i in range(2)] == [b"0", b"1"]
        types = {packet.type for packets in hung.connections for packet in packets}
        assert {P.SUBMIT_JOB, P.ECHO_REQ} <= types


def test_job_on_a_connection_that_drops_is_retried_on_the_next_server(
    served: ServerProcess,
) -> None:
    """The first attempt on an open connection takes a shorter path than the retry loop: a
    connection lost under it hands the job over to the loop, which sends it on."""

    async def main() -> None:
        with fake_server() as dropping:
            async with AsyncClient([dropping.address, served.address], retries=3) as client:
                # Round robin: the fake, then the real server; both connections are open now.
                assert (await client.submit_background("echo", "x")).server == dropping.address
                assert (await client.submit_background("echo", "x")).server == served.address
                job = asyncio.ensure_future(client.submit("echo", "again"))  # the fake's turn
                while P.SUBMIT_JOB not in dropping.types(0):
                    await asyncio.sleep(0.01)
                dropping.sockets[0].shutdown(socket.SHUT_RDWR)  # after JOB_CREATED
                assert await job == b"again"

    asyncio.run(main())


def test_unique_keys_pick_the_same_server(jobwire: ServerProcess, gearmand: ServerProcess) -> None:
    with Client([jobwire.address, gearmand.address]) as client:
        for key in ("a", "b", "c", "d", "e"):
            servers = {client.submit_background("nobody", "x", unique=key).server for _ in range(3)}
            assert len(servers) == 1
        servers = {client.submit_background("nobody", "x").server for _ in range(4)}
        assert servers == {jobwire.address, gearmand.address}  # round robin without a key


def test_bad_arguments() -> None:
    with Client([dead_port()]) as client:
        with pytest.raises(ValueError, match="priority"):
            client.submit("echo", priority="urgent")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="unique"):
            client.submit("echo", unique="u" * 65)
        with pytest.raises(TypeError, match="cannot send"):
            client.submit("echo", object())
    with pytest.raises(ValueError, match="busy_poll"):
        AsyncClient(busy_poll=-1)
