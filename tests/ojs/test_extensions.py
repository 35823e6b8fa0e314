"""The OJS extension suites jobwire implements (upstream ojs-conformance `suites/ext-*`),
against a real jobwire process on the memory and the SQLite store, as the core suites are
run (`test_conformance`): one pytest case per JSON test, the server reset before each.

EXTENSIONS names the suites run here. WRONG_TESTS lists the tests whose JSON file itself is
wrong, each with the reason (the README's OJS section reports them upstream's way): they run
as strict xfails, so a listed test that starts passing fails the run. The terminal summary
reports the pass count of every extension on each store.
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
EXTENSIONS = (
    "admin-api",
    "backpressure",
    "dead-letter",
    "graceful-shutdown",
    "observability",
    "progress",
    "rate-limiting",
)

#: test_id -> why the test's file is wrong (the server is right not to pass it).
WRONG_TESTS: dict[str, str] = {
    "EXT-OBS-003": (
        "asserts Content-Type exactly 'text/plain' (the reference runner compares header "
        "strings exactly); the Prometheus text exposition format is served as "
        "'text/plain; version=...; charset=utf-8', which no standard /metrics can avoid"
    ),
}

#: store -> extension -> test -> passed; read by conftest's terminal summary.
EXT_RESULTS: dict[str, dict[str, dict[str, bool]]] = {}
STORES = ("memory", "sqlite")


def _load() -> list[tuple[str, dict[str, Any]]]:
    tests = []
    for name in EXTENSIONS:
        for path in sorted((SUITES / f"ext-{name}").glob("*.json")):
            tests.append((name, json.loads(path.read_text())))
    return tests


TESTS = _load()


def _param(extension: str, test: dict[str, Any]) -> Any:
    marks = [pytest.mark.timeout(120)]
    reason = WRONG_TESTS.get(test["test_id"])
    if reason is not None:
        marks.append(pytest.mark.xfail(strict=True, reason=reason))
    return pytest.param(
        extension, test, id=f"{extension}/{test['test_id']}/{test['name']}", marks=marks
    )


@pytest.fixture(scope="module", params=STORES)
def ojs_ext_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    with suite_server(request.param, tmp_path_factory.mktemp("ojs-ext")) as server:
        yield server


@pytest.mark.parametrize(("extension", "test"), [_param(*t) for t in TESTS])
def test_extension(ojs_ext_server: ServerProcess, extension: str, test: dict[str, Any]) -> None:
    tests = EXT_RESULTS.setdefault(str(ojs_ext_server.extra["store"]), {}).setdefault(extension, {})
    run_suite_test(ojs_ext_server, test, lambda passed: tests.__setitem__(test["test_id"], passed))


def test_extension_lists_name_real_tests() -> None:
    known = {t["test_id"] for _, t in TESTS}
    assert set(WRONG_TESTS) <= known, set(WRONG_TESTS) - known
    assert len(TESTS) == 31, (
        f"expected the 31 tests of {len(EXTENSIONS)} extensions, got {len(TESTS)}"
    )
