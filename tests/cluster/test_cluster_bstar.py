"""Binary Star on the PostgreSQL store (server/bstar.py with store/pgcluster.py): the pair
are two nodes of one cluster, so the backup that takes over carries on with the jobs the
primary accepted. Real servers on the local PostgreSQL; every wait polls for a condition.
"""

from __future__ import annotations

import pytest

from jobwire.sdk import Client
from tests.cluster.conftest import POLL
from tests.interop.gearman_raw import Cmd, GearmanSocket, wait_until
from tests.pg import Schema
from tests.servers import ServerProcess, free_port, start_jobwire
from tests.zmq.test_bstar import BEAT, role, serves

pytestmark = pytest.mark.interop


def _start(
    nodes: list[ServerProcess], schema: Schema, role_name: str, local: int, remote: int
) -> ServerProcess:
    args = ["--bstar", role_name, "--bstar-heartbeat", BEAT, "--verbose", "INFO"]
    args += ["--bstar-local", f"tcp://127.0.0.1:{local}"]
    args += ["--bstar-remote", f"tcp://127.0.0.1:{remote}"]
    args += ["--cluster-poll", POLL, "--node-lease", "3"]
    server = start_jobwire(args, store=schema.dsn, http=True)
    nodes.append(server)
    return server


def test_the_backup_that_takes_over_runs_the_jobs_the_primary_accepted(
    schema: Schema, nodes: list[ServerProcess]
) -> None:
    one, two = free_port(), free_port()
    primary = _start(nodes, schema, "primary", one, two)
    backup = _start(nodes, schema, "backup", two, one)
    wait_until(lambda: serves(primary), "the primary serves")
    wait_until(lambda: role(backup) == "passive", "the backup is passive")
    with Client([primary.address, backup.address], retries=200, backoff=0.02) as client:
        accepted = {
            client.submit_background("carried", str(n).encode(), wait=True) for n in range(20)
        }
        assert len(accepted) == 20
        primary.kill()
        after = client.submit_background("carried", b"after", wait=True)  # the vote
    assert serves(backup)
    worker = GearmanSocket(backup)
    worker.send(Cmd.CAN_DO, "carried")
    ran: list[bytes] = []

    def run_one() -> bool | None:
        worker.send(Cmd.GRAB_JOB)
        reply = worker.recv()
        if reply.type == Cmd.NO_JOB:
            return None
        assert reply.type == Cmd.JOB_ASSIGN, reply
        handle, _function, payload = reply.args
        ran.append(payload)
        worker.send(Cmd.WORK_COMPLETE, handle, b"")
        return len(ran) == 21 or None

    # The primary's jobs come once its node lease ran out (3 s here): every one, once.
    wait_until(run_one, "the primary's jobs run on the backup")
    assert sorted(ran) == sorted([str(n).encode() for n in range(20)] + [b"after"])
    assert after and after not in accepted
