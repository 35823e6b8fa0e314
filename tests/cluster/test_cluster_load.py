"""Three nodes under load, one SIGKILLed mid-load: nothing acknowledged is lost, nothing runs
twice in one attempt, and foreground clients on the surviving nodes get their results.

Clients and workers are spread over the three nodes and speak Gearman (raw sockets) and OJS
HTTP. Every run a worker makes is recorded with the node it ran on (and, over OJS, the attempt
the server gave it). The doomed node's workers each hold their second job without finishing
it, so that the kill is sure to find jobs running there; the other jobs it holds are queued in
its engine. Nothing waits a fixed time: every wait is for a condition, with a generous deadline
(this runs on a loaded 2-core machine).
"""

from __future__ import annotations

import select
import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import pytest

from tests.cluster.conftest import start_nodes
from tests.interop.gearman_raw import Cmd, GearmanSocket, wait_until
from tests.ojs.dsl import Runner
from tests.pg import Schema
from tests.servers import ServerProcess

pytestmark = [pytest.mark.interop, pytest.mark.timeout(600)]

FUNCTION = "load"  # the Gearman workers' function
JOB_TYPE = QUEUE = "load-ojs"  # the OJS jobs' (a type is a function too: it must differ)
BACKGROUND = 60  # Gearman background jobs submitted on each node
PUSHED = 20  # OJS jobs pushed on each node
FOREGROUND = 20  # foreground jobs each surviving node's client waits for
DEADLINE = 180.0


@dataclass
class Run:
    payload: str
    node: str
    attempt: int | None  # as the server told the worker (OJS); Gearman does not tell


@dataclass
class Load:
    """What the threads share: runs, acknowledgements, failures, and when to stop."""

    runs: list[Run] = field(default_factory=list)
    acknowledged: set[str] = field(default_factory=set)
    answered: dict[str, bytes] = field(default_factory=dict)  # foreground payload -> result
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    killed: threading.Event = field(default_factory=threading.Event)
    holding: list[str] = field(default_factory=list)  # payloads the doomed node's workers hold

    def thread(self, target: Callable[[], None], name: str) -> threading.Thread:
        def guarded() -> None:
            try:
                target()
            except Exception as exc:  # reported by the test, in its thread
                if not self.killed.is_set() or not name.startswith("doomed"):
                    self.errors.append(f"{name}: {exc!r}")

        thread = threading.Thread(target=guarded, name=name, daemon=True)
        thread.start()
        return thread

    def check(self) -> None:
        assert not self.errors, self.errors


def gearman_worker(load: Load, node: ServerProcess, name: str, hold: bool) -> None:
    """Run jobs of FUNCTION until told to stop; the result is the payload reversed. `hold`: keep
    the second job without finishing it (the node is about to be killed)."""
    with GearmanSocket(node) as worker:
        worker.send(Cmd.CAN_DO, FUNCTION)
        ran = 0
        while not load.stop.is_set():
            assigned = worker.grab()
            if assigned.type == Cmd.NO_JOB:
                worker.send(Cmd.PRE_SLEEP)
                while not load.stop.is_set():
                    if select.select([worker.sock], [], [], 0.2)[0]:
                        worker.expect(Cmd.NOOP)
                        break
                continue
            handle, _function, _unique, payload = assigned.args
            load.runs.append(Run(payload.decode(), name, None))
            ran += 1
            if hold and ran == 2:
                load.holding.append(payload.decode())
                load.killed.wait()
                return
            worker.send(Cmd.WORK_COMPLETE, handle, payload[::-1])


def ojs_worker(load: Load, node: ServerProcess, name: str, hold: bool) -> None:
    """Fetch and acknowledge jobs of QUEUE until told to stop (`hold`: as for Gearman)."""
    api = Runner(f"http://127.0.0.1:{node.http_port}")
    ran = 0
    while not load.stop.is_set():
        reply = api.request("POST", "/ojs/v1/jobs/fetch", {"queues": [QUEUE], "count": 1})
        assert reply.status == 200, reply.raw
        if not reply.body["jobs"]:
            load.stop.wait(0.05)  # a pull worker's poll interval
            continue
        job = reply.body["jobs"][0]
        payload = job["args"][0]
        load.runs.append(Run(payload, name, job["attempt"]))
        ran += 1
        if hold and ran == 2:
            load.holding.append(payload)
            load.killed.wait()
            return
        acked = api.request("POST", f"/ojs/v1/jobs/{job['id']}/ack", {"result": payload[::-1]})
        assert acked.status == 200, acked.raw


