"""The OJS conformance suites (levels 0-4, 133 JSON tests) against a real jobwire process,
once on the memory store and once on the SQLite store (the default, which logs every job
change to its redo log).

The JSON tests are read from tests/ojs/conformance/suites (a copy kept in the repository) and run by
`tests.ojs.dsl`, a Python interpreter of the suite's DSL, one pytest case per JSON test, with
the server reset (`POST /ojs/v1/admin/reset`, served with `--allow-reset`) before each.

NOT_YET_SUPPORTED lists the tests jobwire does not pass yet, each with the reason. They run as
strict xfails: a listed test that starts passing fails the run until it is removed from the
list, so the list can only shrink and cannot hide a regression. The terminal summary reports
the conformant level: the highest level whose tests, and all lower levels' tests, pass.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ojs.dsl import run_suite_test, suite_server
from tests.servers import ServerProcess

SUITES = Path(__file__).resolve().parent / "conformance" / "suites"
LEVELS = {
    0: "level-0-core",
    1: "level-1-reliable",
    2: "level-2-scheduled",
    3: "level-3-workflows",
    4: "level-4-advanced",
}

#: test_id -> why it does not pass yet. Remove entries as features land.
NOT_YET_SUPPORTED: dict[str, str] = {}

#: store -> test -> (level, passed); filled as tests run, read by conftest's terminal summary.
RESULTS: dict[str, dict[str, tuple[int, bool]]] = {}
STORES = ("memory", "sqlite")


def _load() -> list[tuple[int, Path, dict[str, Any]]]:
    tests = []
    for level, folder in LEVELS.items():
        for path in sorted((SUITES / folder).rglob("*.json")):
            tests.append((level, path, json.loads(path.read_text())))
    return tests


TESTS = _load()
assert TESTS, f"no conformance tests found under {SUITES}"


def _param(level: int, path: Path, test: dict[str, Any]) -> Any:
    test_id = test["test_id"]
    marks = []
    reason = NOT_YET_SUPPORTED.get(test_id)
    if reason is not None:
        marks.append(pytest.mark.xfail(strict=True, reason=reason))
    marks.append(pytest.mark.timeout(600))
    return pytest.param(level, test, id=f"L{level}/{test_id}/{test['name']}", marks=marks)


@pytest.fixture(scope="module", params=STORES)
def ojs_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    with suite_server(request.param, tmp_path_factory.mktemp("ojs")) as server:
        yield server


@pytest.mark.parametrize(("level", "test"), [_param(*t) for t in TESTS])
def test_conformance(ojs_server: ServerProcess, level: int, test: dict[str, Any]) -> None:
    results = RESULTS.setdefault(str(ojs_server.extra["store"]), {})
    key = test["test_id"] + "/" + test["name"]
    run_suite_test(ojs_server, test, lambda passed: results.__setitem__(key, (level, passed)))


def test_not_yet_supported_names_real_tests() -> None:
    known = {t["test_id"] for _, _, t in TESTS}
    assert set(NOT_YET_SUPPORTED) <= known, set(NOT_YET_SUPPORTED) - known
    assert len(TESTS) == 133, f"expected the 133 core tests, found {len(TESTS)}"
