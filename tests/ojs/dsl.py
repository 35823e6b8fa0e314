"""An interpreter of the OJS conformance test DSL (ojs-conformance docs/test-case-reference.md).

Each JSON test is a list of HTTP steps with assertions; this module runs them against a base
URL with the standard library's HTTP client and raises AssertionError naming the step and the
assertion that failed. It follows the reference Go runner's rules: JSONPath subset, templates
`{{steps.ID.response.body.PATH}}`, matchers, `~` tolerance max(50%, 100 ms).

Three forms the extension suites use that the reference runner (v0.4.0) does not read are
taken at their evident meaning: a step's `capture` ({"name": "$.path"}) names values of its
response body for later `{{name}}` templates, `repeat: N` sends the step N times (each must
pass), and `{"$eq": value}` matches a header or value exactly.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from tests.servers import ServerProcess

TOLERANCE_PCT = 50
MIN_TOLERANCE_MS = 100
UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
UUID7_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
DATETIME_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")
TEMPLATE_RE = re.compile(r"\{\{\s*steps\.([^.}]+)\.response\.body\.?([^}]*)\}\}")
CAPTURE_RE = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
#: Where a step's captured values are kept in `responses` (no step id contains a space).
CAPTURED = " captured"
_MISSING = object()


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    raw: bytes
    body: Any
    elapsed_ms: float


# ---------------------------------------------------------------------- JSONPath subset

_TOKEN_RE = re.compile(r"\.([^.\[]+)|\[(\d+)\]|\[\*\]|\[\?\(@\.([^=]+)==\s*'?([^')]*)'?\)\]")


def resolve(doc: Any, path: str) -> Any:
    """The value at `path` ($.a.b[0], [*], [?(@.k=='v')]) or _MISSING."""
    if path in ("$", ""):
        return doc
    if not path.startswith("$"):
        path = "$." + path
    rest = path[1:]
    pos = 0
    current: Any = doc
    while pos < len(rest):
        m = _TOKEN_RE.match(rest, pos)
        if m is None:
            return _MISSING
        token = m.group(0)
        pos = m.end()
        if token == "[*]":
            if not isinstance(current, list):
                return _MISSING
            tail = "$" + rest[pos:]
            out = []
            for item in current:
                value = resolve(item, tail)
                if value is not _MISSING:
                    out.append(value)
            return out
        if m.group(1) is not None:
            if not isinstance(current, dict) or m.group(1) not in current:
                return _MISSING
            current = current[m.group(1)]
        elif m.group(2) is not None:
            index = int(m.group(2))
            if not isinstance(current, list) or index >= len(current):
                return _MISSING
            current = current[index]
        else:
            key, want = m.group(3).strip(), m.group(4)
            if not isinstance(current, list):
                return _MISSING
            for item in current:
                if isinstance(item, dict) and key in item and _as_text(item[key]) == want:
                    current = item
                    break
            else:
                return _MISSING
    return current


def _as_text(value: Any) -> str:
    """Go's %v for the values JSON produces."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "<nil>"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


# ---------------------------------------------------------------------- templates


def _template_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int | float):
        return str(int(value)) if float(value).is_integer() else repr(value)
    return json.dumps(value, separators=(",", ":"))


def render(value: Any, responses: dict[str, Response]) -> Any:
    """Replace templates in strings, recursively; unresolved templates stay as they are."""
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            response = responses.get(m.group(1))
            if response is None:
                return m.group(0)
            found = resolve(response.body, "$." + m.group(2) if m.group(2) else "$")
            return m.group(0) if found is _MISSING else _template_value(found)

        def sub_captured(m: re.Match[str]) -> str:
            captured = responses.get(CAPTURED)
            found = captured.body.get(m.group(1), _MISSING) if captured is not None else _MISSING
            return m.group(0) if found is _MISSING else _template_value(found)

        return CAPTURE_RE.sub(sub_captured, TEMPLATE_RE.sub(sub, value))
    if isinstance(value, list):
        return [render(v, responses) for v in value]
    if isinstance(value, dict):
        return {render(k, responses): render(v, responses) for k, v in value.items()}
    return value


# ---------------------------------------------------------------------- matchers


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _approx(actual: Any, expected: float) -> bool:
    if not _is_number(actual):
        return False
    tolerance = max(expected * TOLERANCE_PCT / 100, MIN_TOLERANCE_MS)
    return bool(abs(actual - expected) <= tolerance)


