"""The OJS conformance suites (levels 0-4) against a cluster of two nodes on one PostgreSQL
schema, the runner sending each request to the other node in turn (as a load balancer
spreading requests over nodes would): a job pushed on one node is fetched on the other, acked
on the first, read back on the second.

Before each test both nodes are reset (`POST /ojs/v1/admin/reset`) and the shared queue's rows
are deleted. The suites' WAIT steps stay as written (they wait for scheduled times and
retries to come due; a cross-node step answers in tens of milliseconds here).

NOT_ON_A_CLUSTER lists the tests that fail for what a cluster does not share yet (docs/
scaling.md, "Not built"), each with its reason; they run as strict xfails, so a test that
starts passing fails the run until it is taken off the list.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.conftest import start_nodes
from tests.ojs.dsl import Response, Runner
from tests.ojs.test_conformance import TESTS
from tests.pg import Schema, new_schema
from tests.servers import ServerProcess

pytestmark = pytest.mark.interop

#: Shared state that reaches the other nodes through a notification: a request to the other
#: node right after a change may still see the state before it. These cases pass when the
#: notification wins the race (usually), so they are not strict.
_NOTIFIED = "cron registrations and pauses reach the other node by notification, a moment later"

#: test_id/name -> why it fails on two nodes. Remove entries as the cluster shares more.
NOT_ON_A_CLUSTER: dict[str, str] = {}

#: test_id/name -> why it may fail on two nodes (a race it usually wins): not strict.
MAY_RACE_ON_A_CLUSTER: dict[str, str] = {
    "L2-CRON-002/cron-list": _NOTIFIED,
    "L2-CRON-003/cron-delete": _NOTIFIED,
    "L2-CRON-005/cron-overlap-prevention": _NOTIFIED,
    "L2-CRON-007/cron-special-expressions": _NOTIFIED,
    "L2-TZ-001/cron-timezone-support": _NOTIFIED,
    "L4-PAUSE-001/pause-queue": _NOTIFIED,
    "L4-PAUSE-002/resume-queue": _NOTIFIED,
}


class AlternatingRunner(Runner):
    """The suites' runner, each request to the next node in turn."""

    def __init__(self, urls: list[str]) -> None:
        self.runners = [Runner(url) for url in urls]
        self.turn = itertools.cycle(self.runners)
        super().__init__(urls[0])

    def request(self, *args: Any, **kwargs: Any) -> Response:
        return next(self.turn).request(*args, **kwargs)


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[Schema, list[ServerProcess]]]:
    nodes: list[ServerProcess] = []
    with new_schema() as schema:
        try:
            start_nodes(nodes, schema, 2, "--allow-reset", http=True)
            yield schema, nodes
        finally:
            for node in nodes:
                node.kill()


def _param(level: int, test: dict[str, Any]) -> Any:
    test_id = test["test_id"]
    marks = [pytest.mark.timeout(600)]
    key = f"{test_id}/{test['name']}"
    reason = NOT_ON_A_CLUSTER.get(key)
    if reason is not None:
        marks.append(pytest.mark.xfail(strict=True, reason=reason))
    elif key in MAY_RACE_ON_A_CLUSTER:
        marks.append(pytest.mark.xfail(strict=False, reason=MAY_RACE_ON_A_CLUSTER[key]))
    return pytest.param(level, test, id=f"L{level}/{test_id}/{test['name']}", marks=marks)


@pytest.mark.parametrize(("level", "test"), [_param(level, test) for level, _, test in TESTS])
def test_conformance_on_two_nodes(
    cluster: tuple[Schema, list[ServerProcess]], level: int, test: dict[str, Any]
) -> None:
    schema, nodes = cluster
    for node in nodes:
        Runner(f"http://127.0.0.1:{node.http_port}").reset()
    schema.rows("DELETE FROM {schema}.jobs WHERE owner IS NULL")
    runner = AlternatingRunner([f"http://127.0.0.1:{node.http_port}" for node in nodes])
    runner.run_test(test)
