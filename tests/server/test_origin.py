"""The protocol a job came in by (`Job.origin`), through the real wire protocols against a
real server: the dashboard's job page and `jobwire_jobs_submitted_total{protocol=...}` show
it for a job of each listener, and on the SQLite store it survives a restart."""

from __future__ import annotations

import re
from pathlib import Path

import zmq
from jobwire.protocols.zmq import freelance, mdp
from jobwire.protocols.zmq.mdp import Version
from tests.interop.gearman_raw import GearmanSocket
from tests.server.dashboard_support import Browser, wait_until
from tests.servers import ServerProcess, free_port, start_jobwire
from tests.zmq.support import Zmq, call, zmq_peers

#: function (and queue) -> the protocol label its job must carry
EXPECTED = {
    "via-gearman": "gearman",
    "via-ojs": "ojs",
    "via-titanic": "titanic",
    "via-mdp": "majordomo",
    "via-ppp": "pirate",
    "via-freelance": "freelance",
}


def start(db: Path, ports: dict[str, int]) -> ServerProcess:
    server = start_jobwire(
        [
            "--zmq-port",
            str(ports["zmq"]),
            "--ppp-frontend",
            f"tcp://127.0.0.1:{ports['ppp_front']}",
            "--ppp-backend",
            f"tcp://127.0.0.1:{ports['ppp_back']}",
            "--ppp-function",
            "via-ppp",
            "--freelance-port",
            str(ports["freelance"]),
            "--mdp-heartbeat",
            "10",
        ],
        port=ports["gearman"],
        store=f"sqlite:{db}",
        workdir=db.parent,
        http=True,
    )
    server.extra["zmq_port"] = ports["zmq"]
    return server


def job_page(browser: Browser, queue: str) -> str:
    """The page of the one job waiting in `queue` (found through the queue's page)."""

    def found() -> str | None:
        listed = re.search(r'href="/ui/jobs/([^"]+)"', browser.get(f"/ui/queues/{queue}").text)
        return listed.group(1) if listed else None

    job_id = wait_until(found, f"a job waiting in {queue}")
    page = browser.get(f"/ui/jobs/{job_id}")
    assert page.status == 200
    return page.text


def came_in_by(page: str) -> str:
    found = re.search(r"<dt>came in by</dt><dd>([^<]*)</dd>", page)
    assert found, "the job page does not say how the job came in"
    return found.group(1)


def submitted(metrics: str, function: str) -> dict[str, float]:
    """jobwire_jobs_submitted_total of `function`, by protocol label."""
    out: dict[str, float] = {}
    for labels, value in re.findall(
        r"^jobwire_jobs_submitted_total\{([^}]*)\} (\S+)$", metrics, re.M
    ):
        fields = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if fields.get("function") == function:
            out[fields["protocol"]] = float(value)
    return out


def submit_everywhere(
    server: ServerProcess, peers: Zmq, browser: Browser, ports: dict[str, int]
) -> None:
    """One job per listener, each left waiting (no worker serves these functions)."""
    with GearmanSocket(server) as gearman:
        gearman.submit_bg("via-gearman", b"g")
    job = browser.json("POST", "/ojs/v1/jobs", {"type": "via-ojs", "args": [1]})["job"]
    assert job["queue"] == "default"
    status, _uuid = call(
        peers.peer(zmq.DEALER), b"titanic.request", [b"via-titanic", b"t"], Version.V2
    )
    assert status == b"200"
    peers.peer(zmq.DEALER).send(mdp.request(Version.V1, b"via-mdp", [b"m"]))
    peers.peer(zmq.REQ, f"tcp://127.0.0.1:{ports['ppp_front']}").send([b"p"])
    lance = f"tcp://127.0.0.1:{ports['freelance']}"
    client = peers.peer(zmq.DEALER, lance)
    client.send([b"", freelance.PING])
    assert client.recv() == [b"", freelance.PONG]
    client.send([b"", b"1", b"via-freelance", b"f"])


def test_every_listener_records_the_protocol_and_sqlite_keeps_it(tmp_path: Path) -> None:
    ports = {name: free_port() for name in ("gearman", "zmq", "ppp_front", "ppp_back", "freelance")}
    db = tmp_path / "jobs.db"
    server = start(db, ports)
    try:
        assert server.http_port is not None
        browser = Browser(server.http_port)
        with zmq_peers(server) as peers:
            submit_everywhere(server, peers, browser, ports)
            for function, protocol in EXPECTED.items():
                queue = "default" if function == "via-ojs" else function
                assert came_in_by(job_page(browser, queue)) == protocol, function
            metrics = browser.get("/metrics").text
            for function, protocol in EXPECTED.items():
                assert submitted(metrics, function) == {protocol: 1.0}, function
    finally:
        assert server.stop() == 0, server.log()

    # Background jobs are stored: after a restart their pages still say how they came.
    server = start(db, ports)
    try:
        assert server.http_port is not None
        browser = Browser(server.http_port)
        for function, queue in (
            ("via-gearman", "via-gearman"),
            ("via-ojs", "default"),
            ("via-titanic", "via-titanic"),
        ):
            assert came_in_by(job_page(browser, queue)) == EXPECTED[function], function
    finally:
        assert server.stop() == 0, server.log()


def test_a_job_stored_before_origins_were_kept_says_unknown(tmp_path: Path) -> None:
    """A version 3 SQLite file (no origin column) still loads; its jobs' origin is unknown."""
    import sqlite3

    db = tmp_path / "old.db"
    ports = {name: free_port() for name in ("gearman", "zmq", "ppp_front", "ppp_back", "freelance")}
    server = start(db, ports)
    try:
        with GearmanSocket(server) as gearman:
            gearman.submit_bg("old-fn", b"o")
    finally:
        assert server.stop() == 0, server.log()
    assert not list(tmp_path.glob("old.db-redo-*")), "a clean stop checkpoints the redo log"
    with sqlite3.connect(db) as conn:  # as a version 3 file: no origin column
        assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (1,)
        conn.execute("ALTER TABLE jobs DROP COLUMN origin")
        conn.execute("PRAGMA user_version = 3")
    server = start(db, ports)
    try:
        assert server.http_port is not None
        browser = Browser(server.http_port)
        assert came_in_by(job_page(browser, "old-fn")) == "unknown"
    finally:
        assert server.stop() == 0, server.log()