def submitter(load: Load, node: ServerProcess, name: str) -> None:
    """Background jobs over Gearman and OJS, interleaved; each acknowledged one is recorded."""
    api = Runner(f"http://127.0.0.1:{node.http_port}")
    with GearmanSocket(node) as client:
        for i in range(BACKGROUND):
            payload = f"{name}-bg-{i}"
            client.submit_bg(FUNCTION, payload)
            load.acknowledged.add(payload)
            if i % (BACKGROUND // PUSHED) == 0:
                payload = f"{name}-ojs-{i}"
                body = {"type": JOB_TYPE, "args": [payload], "options": {"queue": QUEUE}}
                pushed = api.request("POST", "/ojs/v1/jobs", body)
                assert pushed.status == 201, pushed.raw
                load.acknowledged.add(payload)


def foreground_client(load: Load, node: ServerProcess, name: str) -> None:
    """Foreground jobs, one at a time, each waited for to the end."""
    with GearmanSocket(node, timeout=DEADLINE) as client:
        for i in range(FOREGROUND):
            payload = f"{name}-fg-{i}"
            handle = client.submit_fg(FUNCTION, payload)
            load.acknowledged.add(payload)
            end = client.results_until_done()[-1]
            assert end.type == Cmd.WORK_COMPLETE, end
            assert end.args[0].decode() == handle, end
            load.answered[payload] = end.args[1]


def stuck(
    load: Load, clients: list[threading.Thread], schema: Schema, nodes: list[ServerProcess]
) -> str:
    """What a test that timed out was still waiting for."""
    never_ran = sorted(load.acknowledged - {run.payload for run in load.runs})
    waiting = [client.name for client in clients if client.is_alive()]
    rows = schema.rows(
        "SELECT id, function, queue, state, attempts, owner, client_node FROM {schema}.jobs"
    )
    logs = "\n".join(node.log()[-3000:] for node in nodes)
    return f"never ran: {never_ran}\nclients: {waiting}\nrows: {rows}\nlogs:\n{logs}"


def test_a_node_killed_under_load_loses_nothing_and_runs_nothing_twice_in_one_attempt(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    doomed, second, third = start_nodes(nodes, schema, 3, "--node-lease", "2", http=True)
    named = {"doomed": doomed, "b": second, "c": third}
    load = Load()
    workers = []
    for name, node in named.items():
        hold = node is doomed
        for i in range(2):
            run = partial(gearman_worker, load, node, name, hold)
            workers.append(load.thread(run, f"{name}-gearman-{i}"))
        workers.append(load.thread(partial(ojs_worker, load, node, name, hold), f"{name}-ojs"))
    clients = [
        load.thread(partial(submitter, load, node, name), f"{name}-submitter")
        for name, node in named.items()
    ]
    clients += [
        load.thread(partial(foreground_client, load, node, name), f"{name}-foreground")
        for name, node in named.items()
        if node is not doomed
    ]

    def ready_to_kill() -> bool | None:
        load.check()
        return (len(load.holding) == 3 and not clients[0].is_alive()) or None

    wait_until(ready_to_kill, "the doomed node's jobs submitted and its workers busy", DEADLINE)
    doomed.kill()  # SIGKILL, while the other nodes' clients go on
    load.killed.set()

    def finished() -> bool | None:
        load.check()
        if any(client.is_alive() for client in clients):
            return None
        if not load.acknowledged <= {run.payload for run in load.runs}:
            return None
        return schema.rows("SELECT count(*) FROM {schema}.jobs") == [(0,)] or None

    try:
        wait_until(finished, "every acknowledged job run and finished", DEADLINE)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{stuck(load, clients, schema, nodes)}") from None
    load.stop.set()
    for worker in workers:
        worker.join(DEADLINE)
    load.check()

    runs_of: dict[str, list[Run]] = defaultdict(list)
    for run in load.runs:
        runs_of[run.payload].append(run)
    assert set(runs_of) == load.acknowledged  # every acknowledged job ran; nothing else did
    for runs in runs_of.values():
        # A second run only after a first on the killed node, and never twice elsewhere.
        assert [run.node == "doomed" for run in runs] in ([True], [False], [True, False]), runs
        attempts = [run.attempt for run in runs if run.attempt is not None]
        assert attempts == sorted(set(attempts)), runs  # each run in an attempt of its own
    for payload in load.holding:  # the jobs running on the killed node ran again, once
        assert len(runs_of[payload]) == 2, runs_of[payload]
    foreground = {payload for payload in load.acknowledged if "-fg-" in payload}
    assert len(foreground) == 2 * FOREGROUND
    assert load.answered == {payload: payload[::-1].encode() for payload in foreground}
    assert any("found dead" in node.log() for node in (second, third))
