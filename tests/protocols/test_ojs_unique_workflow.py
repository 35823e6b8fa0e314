"""Sans-IO OJS pieces: unique-job policies and fingerprints, workflow requests, relative
times, error classes."""

from __future__ import annotations

import pytest

from jobwire.protocols.ojs.errors import OJSError, classify_error
from jobwire.protocols.ojs.times import parse_time
from jobwire.protocols.ojs.unique import DEFAULT_STATES, parse_unique
from jobwire.protocols.ojs.workflow import parse_workflow


def test_unique_defaults_and_fingerprints() -> None:
    policy = parse_unique({})
    assert policy is not None
    assert policy.on_conflict == "reject" and policy.states == frozenset(DEFAULT_STATES)
    a = policy.fingerprint("t", "q", [{"x": 1, "y": 2}], None)
    assert a == policy.fingerprint("t", "q", [{"y": 2, "x": 1}], None)  # key order ignored
    assert a != policy.fingerprint("t", "other", [{"x": 1, "y": 2}], None)


def test_unique_args_keys_and_meta_keys() -> None:
    policy = parse_unique(
        {
            "keys": ["type", "args", "meta"],
            "args_keys": ["user"],
            "meta_keys": ["tenant"],
            "period": "PT2S",
        }
    )
    assert policy is not None and policy.period == 2.0
    same = policy.fingerprint("t", "q", [{"user": 1, "x": 1}], {"tenant": "a", "trace": 1})
    assert same == policy.fingerprint("t", "q2", [{"user": 1, "x": 2}], {"tenant": "a"})
    assert same != policy.fingerprint("t", "q", [{"user": 2}], {"tenant": "a"})


@pytest.mark.parametrize(
    "raw",
    [
        [],
        {"keys": ["nope"]},
        {"keys": ["meta"]},
        {"on_conflict": "merge"},
        {"period": "soon"},
        {"states": ["finished"]},
    ],
)
def test_bad_unique_policies(raw: object) -> None:
    with pytest.raises(OJSError):
        parse_unique(raw)


def test_workflow_requests() -> None:
    job = {"type": "a.b", "args": []}
    chain = parse_workflow({"type": "chain", "steps": [job, job]})
    assert chain.type == "chain" and len(chain.steps) == 2
    batch = parse_workflow({"type": "batch", "jobs": [job], "callbacks": {"on_success": job}})
    assert list(batch.callbacks) == ["on_success"]
    for bad in (
        {"type": "dag", "steps": [job]},
        {"type": "chain", "steps": []},
        {"type": "chain", "steps": [{"args": []}]},
        {"type": "group", "jobs": [job], "callbacks": {"on_success": job}},
        {"type": "batch", "jobs": [job], "callbacks": {"later": job}},
    ):
        with pytest.raises(OJSError):
            parse_workflow(bad)


def test_relative_times_and_error_classes() -> None:
    assert parse_time("+PT5S", now=100.0) == 105.0
    assert parse_time("2020-01-01T00:00:00Z") == 1577836800.0
    assert classify_error("Database connection timed out") == "ConnectionTimeout"
    assert classify_error("API rate limit reached") == "RateLimitExceeded"
    assert classify_error("Unexpected null reference") == "InternalServerError"
