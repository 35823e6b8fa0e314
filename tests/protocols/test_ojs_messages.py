"""The OJS typed messages (protocols/ojs/messages.py): one declaration gives the decoding,
the limits, the field named in a refusal, and the OpenAPI schemas."""

from __future__ import annotations

import json
import math
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobwire.engine import cronexpr
from jobwire.protocols.ojs import limits
from jobwire.protocols.ojs.envelope import parse_plain_push, parse_push
from jobwire.protocols.ojs.errors import OJSError
from jobwire.protocols.ojs.messages import Envelope, Fetch, convert, schemas
from jobwire.protocols.ojs.retry import RetryPolicy
from jobwire.protocols.ojs.times import format_time, parse_duration, parse_time
from jobwire.server.ojs.openapi import openapi_document


@pytest.mark.parametrize(
    ("body", "field", "status"),
    [
        ({"args": []}, "$.type", 400),
        ({"type": "t", "args": [], "options": {"timeout_ms": 10**29}}, "$.options.timeout_ms", 400),
        ({"type": "t", "args": [], "options": {"priority": True}}, "$.options.priority", 400),
        ({"type": "t", "args": [], "options": {"retry": {"max_attempts": -1}}}, None, 422),
        ({"type": "t", "args": [], "options": {"unique": {"period": "P99999D"}}}, None, 400),
        ({"type": "t", "args": [], "scheduled_at": "9999-12-31T23:59:59-01:00"}, None, 400),
    ],
)
def test_refusals_name_the_field(body: dict[str, Any], field: str | None, status: int) -> None:
    with pytest.raises(OJSError) as caught:
        parse_push(body)
    error = caught.value
    assert error.status == status and error.code == "invalid_request"
    assert error.details is not None
    if field is not None:
        assert error.details["field"] == field
    assert f"`{error.details['field']}`" in error.message


def test_prefixes_place_a_nested_job() -> None:
    with pytest.raises(OJSError) as caught:
        parse_push({"type": "t", "options": {"priority": 101}}, "$.jobs[7]")
    assert caught.value.details == {"field": "$.jobs[7].options.priority"}


@given(st.integers(min_value=0, max_value=limits.MAX_DURATION_S))
def test_durations_within_the_limit_parse_and_render(seconds: int) -> None:
    assert parse_duration(f"PT{seconds}S") == seconds
    ts = parse_time(f"+PT{seconds}S", now=0.0)
    assert format_time(ts).endswith("Z")


@pytest.mark.parametrize(
    "text", ["PT3153600001S", "P36501D", "PT" + "9" * 60 + "S", "P1Y", "-PT1S", "PT"]
)
def test_durations_beyond_the_limit_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


@given(st.floats(min_value=limits.MIN_TIME, max_value=limits.MAX_TIME))
def test_every_time_in_range_renders(ts: float) -> None:
    assert 24 <= len(format_time(ts)) <= 24


def test_retry_backoff_never_overflows() -> None:
    for strategy in ("exponential", "polynomial", "linear", "constant"):
        policy = RetryPolicy(
            max_attempts=limits.MAX_ATTEMPTS,
            backoff_coefficient=limits.MAX_BACKOFF_COEFFICIENT,
            initial_interval=limits.MAX_DURATION_S,
            max_interval=limits.MAX_DURATION_S,
            strategy=strategy,
        )
        for attempt in (1, 2, 1000, limits.MAX_ATTEMPTS):
            delay = policy.delay(attempt)
            assert math.isfinite(delay) and 0 <= delay <= limits.MAX_DURATION_S


def test_the_engine_cron_limits_are_the_binding_s() -> None:
    assert cronexpr.MAX_EVERY == limits.MAX_DURATION_S
    assert int(cronexpr.LATEST) == int(limits.MAX_TIME)
    with pytest.raises(cronexpr.CronError):
        cronexpr.parse(f"@every {limits.MAX_DURATION_S + 1}s")
    never = cronexpr.parse("0 0 31 2 *")
    with pytest.raises(cronexpr.CronError):
        never.first_run(0.0, cronexpr.zone("UTC"))
    assert cronexpr.parse("0 0 29 2 *").first_run(0.0, cronexpr.zone("UTC")) > 0


