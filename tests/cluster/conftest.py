"""Nodes of one cluster: real `jobwire serve` processes on a PostgreSQL schema of their own."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from tests.interop.gearman_raw import wait_until
from tests.pg import Schema, new_schema
from tests.servers import ServerProcess, start_jobwire

#: The fallback poll, far longer than any wait in these tests: a job that moved between nodes
#: well before it moved on a notification, not the poll.
POLL = "60"


@pytest.fixture
def schema() -> Iterator[Schema]:
    with new_schema() as made:
        yield made


@pytest.fixture
def nodes() -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    yield started
    for server in started:
        if server.proc.poll() is None:
            os.kill(server.proc.pid, signal.SIGCONT)  # a test may have stopped it
        server.kill()


def start_node(
    nodes: list[ServerProcess], schema: Schema, *args: str, http: bool = False
) -> ServerProcess:
    options = ("--verbose", "INFO", "--cluster-poll", POLL, *args)
    server = start_jobwire(options, store=schema.dsn, http=http)
    nodes.append(server)
    return server


def start_nodes(
    nodes: list[ServerProcess], schema: Schema, count: int, *args: str, http: bool = False
) -> list[ServerProcess]:
    """`count` nodes, each of which knows of all the others (it only shares work then)."""
    started = [start_node(nodes, schema, *args, http=http) for _ in range(count)]
    for node in started:
        wait_until(
            lambda node=node: f"cluster: {count} nodes" in node.log() or None, "nodes meet", 60
        )
    return started
