"""The nesting bound every JSON protocol applies (protocols/json_depth)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from jobwire.protocols.json_depth import MAX_DEPTH, too_deep


def nested(levels: int) -> Any:
    """`levels` of arrays and objects, alternating, innermost empty."""
    value: Any = []
    for level in range(levels - 1):
        value = {"k": value} if level % 2 else [value]
    return value


@pytest.mark.parametrize("levels", [1, 2, MAX_DEPTH - 1, MAX_DEPTH])
def test_documents_up_to_the_bound_pass(levels: int) -> None:
    raw = orjson.dumps(nested(levels))
    assert not too_deep(raw, orjson.loads(raw))
    assert not too_deep(raw.decode(), orjson.loads(raw))


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, MAX_DEPTH + 2, 1000])
def test_deeper_documents_are_caught(levels: int) -> None:
    inner = levels - 2  # inside the outer object and its array
    raw = b'{"a": 1, "b": [' + b"[" * inner + b"]" * inner + b', "x"]}'
    assert too_deep(raw, orjson.loads(raw))
    assert too_deep(raw.decode(), orjson.loads(raw))


def test_many_shallow_containers_and_brackets_in_strings_are_not_depth() -> None:
    value = {"rows": [[i, {"v": "[{" * 100}] for i in range(1000)]}
    raw = orjson.dumps(value)
    assert raw.count(b"[") + raw.count(b"{") > MAX_DEPTH  # so the walk runs
    assert not too_deep(raw, value)
    assert too_deep(raw, value, limit=3)
    assert not too_deep(raw, value, limit=4)


def test_scalars_are_one_level_at_most() -> None:
    assert not too_deep(b'"[[[["', "[[[[", limit=1)
    assert not too_deep(b"5", 5, limit=0)