def test_the_openapi_document_carries_the_structs_limits() -> None:
    components = openapi_document()["components"]["schemas"]
    assert components == {**components, **schemas()}
    priority = components["Options"]["properties"]["priority"]["anyOf"][0]
    assert (priority["minimum"], priority["maximum"]) == (limits.PRIORITY_MIN, limits.PRIORITY_MAX)
    count = components["Fetch"]["properties"]["count"]
    assert count["maximum"] == limits.MAX_FETCH
    body = openapi_document()["paths"]["/jobs"]["post"]["requestBody"]
    assert body["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Envelope"
    }


def test_convert_validates_worker_bodies() -> None:
    assert convert({"queues": ["a"], "count": 3}, Fetch).count == 3
    with pytest.raises(OJSError) as caught:
        convert({"visibility_timeout_ms": 10**20}, Fetch)
    assert caught.value.details == {"field": "$.visibility_timeout_ms"}
    assert convert({"type": "a.b", "args": [2**64 - 1]}, Envelope).args == [2**64 - 1]


# JSON has no NaN or Infinity: the server's decoder refuses them before any parser sees a body.
_JSON_FLOATS = st.floats(allow_nan=False, allow_infinity=False)
_JSON_SCALARS = st.none() | st.booleans() | st.integers() | _JSON_FLOATS | st.text()
_JSON = st.recursive(
    _JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)
_REQUIRED = {
    "type": st.sampled_from(["noop", "a.b", "noop", "a.b", "Bad", "", 1]),
    "args": st.lists(_JSON, max_size=3) | st.lists(_JSON, max_size=3) | _JSON,
}
_FIELDS = {
    "id": st.sampled_from(["019a0000-0000-7000-8000-000000000000", "nope", None]),
    "meta": st.dictionaries(st.text(max_size=5), _JSON, max_size=2) | _JSON,
    "queue": st.sampled_from(["bench", "Bad", "a.b-c", 3]),
    "priority": st.integers(-200, 200) | _JSON_FLOATS | st.booleans(),
    "tags": st.lists(st.text(max_size=4), max_size=2) | _JSON,
    "scheduled_at": st.sampled_from(["2030-01-01T00:00:00Z", "+PT5S", "soon", 5]),
    "specversion": st.sampled_from(["1.0", "2.0"]),
    "schema": st.text(max_size=4) | st.none(),
    "options": st.fixed_dictionaries({}, optional={"queue": st.sampled_from(["q", "Q"])}),
    "x-unknown": _JSON,
}


@settings(max_examples=400)
@given(
    st.fixed_dictionaries(_REQUIRED, optional=_FIELDS)
    | st.fixed_dictionaries({}, optional=_REQUIRED | _FIELDS)
)
def test_the_plain_push_decoder_agrees_with_the_full_one(body: dict[str, Any]) -> None:
    """`parse_plain_push` takes a body only when `parse_push` takes it, and to the same
    request; it leaves every other body (None) to `parse_push`."""
    raw = json.dumps(body).encode()
    # A relative `scheduled_at` ("+PT5S") is read against the clock: both parsers must see
    # the same instant, or their run_at differ by the time between the two calls.
    with mock.patch("time.time", return_value=1_800_000_000.0):
        try:
            full = parse_push(json.loads(raw))
        except OJSError:
            full = None
        plain = parse_plain_push(raw)
    if plain is not None:
        assert plain == full
    if full is not None and "options" not in body and "x-unknown" not in body:
        assert plain == full  # the usual body does take the short way


def test_uuid7_ids_are_version_7_unique_and_carry_their_millisecond() -> None:
    """RFC 9562: 48 bits of Unix milliseconds, version 7, the variant `10`, random bits;
    ids made in one millisecond share its text, and differ in their random bits."""
    import uuid

    from jobwire.protocols.ojs.ids import is_uuid7, uuid7

    at = 1_780_000_000.125  # exact in binary: its milliseconds do not round down
    ids = [uuid7(at) for _ in range(5000)] + [uuid7(at + 0.0625), uuid7()]
    assert len(set(ids)) == len(ids)
    for text in ids:
        assert is_uuid7(text), text
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant) == (7, uuid.RFC_4122)
    assert {uuid.UUID(text).int >> 80 for text in ids[:5000]} == {int(at * 1000)}
    assert uuid.UUID(ids[5000]).int >> 80 == 1_780_000_000_187
    # Every variant digit occurs (they come from random bits, not a constant).
    assert {text[19] for text in ids[:5000]} == set("89ab")