def _length_ok(value: Any, n: int, minimum: bool = False) -> bool:
    return isinstance(value, list) and (len(value) >= n if minimum else len(value) == n)


def match(value: Any, matcher: Any) -> bool:
    """Does `value` (or _MISSING) satisfy `matcher`?"""
    if isinstance(matcher, dict):
        return _match_object(value, matcher)
    if isinstance(matcher, list):
        return (
            isinstance(value, list)
            and len(value) == len(matcher)
            and all(match(v, m) for v, m in zip(value, matcher, strict=True))
        )
    if isinstance(matcher, bool) or matcher is None:
        return value is not _MISSING and type(value) is type(matcher) and value == matcher
    if _is_number(matcher):
        return _is_number(value) and value == matcher
    assert isinstance(matcher, str)
    m = matcher
    if m == "any":
        return value is not _MISSING and value is not None
    if m == "absent":
        return value is _MISSING or value is None
    if m == "exists":
        return value is not _MISSING
    if m in ("string:nonempty", "string:non_empty"):
        return isinstance(value, str) and value != ""
    if m == "string:uuid":
        return isinstance(value, str) and UUID_RE.match(value) is not None
    if m == "string:uuidv7":
        return isinstance(value, str) and UUID7_RE.match(value) is not None
    if m == "string:datetime":
        return isinstance(value, str) and DATETIME_RE.match(value) is not None
    if m.startswith("string:contains:"):
        return isinstance(value, str) and m[len("string:contains:") :] in value
    if m.startswith("string:pattern(") and m.endswith(")"):
        return isinstance(value, str) and re.search(m[15:-1], value) is not None
    if m == "number:positive":
        return _is_number(value) and value > 0
    if m == "number:non_negative":
        return _is_number(value) and value >= 0
    if m.startswith("number:range(") and m.endswith(")"):
        lo, hi = (float(x) for x in m[13:-1].split(","))
        return _is_number(value) and lo <= value <= hi
    if m.startswith("one_of:"):
        return _as_text(value) in m[7:].split(",")
    if m.startswith("~"):
        try:
            expected = float(m[1:])
        except ValueError:
            return value == m
        return _approx(value, expected)
    if m == "array:nonempty":
        return isinstance(value, list) and len(value) > 0
    if m == "array:empty":
        return value == []
    for prefix in ("array:length:", "array:length("):
        if m.startswith(prefix):
            return _length_ok(value, int(m[len(prefix) :].rstrip(")")))
    for prefix in ("array:min_length:", "array:min:"):
        if m.startswith(prefix):
            return _length_ok(value, int(m[len(prefix) :]), minimum=True)
    if m.startswith("contains:"):
        return isinstance(value, list) and any(_as_text(v) == m[9:] for v in value)
    if m.startswith("not_contains:"):
        return isinstance(value, list) and all(_as_text(v) != m[13:] for v in value)
    return value is not _MISSING and (value == m or _as_text(value) == m)


