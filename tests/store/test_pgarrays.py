"""The column arrays of the PostgreSQL store's batches, encoded by jobwire, as PostgreSQL
reads them: every element type, with and without NULLs, one value repeated or distinct
values, ASCII and other text, elements long and short. Against the local PostgreSQL."""

from __future__ import annotations

import struct
from typing import Any

import psycopg
import pytest

from jobwire.store import pgarrays
from tests.pg import Schema, pg_schema

__all__ = ["pg_schema"]

LONG = "é" * 3000  # 6,000 bytes: past the precomputed lengths
COLUMNS: list[tuple[str, list[Any]]] = [
    ("int2", [1, -2, 32767, -32768]),
    ("integer", [0, -1, 2**31 - 1, -(2**31)]),
    ("bigint", [1, 2**63 - 1, -(2**63), 0]),
    ("float8", [1.5, 0.0, -2.25, 1e300, 3]),
    ("text", ["a", "", "H:host:12", "x" * 5000]),
    ("text", ["grüße", "✓", LONG, "plain"]),
    ("bytea", [b"", b"\x00\xff\x00", b"y" * 70_000, memoryview(b"view")]),
]


def shapes(values: list[Any]) -> list[list[Any]]:
    """The same values as the store meets them: none, distinct, one repeated, NULLs alone,
    NULLs among them."""
    return [[], values, [values[0]] * 3, [None] * 2, [None, *values, None]]


@pytest.mark.parametrize(("type_name", "values"), COLUMNS)
def test_postgresql_reads_each_array_as_it_was_given(
    pg_schema: Schema, type_name: str, values: list[Any]
) -> None:
    with psycopg.connect(pg_schema.dsn, autocommit=True) as conn:
        for shape in shapes(values):
            array = pgarrays.encode(type_name, shape)
            read = conn.execute(f"SELECT %b::{type_name}[]", [array]).fetchone()
            assert read is not None
            expected = [bytes(v) if isinstance(v, memoryview) else v for v in shape]
            assert read[0] == expected, (type_name, shape[:3])


def test_a_value_out_of_the_type_s_range_is_an_error_not_a_wrong_number() -> None:
    with pytest.raises(struct.error):
        pgarrays.encode("int2", [40_000])
    with pytest.raises(struct.error):
        pgarrays.encode("integer", [1, 2**31])
    with pytest.raises(struct.error):
        pgarrays.encode("bigint", [None, 2**63])
