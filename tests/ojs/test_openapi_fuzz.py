"""Fuzz `/ojs/v1` with schemathesis against the server's own OpenAPI document.

Every operation gets a bounded number of generated requests (valid and invalid); the
server must never answer 5xx, and every 4xx must carry the OJS error body. A second run fuzzes
with extreme numbers: the same document with every numeric bound removed, so integers far
outside 64 bits, 1e308 and negative values reach every numeric field.
"""

from __future__ import annotations

import copy
import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.servers import ServerProcess, start_jobwire

MAX_EXAMPLES = 25


@pytest.fixture(scope="module")
def fuzzed_server() -> Iterator[ServerProcess]:
    proc = start_jobwire(http=True)
    yield proc
    code = proc.stop()
    assert code == 0, f"jobwire exited with {code}:\n{proc.log()}"


def check(case: Any) -> None:
    response = case.call(timeout=10)
    where = f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:500]}"
    assert response.status_code < 500, where
    if 400 <= response.status_code < 500:
        body = response.json()
        error = body.get("error") if isinstance(body, dict) else None
        assert isinstance(error, dict), where
        assert isinstance(error.get("code"), str), where
        assert isinstance(error.get("message"), str), where
        assert isinstance(error.get("retryable"), bool), where


def fuzz_operations(schema: Any, examples: int = MAX_EXAMPLES) -> None:
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 25
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=examples,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        def fuzz(case: Any) -> None:
            check(case)

        fuzz()


def test_no_server_errors_and_ojs_error_bodies(fuzzed_server: ServerProcess) -> None:
    # Driven by hand rather than through schemathesis's pytest plugin, which does not
    # support the pytest version in use.
    base = f"http://127.0.0.1:{fuzzed_server.http_port}/ojs/v1"
    schema = schemathesis.openapi.from_url(base + "/openapi.json")
    schema.config.update(base_url=base)
    fuzz_operations(schema)


BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def unbounded(node: Any) -> Any:
    """The schema without numeric bounds: any integer (64 bits and far beyond), any float."""
    if isinstance(node, dict):
        return {k: unbounded(v) for k, v in node.items() if k not in BOUNDS}
    if isinstance(node, list):
        return [unbounded(item) for item in node]
    return node


def test_extreme_numbers_get_400_never_5xx(fuzzed_server: ServerProcess) -> None:
    base = f"http://127.0.0.1:{fuzzed_server.http_port}/ojs/v1"
    with urllib.request.urlopen(base + "/openapi.json", timeout=10) as response:
        document = json.load(response)
    wide = unbounded(copy.deepcopy(document))
    assert "maximum" not in json.dumps(wide["components"]["schemas"]["Options"])
    schema = schemathesis.openapi.from_dict(wide)
    schema.config.update(base_url=base)
    fuzz_operations(schema, examples=15)


def test_every_route_is_in_the_document() -> None:
    """The document lists every /ojs/v1 route the server serves (but the document itself
    and the test runners' reset), so it cannot drift from the routes."""
    import asyncio

    from jobwire.engine import Engine
    from jobwire.server.ojs.app import OJSOptions, OJSService
    from jobwire.server.ojs.openapi import openapi_document
    from jobwire.server.runtime import Runtime

    async def served() -> set[tuple[str, str]]:
        runtime = Runtime(Engine(), asyncio.get_running_loop())
        app = OJSService(runtime, OJSOptions(allow_reset=True)).app()
        return {
            (route.method.lower(), route.resource.canonical.removeprefix("/ojs/v1"))
            for route in app.router.routes()
            if route.resource is not None
            and route.resource.canonical.startswith("/ojs/v1/")
            and route.method != "HEAD"
        }

    documented = {
        (method, path) for path, ops in openapi_document()["paths"].items() for method in ops
    }
    missing = (
        asyncio.run(served()) - documented - {("get", "/openapi.json"), ("post", "/admin/reset")}
    )
    assert not missing, sorted(missing)
