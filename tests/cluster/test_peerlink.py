"""Jobs handed between nodes over their peer links (store/peerlink.py).

Real `jobwire serve` nodes on a schema of their own. Which way a job went is read from each
node's counters at /metrics (`jobwire_cluster_jobs_handed_total` and the others), never from
timing. A node learns which workers another node has free when its link to it begins and
each time one of them waits: the tests start the worker's node and let its workers sleep
before the node that hands jobs to it starts, and wait for that node's "linked" line.
"""

from __future__ import annotations

import re
import socket
import ssl
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from jobwire.store.peerlink import GREETING, encode
from tests.cluster.conftest import start_node
from tests.cluster.linkproxy import LinkProxy
from tests.cluster.test_pgcluster import sleeping_worker, wake_and_grab
from tests.interop.gearman_raw import Cmd, GearmanSocket, status, wait_until
from tests.pg import Schema
from tests.security.pki import make_pki
from tests.servers import ServerProcess

pytestmark = pytest.mark.interop


def node_id(node: ServerProcess) -> int:
    found = wait_until(lambda: re.search(r"cluster: node (\d+) ", node.log()), "node id")
    return int(found.group(1))


def counters(node: ServerProcess) -> dict[str, float]:
    """The node's `jobwire_cluster_*` metrics, by name without the prefix."""
    with urllib.request.urlopen(f"http://127.0.0.1:{node.http_port}/metrics", timeout=30) as r:
        text = r.read().decode()
    found = re.findall(r"^jobwire_cluster_(\w+) (\S+)$", text, re.MULTILINE)
    return {name: float(value) for name, value in found}


def wait_linked(node: ServerProcess, to: ServerProcess) -> None:
    line = f"cluster: linked to node {node_id(to)} "
    wait_until(lambda: line in node.log() or None, f"a link to node {node_id(to)}", 60)


