"""The PostgreSQL store behind a real server: PostgreSQL going away and coming back, killed
backends, a second node, and the `jobwire db` commands.

"PostgreSQL going away" is done per test, without stopping the shared server: the test's
role loses its LOGIN and every backend of it is killed (`pg_terminate_backend`), so the node's
connections break and new ones are refused, as when the server is down; LOGIN again is
PostgreSQL coming back. Every wait polls up to a generous deadline; nothing depends on how
fast the server or the database is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwire.store.postgres import SCHEMA_VERSION
from tests.interop.gearman_raw import DEADLINE, SUBMIT_BG, Cmd, GearmanSocket, pack, wait_until
from tests.interop.test_durability import drain, show_jobs
from tests.ojs.dsl import Runner
from tests.pg import Schema, admin, new_schema
from tests.servers import ServerProcess, free_port, start_jobwire, wait_for_port

pytestmark = pytest.mark.interop

FUNCTION = "durable"


@pytest.fixture
def schema() -> Iterator[Schema]:
    with new_schema() as made:
        yield made


@pytest.fixture
def servers(schema: Schema) -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    yield started
    for server in started:
        server.kill()


def start(
    servers: list[ServerProcess], schema: Schema, *args: str, http: bool = False
) -> ServerProcess:
    server = start_jobwire(args, store=schema.dsn, http=http)
    servers.append(server)
    return server


def serve_command(store: str) -> list[str]:
    port = str(free_port())
    serve = ["serve", "--port", port, "--http-port", "0", "--zmq-port", "0"]
    return [sys.executable, "-m", "jobwire", *serve, "--store", store]


def jobwire(*args: str, store: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobwire", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"JOBWIRE_STORE": store, "PATH": "/usr/bin:/bin"},
    )


def test_postgresql_away_refuses_submits_clearly_and_the_node_carries_on_after(
    schema: Schema, servers: list[ServerProcess]
) -> None:
    server = start(servers, schema, "--verbose", "INFO", http=True)
    api = Runner(f"http://127.0.0.1:{server.http_port}")
    client = GearmanSocket(server)
    kept = client.submit_bg(FUNCTION, "before")
    schema.go_away()
    try:
        for i in range(3):
            client.send(Cmd.SUBMIT_JOB_BG, FUNCTION, "", f"refused {i}")
            error = client.expect(Cmd.ERROR)
            assert error.args == (b"QUEUE_ERROR", b"Job could not be stored")
        # Pipelined: the whole batch is refused, nothing is half-acknowledged.
        client.sock.sendall(
            b"".join(pack(Cmd.SUBMIT_JOB_BG, FUNCTION, "", f"refused b{i}") for i in range(50))
        )
        for _ in range(50):
            assert client.expect(Cmd.ERROR).args[0] == b"QUEUE_ERROR"
        pushed = api.request("POST", "/ojs/v1/jobs", {"type": FUNCTION, "args": ["refused"]})
        assert pushed.status == 503, pushed.raw
        # What needs no database still works: echo, admin, foreground jobs (not stored).
        echo = client.request(Cmd.ECHO_REQ, "still here", reply=Cmd.ECHO_RES)
        assert echo.args == (b"still here",)
        assert show_jobs(server) == {kept: 0}
        foreground = client.submit_fg("echo-fg", "no database needed")
        with GearmanSocket(server) as worker:
            worker.send(Cmd.CAN_DO, "echo-fg")
            assert worker.grab().args[0].decode() == foreground
            worker.send(Cmd.WORK_COMPLETE, foreground, "done")
        assert client.expect(Cmd.WORK_COMPLETE).args == (foreground.encode(), b"done")
    finally:
        schema.come_back()

    def submitted() -> str | None:
        """A submit accepted once the node has connected again (refused before)."""
        client.send(Cmd.SUBMIT_JOB_BG, FUNCTION, "", "after")
        reply = client.recv()
        if reply.type == Cmd.ERROR:
            assert reply.args[0] == b"QUEUE_ERROR"
            time.sleep(0.05)
            return None
        assert reply.type == Cmd.JOB_CREATED, reply
        return str(reply.args[0].decode())

    stored = wait_until(submitted, "a submit accepted after PostgreSQL came back")
    client.close()
    server.kill()
    assert "commits succeed again after" in server.log(), server.log()

    server = start(servers, schema)
    replayed = drain(server)
    assert replayed[0] == (kept, b"before")
    assert replayed[-1] == (stored, b"after")
    assert all(body == b"after" for _, body in replayed[1:])  # no refused job came back


def test_killed_backends_mid_load_lose_no_acknowledged_job(
    schema: Schema, servers: list[ServerProcess]
) -> None:
    server = start(servers, schema)
    total, chunk = 20_000, 200
    replies: list[tuple[int, bytes]] = []  # (type, handle or error code) per submit, in order
    client = GearmanSocket(server)
    done = threading.Event()

    def read() -> None:
        while len(replies) < total:
            packet = client.recv()
            assert packet.type in (Cmd.JOB_CREATED, Cmd.ERROR), packet
            replies.append((packet.type, packet.args[0]))
        done.set()

    reader = threading.Thread(target=read)
    reader.start()
    kills = 0
    for first in range(0, total, chunk):
        # At most 1,000 submits in flight, so that the kills land all along the load.
        wait_until(lambda: len(replies) + 1000 >= first or None, "replies")  # noqa: B023
        client.sock.sendall(
            b"".join(
                pack(Cmd.SUBMIT_JOB_BG, FUNCTION, "", b"job-%d" % number)
                for number in range(first, first + chunk)
            )
        )
        if first % 2000 == 1000:  # every 10 chunks, mid-stream
            kills += schema.terminate()
    reader.join(DEADLINE * 4)
    assert done.is_set(), f"{len(replies)} of {total} replies"
    client.close()
    assert kills >= 5, f"the node's backends were killed {kills} times, not under load"
    acked = {
        handle.decode(): number
        for number, (kind, handle) in enumerate(replies)
        if kind == Cmd.JOB_CREATED
    }
    refused = [code for kind, code in replies if kind == Cmd.ERROR]
    assert set(refused) <= {b"QUEUE_ERROR"}
    # A killed backend costs a retry on a new connection, not the batch.
    assert len(acked) >= total // 2, f"{len(refused)} refused"
    server.kill()

    server = start(servers, schema)
    replayed = dict(drain(server))
    for handle, number in acked.items():
        assert replayed.get(handle) == b"job-%d" % number, handle
    print(f"{kills} backends killed, {len(acked)} acknowledged, {len(refused)} refused")


def test_jobs_of_every_shape_come_back_byte_for_byte_after_a_kill(
    schema: Schema, servers: list[ServerProcess]
) -> None:
    # One pipelined write, so most land in one batch: its column arrays then mix NULLs and
    # values, repeated and distinct values, ASCII and other text, short and long payloads.
    functions = [FUNCTION, "fünf-✓", "noop"]
    payloads = [b"", b"\x00\xff\x00", "grüße ✓".encode(), b"x" * 100_000, b"short"]
    jobs = [
        (functions[n % 3], f"ключ-{n}" if n % 4 == 0 else "", payloads[n % 5], priority)
        for n in range(60)
        for priority in [("normal", "high", "low")[n % 3]]
    ]
    server = start(servers, schema)
    client = GearmanSocket(server)
    client.sock.sendall(
        b"".join(
            pack(SUBMIT_BG[priority], function, unique, body)
            for function, unique, body, priority in jobs
        )
    )
    submitted = {client.expect(Cmd.JOB_CREATED).args[0].decode(): job[:3] for job in jobs}
    client.close()
    server.kill()

    server = start(servers, schema)
    replayed: dict[str, tuple[str, str, bytes]] = {}
    with GearmanSocket(server) as worker:
        for function in functions:
            worker.send(Cmd.CAN_DO, function)
        for _ in submitted:
            packet = worker.request(Cmd.GRAB_JOB_UNIQ, reply=Cmd.JOB_ASSIGN_UNIQ)
            handle, function_name, unique, body = packet.args
            replayed[handle.decode()] = (function_name.decode(), unique.decode(), body)
            worker.send(Cmd.WORK_COMPLETE, handle, b"")
        worker.request(Cmd.GRAB_JOB_UNIQ, reply=Cmd.NO_JOB)
    assert replayed == submitted


def test_a_second_node_on_the_same_schema_joins_it(
    schema: Schema, servers: list[ServerProcess]
) -> None:
    first = start(servers, schema)
    second = start(servers, schema)
    handles = set()
    for node in (first, second):
        with GearmanSocket(node) as client:
            handles.add(client.submit_bg(FUNCTION, "job"))
    assert len(handles) == 2  # handles are unique across nodes (they name the node)
    nodes = json.loads(jobwire("db", "status", "--json", store=schema.dsn).stdout)["nodes"]
    assert len(nodes) == 2 and all(node["alive"] for node in nodes)


def test_an_unreachable_database_is_a_clear_error_at_start() -> None:
    port = free_port()  # nothing listens there
    store = f"postgresql://nobody@127.0.0.1:{port}/nothing"
    started = subprocess.run(serve_command(store), capture_output=True, text=True, timeout=60)
    assert started.returncode != 0
    assert "cannot connect to PostgreSQL" in started.stderr, started.stderr


def test_db_migrate_and_status_show_the_schema_and_the_node(
    schema: Schema, servers: list[ServerProcess]
) -> None:
    before = jobwire("db", "status", store=schema.dsn)
    assert before.returncode == 0, before.stderr
    assert "version 0" in before.stdout and "jobwire db migrate" in before.stdout
    migrated = jobwire("db", "migrate", store=schema.dsn)
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout.strip() == f"schema version 0 -> {SCHEMA_VERSION}"
    again = jobwire("db", "migrate", store=schema.dsn)
    assert again.stdout.strip() == f"schema version {SCHEMA_VERSION}: up to date"
    idle = json.loads(jobwire("db", "status", "--json", store=schema.dsn).stdout)
    assert (idle["version"], idle["jobs"], idle["nodes"]) == (SCHEMA_VERSION, {}, [])

    server = start(servers, schema)
    with GearmanSocket(server) as client:
        for i in range(3):
            client.submit_bg(FUNCTION, f"job {i}")
    running = json.loads(jobwire("db", "status", "--json", store=schema.dsn).stdout)
    assert running["jobs"] == {"3": 3}  # JobState.AVAILABLE
    [node] = running["nodes"]
    assert (node["alive"], node["jobs"], node["pid"]) == (True, 3, server.proc.pid)

    def peer_address() -> object:  # written once the node listens for the other nodes' links
        status = json.loads(jobwire("db", "status", "--json", store=schema.dsn).stdout)
        return status["nodes"][0]["peer"]

    peer = wait_until(peer_address, "the node's peer address")
    assert str(peer).startswith("127.0.0.1:")
    shown = jobwire("db", "status", store=schema.dsn).stdout
    assert "jobs available: 3" in shown and f"pid {server.proc.pid}" in shown
    assert f"peer links at {peer}" in shown

    not_postgres = jobwire("db", "status", store="sqlite:x.db")
    assert not_postgres.returncode != 0 and "postgresql://" in not_postgres.stderr


def test_db_migrate_upgrades_a_version_2_schema_whose_jobs_then_run(
    schema: Schema, servers: list[ServerProcess]
) -> None:
    import psycopg

    from jobwire.store.postgres import MIGRATIONS

    with psycopg.connect(schema.dsn, autocommit=True) as conn:
        for statement in (*MIGRATIONS[0], *MIGRATIONS[1]):  # the tables as version 2 made them
            conn.execute(statement.encode())
        conn.execute(b"INSERT INTO jobwire_schema (version) VALUES (2)")
        conn.execute(
            b"INSERT INTO jobs (seq, id, function, queue, uniq, payload, priority, state,"
            b" attempts, created_at) VALUES (7, 'H:old:n1:7', 'f', 'f', 'u', 'p', 0, 3, 0, 1.5)"
        )
    migrated = jobwire("db", "migrate", store=schema.dsn)
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout.strip() == f"schema version 2 -> {SCHEMA_VERSION}"
    assert schema.rows("SELECT ukey FROM {schema}.jobs") == [(None,)]  # as it was
    assert schema.rows("SELECT count(*) FROM {schema}.paused_queues") == [(0,)]
    assert schema.rows("SELECT count(*) FROM {schema}.queue_rates") == [(0,)]
    server = start(servers, schema)
    with GearmanSocket(server) as worker:
        worker.send(Cmd.CAN_DO, "f")
        assigned = worker.grab()
        assert assigned.type == Cmd.JOB_ASSIGN_UNIQ and assigned.args[0] == b"H:old:n1:7"
        with GearmanSocket(server) as client:  # its key is still held, on this node
            assert client.submit_bg("f", "again", unique="u") == "H:old:n1:7"
            fresh = client.submit_bg("f", "fresh", unique="v")
    assert schema.rows("SELECT ukey FROM {schema}.jobs WHERE id = '" + fresh + "'") == [
        ("e\x1ff\x1fv",)
    ]


def test_a_schema_newer_than_this_jobwire_is_refused(schema: Schema) -> None:
    assert jobwire("db", "migrate", store=schema.dsn).returncode == 0
    schema.rows("UPDATE {schema}.jobwire_schema SET version = 99")
    started = subprocess.run(serve_command(schema.dsn), capture_output=True, text=True, timeout=60)
    assert started.returncode != 0
    assert "schema version 99" in started.stderr, started.stderr
    status = jobwire("db", "migrate", store=schema.dsn)
    assert status.returncode != 0 and "schema version 99" in status.stderr


def test_serve_takes_the_store_from_jobwire_store(schema: Schema, tmp_path: Path) -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "jobwire", "serve", "--port", str(port), "--http-port", "0"]
    env = {**os.environ, "JOBWIRE_STORE": schema.dsn}
    with open(tmp_path / "server.log", "wb") as log:
        proc = subprocess.Popen(
            [*cmd, "--zmq-port", "0"], stdout=log, stderr=log, env=env, cwd=tmp_path
        )
    server = ServerProcess("jobwire", proc, port, tmp_path, None)
    try:
        wait_for_port(port, proc)
        with GearmanSocket(server) as client:
            client.submit_bg(FUNCTION, "from the environment")
        status = json.loads(jobwire("db", "status", "--json", store=schema.dsn).stdout)
        assert status["jobs"] == {"3": 1}
        assert not (tmp_path / "jobwire-data").exists()  # not the default SQLite store
    finally:
        server.kill()


def test_batches_find_their_rows_by_key_however_small_the_table_was_when_they_began(
    schema: Schema, servers: list[ServerProcess]
) -> None:
    """Every statement is prepared, and after five runs PostgreSQL may keep a generic plan
    made while `jobs` was nearly empty: the batch's delete then scanned the whole table
    once per batch (11k jobs/s falling to 3k as the queue grew to 300k). Counted, not
    timed: the table's sequential scans, flushed to the statistics when the node exits."""
    server = start(servers, schema)
    batches = 40
    with GearmanSocket(server) as client:
        for batch in range(batches):  # each waits for its acknowledgements: a commit each
            client.sock.sendall(
                b"".join(pack(Cmd.SUBMIT_JOB_BG, FUNCTION, "", f"{batch}.{i}") for i in range(20))
            )
            for _ in range(20):
                client.expect(Cmd.JOB_CREATED)
    assert server.stop() == 0
    [(scans,)] = admin(
        "SELECT seq_scan FROM pg_stat_user_tables WHERE schemaname = %s AND relname = 'jobs'",
        schema.name,
    )
    assert int(str(scans)) < batches // 4, f"{scans} full scans of jobs over {batches} batches"
