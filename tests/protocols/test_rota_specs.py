"""Job spec canonical form and checksum (protocols/rota/specs.py)."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobwire.protocols.rota import SpecError, canonical, checksum, load_spec


def test_canonical_form_sorts_keys_and_drops_whitespace() -> None:
    spec = {"name": "resize", "params": {"width": 1, "height": 2}, "b": [True, None, "é\n"]}
    assert (
        canonical(spec)
        == '{"b":[true,null,"é\\n"],"name":"resize","params":{"height":2,"width":1}}'.encode()
    )


def test_checksum_is_sha256_hex_of_the_canonical_form() -> None:
    spec = {"name": "resize"}
    assert checksum(spec) == hashlib.sha256(b'{"name":"resize"}').hexdigest()


def test_key_order_and_formatting_do_not_change_the_checksum() -> None:
    a = load_spec(b'{\n  "name": "resize",\n  "version": 2\n}')
    b = load_spec(b'{"version":2,"name":"resize"}')
    assert checksum(a) == checksum(b)
    assert checksum(a) != checksum({"name": "resize", "version": 3})


@pytest.mark.parametrize(
    "document",
    [
        b"[1]",
        b'{"version": 1}',
        b'{"name": ""}',
        b'{"name": 5}',
        b'{"name": "a", "ratio": 0.5}',
        b'{"name": "a", "big": 9007199254740992}',
        b"{nope",
        orjson.dumps({"name": "a", "pad": "x" * 70_000}),
        b'{"name": "a", "deep": ' + b"[" * 300 + b"]" * 300 + b"}",
    ],
)
def test_invalid_specs_are_refused(document: bytes) -> None:
    with pytest.raises(SpecError):
        load_spec(document)


_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
    | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=15,
)


@settings(max_examples=100, derandomize=True, database=None, deadline=None)
@given(st.dictionaries(st.text(max_size=5), _values, max_size=5))
def test_canonical_form_is_stable_under_reparsing(extra: dict[str, Any]) -> None:
    spec = {**extra, "name": "job"}
    form = canonical(spec)
    assert canonical(orjson.loads(form)) == form
    assert checksum(load_spec(orjson.dumps(spec, option=orjson.OPT_INDENT_2))) == checksum(spec)