_TYPES = {
    "string": lambda v: isinstance(v, str),
    "number": _is_number,
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


def _match_object(value: Any, matcher: dict[str, Any]) -> bool:
    for op, arg in matcher.items():
        if op == "$exists":
            if (value is not _MISSING) != bool(arg):
                return False
        elif op == "$eq":
            if value is _MISSING or value != arg:
                return False
        elif op == "$type":
            if value is _MISSING or not _TYPES[arg](value):
                return False
        elif op == "$match":
            if not isinstance(value, str) or re.search(arg, value) is None:
                return False
        elif op in ("$in", "$or"):
            if not any(match(value, alt) for alt in arg):
                return False
        elif op == "$size":
            if not isinstance(value, list):
                return False
            if isinstance(arg, dict):
                if "$gte" in arg and len(value) < arg["$gte"]:
                    return False
                if "$lte" in arg and len(value) > arg["$lte"]:
                    return False
            elif len(value) != arg:
                return False
        elif op == "$empty":
            empty = value is _MISSING or value is None or value in ({}, [], "")
            if empty != bool(arg):
                return False
        elif op == "range":
            if not _is_number(value):
                return False
            if "min" in arg and value < arg["min"]:
                return False
            if "max" in arg and value > arg["max"]:
                return False
        elif op in ("$gte", "$gt", "$lte", "$lt"):
            if not _is_number(value):
                return False
            ok = {
                "$gte": value >= arg,
                "$gt": value > arg,
                "$lte": value <= arg,
                "$lt": value < arg,
            }[op]
            if not ok:
                return False
        else:
            # A plain object: compare as a literal.
            return bool(value == matcher)
    return True


# ---------------------------------------------------------------------- running steps


class Runner:
    def __init__(self, base_url: str, timeout: float = 30.0) -> None:
        parts = urlsplit(base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.timeout = timeout

    def request(
        self, method: str, path: str, body: Any = _MISSING, headers: dict[str, str] | None = None
    ) -> Response:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            hdrs = {"Content-Type": "application/openjobspec+json"}
            hdrs.update(headers or {})
            payload = None if body is _MISSING else json.dumps(body).encode()
            start = time.monotonic()
            conn.request(method, path, body=payload, headers=hdrs)
            resp = conn.getresponse()
            raw = resp.read()
            elapsed = (time.monotonic() - start) * 1000
            try:
                parsed: Any = json.loads(raw) if raw else None
            except ValueError:
                parsed = None
            return Response(
                resp.status, {k.lower(): v for k, v in resp.getheaders()}, raw, parsed, elapsed
            )
        finally:
            conn.close()

    def reset(self) -> None:
        response = self.request("POST", "/ojs/v1/admin/reset", {})
        assert response.status == 200, f"reset failed: {response.status} {response.raw!r}"

    def run_test(self, test: dict[str, Any]) -> None:
        responses: dict[str, Response] = {}
        steps: list[dict[str, Any]] = []
        for part in ("setup", "steps", "teardown"):
            block = test.get(part) or []
            if isinstance(block, dict):
                block = block.get("steps", [])
            steps.extend(block)
        done: set[str] = set()
        for index, step in enumerate(steps):
            if step["id"] in done:
                continue
            group = [step]
            partners = step.get("parallel_with") or []
            if isinstance(partners, str):
                partners = [partners]
            group += [s for s in steps[index + 1 :] if s["id"] in partners]
            if len(group) == 1:
                self._run_step(step, responses)
            else:
                self._run_parallel(group, responses)
            done.update(s["id"] for s in group)

    def _run_parallel(self, group: list[dict[str, Any]], responses: dict[str, Response]) -> None:
        results: dict[str, Response | BaseException] = {}

        def work(step: dict[str, Any]) -> None:
            try:
                results[step["id"]] = self._execute(step, responses)
            except BaseException as exc:  # re-raised below, in the test's thread
                results[step["id"]] = exc

        threads = [threading.Thread(target=work, args=(s,)) for s in group]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for step in group:
            result = results[step["id"]]
            if isinstance(result, BaseException):
                raise result
            responses[step["id"]] = result
            self._check(step, result, responses)

    def _run_step(self, step: dict[str, Any], responses: dict[str, Response]) -> None:
        action = step["action"].upper()
        if action == "WAIT":
            time.sleep((step.get("duration_ms") or step.get("delay_ms") or 0) / 1000)
            return
        if action == "ASSERT":
            if step.get("delay_ms"):
                time.sleep(step["delay_ms"] / 1000)
            self._cross_assert(step, responses)
            return
        for _ in range(max(1, int(step.get("repeat") or 1))):
            response = self._execute(step, responses)
            responses[step["id"]] = response
            self._check(step, response, responses)
        self._capture(step, responses[step["id"]], responses)

    @staticmethod
    def _capture(step: dict[str, Any], response: Response, responses: dict[str, Response]) -> None:
        """A step's `capture`: values of its response body, for later `{{name}}` templates."""
        wanted = step.get("capture") or {}
        if not wanted:
            return
        captured = responses.get(CAPTURED)
        if captured is None:
            captured = responses[CAPTURED] = Response(0, {}, b"", {}, 0.0)
        for name, path in wanted.items():
            value = resolve(response.body, path)
            if value is not _MISSING:
                captured.body[name] = value

    def _execute(self, step: dict[str, Any], responses: dict[str, Response]) -> Response:
        if step.get("delay_ms"):
            time.sleep(step["delay_ms"] / 1000)
        path = render(step["path"], responses)
        body = render(step["body"], responses) if "body" in step else _MISSING
        headers = render(step.get("headers") or {}, responses)
        return self.request(step["action"].upper(), path, body, headers)

    # ------------------------------------------------------------------ assertions

    def _check(self, step: dict[str, Any], response: Response, responses: dict[str, Any]) -> None:
        assertions = render(step.get("assertions") or {}, responses)
        where = f"step {step['id']} ({step['action']} {render(step.get('path'), responses)})"
        detail = f"got {response.status} {response.raw[:2000]!r}"
        status = assertions.get("status")
        if status is not None:
            ok = match(response.status, status) or (
                isinstance(status, str) and _as_text(response.status) == status
            )
            assert ok, f"{where}: status should match {status!r}; {detail}"
        if "status_in" in assertions:
            assert response.status in assertions["status_in"], f"{where}: status; {detail}"
        body = assertions.get("body")
        if body:
            self._check_body(body, response.body, where, detail)
        for path in assertions.get("body_absent") or []:
            assert resolve(response.body, path) is _MISSING, f"{where}: {path} present; {detail}"
        for text in assertions.get("body_contains") or []:
            assert text.encode() in response.raw, f"{where}: body lacks {text!r}; {detail}"
        for name, expected in (assertions.get("headers") or {}).items():
            actual = response.headers.get(name.lower(), _MISSING)
            ok = match(actual, expected) if isinstance(expected, dict) else actual == expected
            assert ok, f"{where}: header {name} should be {expected!r}, got {actual!r}"
        timing = assertions.get("timing_ms") or {}
        if "less_than" in timing:
            assert response.elapsed_ms < timing["less_than"], f"{where}: too slow"
        if "greater_than" in timing:
            assert response.elapsed_ms > timing["greater_than"], f"{where}: too fast"
        if "approximate" in timing:
            assert _approx(response.elapsed_ms, timing["approximate"]), f"{where}: timing"

    def _check_body(self, body: dict[str, Any], doc: Any, where: str, detail: str) -> None:
        if "$or" in body:
            alternatives = body["$or"]
            ok = any(self._body_ok(alt, doc) for alt in alternatives)
            assert ok, f"{where}: no $or alternative matched {alternatives!r}; {detail}"
        for path, matcher in body.items():
            if path == "$or":
                continue
            value = resolve(doc, path)
            assert match(value, matcher), (
                f"{where}: {path} should match {matcher!r}, "
                f"got {'<missing>' if value is _MISSING else repr(value)}; {detail}"
            )

    def _body_ok(self, body: dict[str, Any], doc: Any) -> bool:
        try:
            self._check_body(body, doc, "", "")
        except AssertionError:
            return False
        return True

    def _cross_assert(self, step: dict[str, Any], responses: dict[str, Response]) -> None:
        assertions = render(step.get("assertions") or {}, responses)
        where = f"step {step['id']} (ASSERT)"
        claim = assertions.get("exclusive_claim")
        if claim is not None:
            job_id = claim["job_id"]
            fetched = []
            for raw in claim["fetches"]:
                try:
                    jobs = json.loads(raw) if isinstance(raw, str) else raw
                except ValueError:
                    jobs = []
                ids = [j.get("id") for j in jobs or [] if isinstance(j, dict)]
                fetched.append(ids)
            holders = sum(1 for ids in fetched if job_id in ids)
            if claim.get("exactly_one_has_job"):
                assert holders == 1, f"{where}: {holders} fetches claimed {job_id}: {fetched}"
            if claim.get("exactly_one_empty"):
                empties = sum(1 for ids in fetched if not ids)
                assert empties == 1, f"{where}: {empties} empty fetches: {fetched}"
        equality = assertions.get("equality")
        if equality is not None:
            context = {"steps": {k: {"response": {"body": r.body}} for k, r in responses.items()}}
            for path, expected in equality.items():
                actual = resolve(context, path)
                want = json.loads(expected) if isinstance(expected, str) else expected
                assert actual == want, f"{where}: {path} differs: {actual!r} != {want!r}"


@contextmanager
def suite_server(store_kind: str, workdir: Path) -> Iterator[ServerProcess]:
    """A jobwire process for a run of JSON suites (`store_kind`: memory or sqlite), stopped
    cleanly at the end."""
    from tests.servers import start_jobwire

    store = "memory" if store_kind == "memory" else f"sqlite:{workdir / 'jobs.db'}"
    server = start_jobwire(["--allow-reset"], http=True, store=store, workdir=workdir)
    server.extra["store"] = store_kind
    yield server
    code = server.stop()
    assert code == 0, f"jobwire exited with {code}:\n{server.log()}"


def run_suite_test(
    server: ServerProcess, test: dict[str, Any], record: Callable[[bool], None]
) -> None:
    """Run one suite test on a freshly reset server; `record` hears whether it passed."""
    runner = Runner(f"http://127.0.0.1:{server.http_port}")
    runner.reset()
    passed = False
    try:
        runner.run_test(test)
        passed = True
    finally:
        record(passed)