def test_a_foreground_job_goes_to_another_node_s_free_worker_over_their_link(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    second = start_node(nodes, schema, http=True)
    with sleeping_worker(second, "linked") as worker:
        first = start_node(nodes, schema, http=True)
        wait_linked(first, second)
        with GearmanSocket(first) as client:
            for number in range(3):
                handle = client.submit_fg("linked", f"question {number}")
                assert wake_and_grab(worker) == (handle, f"question {number}".encode())
                big = bytes(range(256)) * 400  # 100 kB: what a notification could not carry
                worker.send(Cmd.WORK_STATUS, handle, "1", "2")
                worker.send(Cmd.WORK_DATA, handle, "part")
                worker.send(Cmd.WORK_COMPLETE, handle, big)
                assert client.expect(Cmd.WORK_STATUS).args == (handle.encode(), b"1", b"2")
                assert client.expect(Cmd.WORK_DATA).args == (handle.encode(), b"part")
                assert client.expect(Cmd.WORK_COMPLETE).args == (handle.encode(), big)
                assert worker.grab().type == Cmd.NO_JOB
                worker.send(Cmd.PRE_SLEEP)  # free again: its node tells the other
            failing = client.submit_fg("linked", "doomed")
            assert wake_and_grab(worker) == (failing, b"doomed")
            worker.send(Cmd.WORK_FAIL, failing)
            assert client.expect(Cmd.WORK_FAIL).args == (failing.encode(),)
    sent, got = counters(first), counters(second)
    assert (sent["jobs_handed_total"], got["jobs_taken_total"]) == (4, 4)
    assert sent["jobs_released_total"] == got["jobs_claimed_total"] == 0  # no row written
    assert schema.rows("SELECT count(*) FROM {schema}.jobs WHERE function = 'linked'") == [(0,)]


def test_without_links_a_foreground_job_goes_by_the_shared_queue(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    """The control of the test above: the same job, the same counters, `--peer-listen off`."""
    second = start_node(nodes, schema, "--peer-listen", "off", http=True)
    with sleeping_worker(second, "unlinked") as worker:
        first = start_node(nodes, schema, "--peer-listen", "off", http=True)
        wait_until(lambda: "cluster: 2 nodes" in first.log() or None, "nodes meet", 60)
        with GearmanSocket(first) as client:
            handle = client.submit_fg("unlinked", "question")
            assert wake_and_grab(worker) == (handle, b"question")
            worker.send(Cmd.WORK_COMPLETE, handle, "answer")
            assert client.expect(Cmd.WORK_COMPLETE).args == (handle.encode(), b"answer")
    sent, got = counters(first), counters(second)
    assert (sent["jobs_handed_total"], got["jobs_taken_total"]) == (0, 0)
    assert (sent["jobs_released_total"], got["jobs_claimed_total"]) == (1, 1)


def test_a_job_handed_to_a_node_that_dies_runs_again_on_its_client_s_node(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    second = start_node(nodes, schema, http=True)
    with sleeping_worker(second, "orphaned") as doomed_worker:
        first = start_node(nodes, schema, http=True)
        wait_linked(first, second)
        with GearmanSocket(first) as client:
            handle = client.submit_fg("orphaned", "survive me")
            assert wake_and_grab(doomed_worker) == (handle, b"survive me")
            with sleeping_worker(first, "orphaned") as worker:
                second.kill()  # SIGKILL, its worker holding the job
                assert wake_and_grab(worker) == (handle, b"survive me")
                worker.send(Cmd.WORK_COMPLETE, handle, "done")
                assert client.expect(Cmd.WORK_COMPLETE).args == (handle.encode(), b"done")
    assert "link to node" in first.log() and "queued again" in first.log()


def test_a_node_whose_workers_got_busy_sends_a_handed_job_back_and_it_goes_elsewhere(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    """The node handing over counts the other's free workers down as it hands jobs, and
    cannot know of jobs that node's own clients gave them: that node sends the job back, saying
    how many it has free, and the job goes to a node that has one. Passing it on through the
    shared queue instead would leave a row of it there should the link then break, as its node
    queues it again (two copies: tests/cluster/test_cluster_load.py found it)."""
    second = start_node(nodes, schema, http=True)
    busy = [sleeping_worker(second, "crowded") for _ in range(2)]
    third = start_node(nodes, schema, http=True)
    spare = sleeping_worker(third, "crowded")
    first = start_node(nodes, schema, http=True)
    wait_linked(first, second)
    wait_linked(first, third)
    wait_until(lambda: "cluster: 3 nodes" in second.log() or None, "the nodes meet", 60)
    try:
        with GearmanSocket(second) as local:
            for number in range(2):  # the two workers of the second node get busy
                local.submit_bg("crowded", f"local {number}")
            for worker in busy:
                wake_and_grab(worker)
        with GearmanSocket(first) as client:
            handle = client.submit_fg("crowded", "anyone")  # to the node it thinks has two free
            assert wake_and_grab(spare) == (handle, b"anyone")
            spare.send(Cmd.WORK_COMPLETE, handle, "elsewhere")
            assert client.expect(Cmd.WORK_COMPLETE).args == (handle.encode(), b"elsewhere")
    finally:
        for worker in [*busy, spare]:
            worker.close()
    assert counters(first)["jobs_handed_total"] == 2  # to the second node, then the third
    assert counters(second)["jobs_taken_total"] == counters(second)["jobs_released_total"] == 0
    assert (counters(third)["jobs_taken_total"], counters(third)["jobs_claimed_total"]) == (1, 0)
    assert schema.rows(f"SELECT count(*) FROM {{schema}}.jobs WHERE id = '{handle}'") == [(0,)]


def test_a_peer_link_that_does_not_answer_the_challenge_is_closed(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    node = start_node(nodes, schema, http=True)
    address = wait_until(
        lambda: (schema.rows("SELECT peer FROM {schema}.nodes") or [(None,)])[0][0], "address"
    )
    host, _, port = str(address).rpartition(":")
    wrong = encode({"node": 1, "mac": "00" * 32})
    for attempt in (wrong, b"GET / HTTP/1.0\r\n\r\n", b"\xff" * 64):
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            greeting = b""
            while len(greeting) < 24:
                greeting += sock.recv(24 - len(greeting))
            assert greeting.startswith(GREETING)
            sock.sendall(attempt)
            rest = b""
            while chunk := sock.recv(4096):  # the node closes the link
                rest += chunk
            assert rest == b""
    with sleeping_worker(node, "still") as worker, GearmanSocket(node) as client:
        handle = client.submit_fg("still", "there")
        assert wake_and_grab(worker) == (handle, b"there")
        worker.send(Cmd.WORK_COMPLETE, handle, "yes")
        assert client.expect(Cmd.WORK_COMPLETE).args == (handle.encode(), b"yes")


def test_a_foreground_job_with_a_unique_id_is_written_as_the_node_whose_worker_is_free(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    """Its key must go into the index, so its row is written: as the other node's, in the
    batch's one commit, and that node hears of it over the link instead of claiming it.
    Clients on either node that submit the same unique id join it."""
    second = start_node(nodes, schema, http=True)
    with sleeping_worker(second, "keyed") as worker:
        first = start_node(nodes, schema, http=True)
        wait_linked(first, second)
        with GearmanSocket(first) as client, GearmanSocket(second) as other:
            handle = client.submit_fg("keyed", "question", unique="only-once")
            assert wake_and_grab(worker) == (handle, b"question")
            owner = schema.rows(f"SELECT owner FROM {{schema}}.jobs WHERE id = '{handle}'")
            assert owner == [(node_id(second),)]
            assert other.submit_fg("keyed", "again", unique="only-once") == handle
            worker.send(Cmd.WORK_STATUS, handle, "1", "2")
            worker.send(Cmd.WORK_COMPLETE, handle, "answer")
            for waiting in (client, other):
                assert waiting.expect(Cmd.WORK_STATUS).args == (handle.encode(), b"1", b"2")
                assert waiting.expect(Cmd.WORK_COMPLETE).args == (handle.encode(), b"answer")
    sent, got = counters(first), counters(second)
    assert (sent["jobs_handed_total"], got["jobs_taken_total"]) == (1, 1)
    assert sent["jobs_released_total"] == got["jobs_claimed_total"] == 0
    gone = "SELECT count(*) FROM {schema}.jobs WHERE function = 'keyed'"
    wait_until(lambda: schema.rows(gone) == [(0,)] or None, "the row deleted by its owner")


def test_a_unique_foreground_job_a_worker_here_is_free_for_runs_here_without_a_claim(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    first, second = (start_node(nodes, schema, http=True) for _ in range(2))
    wait_until(lambda: "cluster: 2 nodes" in first.log() or None, "nodes meet", 60)
    with sleeping_worker(first, "near") as worker, GearmanSocket(first) as client:
        handle = client.submit_fg("near", "question", unique="near-1")
        assert wake_and_grab(worker) == (handle, b"question")
        worker.send(Cmd.WORK_COMPLETE, handle, "answer")
        assert client.expect(Cmd.WORK_COMPLETE).args == (handle.encode(), b"answer")
    here = counters(first)
    assert here["jobs_claimed_total"] == here["jobs_released_total"] == 0
    assert counters(second)["jobs_claimed_total"] == 0


def test_a_unique_job_written_as_a_node_that_dies_goes_to_the_shared_queue(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    lease = ("--node-lease", "600")  # only the broken link can free the row in time
    second = start_node(nodes, schema, *lease, http=True)
    with sleeping_worker(second, "keyed-orphan") as doomed_worker:
        first = start_node(nodes, schema, *lease, http=True)
        wait_linked(first, second)
        with GearmanSocket(first) as client:
            handle = client.submit_fg("keyed-orphan", "survive me", unique="k-1")
            assert wake_and_grab(doomed_worker) == (handle, b"survive me")
            with sleeping_worker(first, "keyed-orphan") as worker:
                second.kill()
                assert wake_and_grab(worker) == (handle, b"survive me")
                worker.send(Cmd.WORK_COMPLETE, handle, "done")
                assert client.expect(Cmd.WORK_COMPLETE).args == (handle.encode(), b"done")
    assert counters(first)["jobs_claimed_total"] == 1


def test_a_background_job_is_written_as_the_node_whose_worker_is_free_and_sent_over_the_link(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    """No notification and no claim: the row is the other node's from its commit, and that
    node hears of it over the link. Before, it went by the shared queue (released, claimed)."""
    second = start_node(nodes, schema, http=True)
    with sleeping_worker(second, "posted") as worker:
        first = start_node(nodes, schema, http=True)
        wait_linked(first, second)
        with GearmanSocket(first) as client:
            for number in range(3):
                handle = client.submit_bg("posted", f"letter {number}")
                assert wake_and_grab(worker) == (handle, f"letter {number}".encode())
                owner = schema.rows(f"SELECT owner FROM {{schema}}.jobs WHERE id = '{handle}'")
                assert owner == [(node_id(second),)]
                worker.send(Cmd.WORK_COMPLETE, handle, "delivered")
                assert worker.grab().type == Cmd.NO_JOB
                worker.send(Cmd.PRE_SLEEP)  # free again: its node tells the other
    sent, got = counters(first), counters(second)
    assert (sent["jobs_handed_total"], got["jobs_taken_total"]) == (3, 3)
    assert sent["jobs_released_total"] == got["jobs_claimed_total"] == 0
    gone = "SELECT count(*) FROM {schema}.jobs WHERE function = 'posted'"
    wait_until(lambda: schema.rows(gone) == [(0,)] or None, "the rows deleted by their owner")


def test_a_background_job_whose_unique_key_another_job_holds_does_not_run_on_the_linked_node(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    """A job with a unique key runs only once its commit has shown it holds the key: its
    row goes over the link after the commit, not as it begins. Sent ahead, the second
    submission ran on the second worker while the first job with its key still ran."""
    second = start_node(nodes, schema, http=True)
    workers = [sleeping_worker(second, "posted-once") for _ in range(2)]
    try:
        first = start_node(nodes, schema, http=True)
        wait_linked(first, second)  # the link began: two workers free there
        with GearmanSocket(first) as client:
            handle = client.submit_bg("posted-once", "first", unique="only-one")
            assert wake_and_grab(workers[0]) == (handle, b"first")
            again = client.submit_bg("posted-once", "second", unique="only-one")
            assert again == handle  # coalesced with the job that holds the key
            assert workers[1].grab().type == Cmd.NO_JOB
            workers[0].send(Cmd.WORK_COMPLETE, handle, "done")
    finally:
        for worker in workers:
            worker.close()
    gone = "SELECT count(*) FROM {schema}.jobs WHERE function = 'posted-once'"
    wait_until(lambda: schema.rows(gone) == [(0,)] or None, "the row deleted")


def test_a_background_row_whose_commit_failed_is_dropped_where_it_went_ahead(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    """The row went over the link as its commit began, and the commit failed (a constraint
    the test adds refuses the payload): the client hears QUEUE_ERROR, and the node the row
    went to drops the job, whether its worker had taken it or not. Kept, it would run there
    as a job whose submit was refused."""
    second = start_node(nodes, schema, http=True)
    with sleeping_worker(second, "posted-poison"):
        first = start_node(nodes, schema, http=True)
        wait_linked(first, second)
        schema.rows(
            "ALTER TABLE {schema}.jobs ADD CONSTRAINT no_poison"
            " CHECK (payload <> 'poison'::bytea) NOT VALID"
        )
        with GearmanSocket(first) as client:
            client.send(Cmd.SUBMIT_JOB_BG, "posted-poison", "", "poison")
            assert client.expect(Cmd.ERROR).args[0] == b"QUEUE_ERROR"

        def dropped() -> bool:
            return status(second).get("posted-poison", (0, 0, 0))[0] == 0

        wait_until(lambda: dropped() or None, "the job dropped where it went")
    assert counters(first)["jobs_handed_total"] == 1  # it did go ahead


def test_a_background_job_sent_to_a_node_that_dies_runs_elsewhere_after_its_lease(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    """Once the other node acknowledged the row it is that node's, as if claimed: when it
    dies, the row comes back with its lease, as a dead node's jobs do."""
    lease = ("--node-lease", "3")
    second = start_node(nodes, schema, *lease, http=True)
    with sleeping_worker(second, "posted-far") as doomed_worker:
        first = start_node(nodes, schema, *lease, http=True)
        wait_linked(first, second)
        with GearmanSocket(first) as client:
            handle = client.submit_bg("posted-far", "survive me")
            assert wake_and_grab(doomed_worker) == (handle, b"survive me")
            with sleeping_worker(first, "posted-far") as worker:
                second.kill()
                assert wake_and_grab(worker) == (handle, b"survive me")
                worker.send(Cmd.WORK_COMPLETE, handle, "done")
    gone = "SELECT count(*) FROM {schema}.jobs WHERE function = 'posted-far'"
    wait_until(lambda: schema.rows(gone) == [(0,)] or None, "the row deleted")
    assert counters(first)["jobs_handed_total"] == 1


def test_a_node_of_another_link_version_is_not_linked_and_the_operator_is_told(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    """During a rolling upgrade, a node whose links speak another version (here a listener
    that greets as version 3 would) gets no link: its jobs go through the shared queue.
    Linked, the two would misread each other's frames."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        node = start_node(nodes, schema, http=True)  # its start makes the tables
        schema.rows(
            "INSERT INTO {schema}.nodes (address, pid, lease_until, peer) VALUES"
            f" ('older', 1, now() + interval '1 hour', '127.0.0.1:{port}')"
        )
        listener.settimeout(60)  # dialled at the node's next heartbeat
        dialer, _ = listener.accept()
        with dialer:
            dialer.sendall(b"JWPEER3\n" + bytes(16))
            told = "speaks links of version 3, this node 4: their jobs go through the shared"
            wait_until(lambda: told in node.log() or None, "the warning", 60)


def _over_tls(node: ServerProcess, context: ssl.SSLContext) -> GearmanSocket:
    connection = GearmanSocket(node)
    connection.sock = context.wrap_socket(connection.sock, server_hostname="localhost")
    return connection


def test_nodes_with_a_certificate_link_over_tls(
    schema: Schema, nodes: list[ServerProcess], tmp_path: Path
) -> None:
    pki = make_pki(tmp_path / "pki")
    cert, key = pki.server("node")
    tls = ("--tls-cert", str(cert), "--tls-key", str(key))
    context = ssl.create_default_context(cafile=str(pki.ca))
    second = start_node(nodes, schema, *tls)
    with _over_tls(second, context) as worker:
        worker.send(Cmd.CAN_DO, "sealed")
        assert worker.grab().type == Cmd.NO_JOB
        worker.send(Cmd.PRE_SLEEP)
        first = start_node(nodes, schema, *tls)
        wait_linked(first, second)
        peers = [str(peer) for (peer,) in schema.rows("SELECT peer FROM {schema}.nodes")]
        assert len(peers) == 2 and all(peer.startswith("tls:127.0.0.1:") for peer in peers)
        with _over_tls(first, context) as client:
            handle = client.submit_fg("sealed", "a payload")
            assert wake_and_grab(worker) == (handle, b"a payload")
            # Handed over the link: no row of it (the shared queue's way writes one).
            assert schema.rows("SELECT count(*) FROM {schema}.jobs") == [(0,)]
            worker.send(Cmd.WORK_COMPLETE, handle, "done")
            assert client.expect(Cmd.WORK_COMPLETE).args == (handle.encode(), b"done")
    # The link's port speaks TLS only: plain bytes get no greeting, and the node serves on.
    host, _, port = peers[0].removeprefix("tls:").rpartition(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"\xff" * 64)
        rest = b""
        while chunk := sock.recv(4096):
            rest += chunk
        assert b"JWPEER" not in rest
    assert "cluster: refused" not in first.log() + second.log()
    assert "cluster: linked to node" in second.log()  # dialled the other way too


def _break_link(schema: Schema, to: ServerProcess) -> None:
    """Abort the TCP connections to `to`'s peer-link port (`ss -K`, as root), as a network
    that cut them would; both nodes live on."""
    (peer,) = schema.rows(f"SELECT peer FROM {{schema}}.nodes WHERE id = {node_id(to)}")[0]
    port = str(peer).rpartition(":")[2]
    killed = subprocess.run(
        ["ss", "-K", "dst", "127.0.0.1", "dport", "=", port],
        capture_output=True,
        text=True,
        check=True,
    )
    assert f":{port}" in killed.stdout, killed.stdout  # it found the link and closed it


def test_a_job_acknowledged_before_its_link_broke_stays_with_the_node_running_it(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    """Only the link breaks: the job runs once, where it ran, and its end reaches the client
    by notification. Queued again on the client's node (as before acknowledgements), a
    worker there would run it a second time."""
    second = start_node(nodes, schema, http=True)
    with sleeping_worker(second, "steady") as worker:
        first = start_node(nodes, schema, http=True)
        wait_linked(first, second)
        with GearmanSocket(first) as client:
            handle = client.submit_fg("steady", "once")
            assert wake_and_grab(worker) == (handle, b"once")
            wait_until(lambda: counters(first)["jobs_acknowledged"] == 1 or None, "the ack")
            _break_link(schema, second)
            settled = "settled: 1 foreground job(s) stay there while it lives, 0 queued again"
            wait_until(lambda: settled in first.log() or None, "the link settled")
            with sleeping_worker(first, "steady") as spare:  # would get the job, queued again
                worker.send(Cmd.WORK_STATUS, handle, "1", "2")
                worker.send(Cmd.WORK_COMPLETE, handle, "done there")
                assert client.expect(Cmd.WORK_STATUS).args == (handle.encode(), b"1", b"2")
                assert client.expect(Cmd.WORK_COMPLETE).args == (handle.encode(), b"done there")
                assert spare.grab().type == Cmd.NO_JOB
    wait_until(lambda: counters(first)["jobs_acknowledged"] == 0 or None, "the ack forgotten")


def _kind(*kinds: str) -> Callable[[dict], bool]:
    """What a `LinkProxy` holds back from: the first frame of one of these kinds (none: no
    frame)."""
    return lambda header: header.get("o") in kinds


_row_ended = _kind("ok", "drop")


def _through_proxy(
    schema: Schema,
    nodes: list[ServerProcess],
    to: ServerProcess,
    drop: Callable[[dict], bool],
    *args: str,
    drop_sent: Callable[[dict], bool] | None = None,
) -> tuple[ServerProcess, LinkProxy]:
    """A node (started with `args`) whose link to `to` goes through a `LinkProxy` (it dials
    the address `to`'s row gives, which the test rewrites before that node starts)."""
    peer = wait_until(
        lambda: schema.rows(f"SELECT peer FROM {{schema}}.nodes WHERE id = {node_id(to)}")[0][0],
        "the node's address",
    )
    host, _, port = str(peer).rpartition(":")
    proxy = LinkProxy((host, int(port)), drop, drop_sent)
    schema.rows(f"UPDATE {{schema}}.nodes SET peer = '{proxy.address}' WHERE id = {node_id(to)}")
    return start_node(nodes, schema, *args, http=True), proxy


@contextmanager
def _linked_through_proxy(
    schema: Schema,
    nodes: list[ServerProcess],
    function: str,
    drop: Callable[[dict], bool],
    *args: str,
    drop_sent: Callable[[dict], bool] | None = None,
) -> Iterator[tuple[ServerProcess, ServerProcess, GearmanSocket, LinkProxy]]:
    """A second node (both started with `args`) with a worker of `function` asleep on it,
    and a first node linked to it through a `LinkProxy`: (first, second, worker, proxy)."""
    second = start_node(nodes, schema, *args, http=True)
    with sleeping_worker(second, function) as worker:
        first, proxy = _through_proxy(schema, nodes, second, drop, *args, drop_sent=drop_sent)
        try:
            wait_linked(first, second)
            yield first, second, worker, proxy
        finally:
            proxy.close()


def test_a_job_whose_acknowledgement_was_lost_with_its_link_runs_once(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    """The link breaks after the node running the job acknowledged it, before the ack
    arrived. The client's node asks that node, which says it keeps the job: it runs there
    only. Queued again on the client's node (as before the settling), a worker there would
    run it a second time."""
    with _linked_through_proxy(schema, nodes, "doubted", _kind("got")) as linked:
        first, second, worker, proxy = linked
        with GearmanSocket(first) as client:
            handle = client.submit_fg("doubted", "once")
            assert wake_and_grab(worker) == (handle, b"once")
            wait_until(lambda: proxy.held_back("got") or None, "the ack held back")
            proxy.cut()
            settled = "settled: 1 foreground job(s) stay there while it lives, 0 queued"
            wait_until(lambda: settled in first.log() or None, "the link settled")
            with sleeping_worker(first, "doubted") as spare:  # would get it, queued again
                worker.send(Cmd.WORK_COMPLETE, handle, "done there")
                assert client.expect(Cmd.WORK_COMPLETE).args == (handle.encode(), b"done there")
                assert spare.grab().type == Cmd.NO_JOB
    assert "settled its link here: 1 frame(s) it missed, 1 job(s) stay" in second.log()


def test_the_end_of_a_job_lost_with_its_link_reaches_the_client(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    """The job's end was on its way when the link broke: the node that ran it still had
    it, unread by the client's node, and sends it in its answer. Before, the client's node
    waited for news that was never to come (by notification it comes only once a link
    broke), as long as the other node lived."""
    with _linked_through_proxy(schema, nodes, "unheard", _kind("o", "f")) as linked:
        first, _, worker, proxy = linked
        with GearmanSocket(first) as client:
            handle = client.submit_fg("unheard", "question")
            assert wake_and_grab(worker) == (handle, b"question")
            wait_until(lambda: counters(first)["jobs_acknowledged"] == 1 or None, "the ack")
            worker.send(Cmd.WORK_DATA, handle, "part")
            worker.send(Cmd.WORK_COMPLETE, handle, "answer")
            wait_until(lambda: proxy.held_back("f") or None, "the end held back")
            proxy.cut()
            assert client.expect(Cmd.WORK_DATA).args == (handle.encode(), b"part")
            assert client.expect(Cmd.WORK_COMPLETE).args == (handle.encode(), b"answer")
    assert "settled: 0 foreground job(s) stay there while it lives, 0 queued again" in (first.log())


def test_a_background_row_whose_acknowledgement_was_lost_with_its_link_runs_once(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    """The link breaks after the node running a background job acknowledged its row, before
    the ack arrived: the settling brings the ack, and the row stays that node's. Given back
    to the shared queue instead, a worker on the first node would run it a second time."""
    with _linked_through_proxy(schema, nodes, "posted-doubt", _kind("got")) as linked:
        first, second, worker, proxy = linked
        with GearmanSocket(first) as client:
            handle = client.submit_bg("posted-doubt", "once")
            assert wake_and_grab(worker) == (handle, b"once")
            wait_until(lambda: proxy.held_back("got") or None, "the ack held back")
            proxy.cut()
            settled = "settled: 0 foreground job(s) stay there while it lives, 0 queued"
            wait_until(lambda: settled in first.log() or None, "the link settled")
            with sleeping_worker(first, "posted-doubt") as spare:  # would get it if freed
                owner = f"SELECT owner FROM {{schema}}.jobs WHERE id = '{handle}'"
                assert schema.rows(owner) == [(node_id(second),)]
                worker.send(Cmd.WORK_COMPLETE, handle, "done there")
                gone = f"SELECT count(*) FROM {{schema}}.jobs WHERE id = '{handle}'"
                wait_until(lambda: schema.rows(gone) == [(0,)] or None, "the row deleted")
                assert spare.grab().type == Cmd.NO_JOB
    assert "settled its link here: 1 frame(s) it missed, 0 job(s) stay" in second.log()


def test_a_background_row_runs_as_its_commit_begins_and_is_written_once_it_ended(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    """The row goes over the link as its commit begins: the job runs at once, and the node
    running it writes nothing of it until told the commit ended. Here that word is lost
    with the link: the settling brings it, and the finished job's row is deleted then.
    Deleted before the row was known committed, it could have been committed after."""
    ahead = _linked_through_proxy(schema, nodes, "posted-ahead", _kind(), drop_sent=_row_ended)
    with ahead as (first, second, worker, proxy), GearmanSocket(first) as client:
        handle = client.submit_bg("posted-ahead", "now")
        assert wake_and_grab(worker) == (handle, b"now")
        wait_until(lambda: proxy.held_back("ok") or None, "the commit's end held back")
        worker.send(Cmd.WORK_COMPLETE, handle, "done")
        assert worker.grab().type == Cmd.NO_JOB  # the end was heard
        row = f"SELECT owner FROM {{schema}}.jobs WHERE id = '{handle}'"
        assert schema.rows(row) == [(node_id(second),)]  # not deleted: not yet known
        proxy.cut()
        wait_until(lambda: schema.rows(row) == [] or None, "the row deleted", 60)
    assert "settled its link here" in second.log()


def test_a_background_row_sent_ahead_by_a_node_that_dies_is_read_from_the_database(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    """The node that sent the row dies before saying how its commit ended: once its lease
    ran out, the node running the job reads the row: there, the commit landed."""
    lease = ("--node-lease", "3")
    orphan = "posted-orphan"
    ahead = _linked_through_proxy(schema, nodes, orphan, _kind(), *lease, drop_sent=_row_ended)
    with ahead as (first, _, worker, proxy):
        with GearmanSocket(first) as client:
            handle = client.submit_bg(orphan, "now")
            assert wake_and_grab(worker) == (handle, b"now")
            wait_until(lambda: proxy.held_back("ok") or None, "the commit's end held back")
        first.kill()
        proxy.cut()
        worker.send(Cmd.WORK_COMPLETE, handle, "done")
        assert worker.grab().type == Cmd.NO_JOB
        row = f"SELECT owner FROM {{schema}}.jobs WHERE id = '{handle}'"
        wait_until(lambda: schema.rows(row) == [] or None, "the row deleted", 60)


def test_a_kept_job_stays_while_its_node_answers_though_its_lock_looked_free(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    """The link broke and the worker's node kept the job; then that node's session holding
    its lock is killed, as a PostgreSQL restart would (the lock is free until its next
    heartbeat, 40 s away with a lease of 120 s). The client's node finds the lock free,
    pings the node, which answers: the job stays. On the lock alone it would come back and
    run twice."""
    second = start_node(nodes, schema, "--node-lease", "120", http=True)
    with sleeping_worker(second, "kept") as worker:
        first, proxy = _through_proxy(schema, nodes, second, _kind())
        try:
            wait_linked(first, second)
            with GearmanSocket(first) as client:
                handle = client.submit_fg("kept", "once")
                assert wake_and_grab(worker) == (handle, b"once")
                wait_until(lambda: counters(first)["jobs_acknowledged"] == 1 or None, "the ack")
                proxy.close()  # cut, and the dials that follow are refused
                settled = "settled: 1 foreground job(s) stay there while it lives, 0 queued"
                wait_until(lambda: settled in first.log() or None, "the link settled")
                (killed,) = schema.rows(
                    "SELECT count(pg_terminate_backend(l.pid)) FROM pg_locks l"
                    " JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory'"
                    f" AND l.objid = {node_id(second)} AND a.usename = '{schema.role}'"
                )[0]
                assert killed == 1
                answers = f"node {node_id(second)} answers though no session holds its lock"
                wait_until(lambda: answers in first.log() or None, "the ping answered")
                with sleeping_worker(first, "kept") as spare:  # would get it, given back
                    worker.send(Cmd.WORK_COMPLETE, handle, "done there")
                    assert client.expect(Cmd.WORK_COMPLETE).args == (handle.encode(), b"done there")
                    assert spare.grab().type == Cmd.NO_JOB
        finally:
            proxy.close()
    assert "gone with" not in first.log()
