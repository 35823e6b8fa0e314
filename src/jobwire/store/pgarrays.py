"""One-dimensional PostgreSQL arrays in their binary wire format, built in one pass.

The PostgreSQL store sends each batch as column arrays (`jobwire.store.postgres.BATCH_SQL`).
psycopg can dump a Python list as an array, but it first looks through the list for the
element type, then dumps element by element in Python; for the store's 14 columns that was a
third of the server's CPU of a batched enqueue. The column types are known here, so each
column is encoded at once: a header (dimensions, null flag, element oid, length, lower bound)
then per element its 4-byte length (-1: NULL) and its bytes, mostly by C-level operations
(`struct.pack` of the whole column, strided copies into the records, `bytes.join`).

`encode(type_name, values)` answers a `PgArray`, which psycopg sends as is, with the array's
oid, in binary: the statement's placeholders for them must be `%b`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any

from psycopg import adapters, pq
from psycopg.adapt import Dumper

_NULL = b"\xff\xff\xff\xff"
#: The 4-byte lengths of short elements, ready to join (most text and payloads are short).
_LENGTHS = [struct.pack(">i", n) for n in range(4096)]
_pack_length = struct.Struct(">i").pack
#: The same, as latin-1 text: ASCII elements and their lengths are joined as one string.
_TEXT_LENGTHS = [length.decode("latin-1") for length in _LENGTHS]


class PgArray:
    """A column array in PostgreSQL's binary format (a subclass per element type tells
    psycopg the oid)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self.data)} bytes)"


def _header(element_oid: int, count: int, has_null: bool) -> bytes:
    if not count:
        return struct.pack(">iii", 0, 0, element_oid)
    return struct.pack(">iiiii", 1, has_null, element_oid, count, 1)


def _fixed(code: str, width: int, element_oid: int) -> Callable[[Sequence[Any]], bytes]:
    """An encoder of numbers of `width` bytes (struct `code`)."""
    one = struct.Struct(f">i{code}").pack

    def encode(values: Sequence[Any]) -> bytes:
        count = len(values)
        nulls = values.count(None)
        if nulls == count:  # an empty column or only NULLs: no per-element work
            return _header(element_oid, count, bool(count)) + _NULL * count
        if nulls:
            body = b"".join(_NULL if v is None else one(width, v) for v in values)
            return _header(element_oid, count, True) + body
        if values.count(values[0]) == count:  # one value (a state, an owner): one record
            return _header(element_oid, count, False) + one(width, values[0]) * count
        # No NULL: pack the values at once, then copy them, byte column by byte column,
        # into records of (length, value), whose constant length is copied the same way.
        packed = struct.pack(f">{count}{code}", *values)
        step = 4 + width
        records = bytearray(step * count)
        records[3::step] = bytes((width,)) * count
        for offset in range(width):
            records[4 + offset :: step] = packed[offset::width]
        return _header(element_oid, count, False) + records

    return encode


def _varying(element_oid: int, is_text: bool) -> Callable[[Sequence[Any]], bytes]:
    """An encoder of text (UTF-8) or bytea elements."""

    def encode(values: Sequence[Any]) -> bytes:
        count = len(values)
        nulls = values.count(None)
        if nulls == count:
            return _header(element_oid, count, bool(count)) + _NULL * count
        if nulls:
            parts: list[bytes] = []
            for value in values:
                if value is None:
                    parts.append(_NULL)
                else:
                    data = value.encode() if is_text else value
                    parts.append(_pack_length(len(data)))
                    parts.append(data)
            return _header(element_oid, count, True) + b"".join(parts)
        first = values[0]
        if values.count(first) == count:  # one value (a function, a queue): one record
            data = first.encode() if is_text else bytes(first)
            return _header(element_oid, count, False) + (_pack_length(len(data)) + data) * count
        lengths = list(map(len, values))
        if is_text and all(map(str.isascii, values)) and max(lengths) < len(_LENGTHS):
            # ASCII: a character is a byte, so the lengths are known before encoding
            text = "".join(
                chain.from_iterable(
                    zip(map(_TEXT_LENGTHS.__getitem__, lengths), values, strict=True)
                )
            )
            return _header(element_oid, count, False) + text.encode("latin-1")
        items: Sequence[Any] = list(map(str.encode, values)) if is_text else values
        if is_text:
            lengths = list(map(len, items))
        if max(lengths) < len(_LENGTHS):
            prefixes: Any = map(_LENGTHS.__getitem__, lengths)
        else:
            prefixes = map(_pack_length, lengths)
        body = b"".join(chain.from_iterable(zip(prefixes, items, strict=True)))
        return _header(element_oid, count, False) + body

    return encode


#: Per SQL element type: the array's oid, the element's oid and its encoder.
_TYPES: dict[str, tuple[int, Callable[[Sequence[Any]], bytes]]] = {
    "int2": (1005, _fixed("h", 2, 21)),
    "integer": (1007, _fixed("i", 4, 23)),
    "bigint": (1016, _fixed("q", 8, 20)),
    "float8": (1022, _fixed("d", 8, 701)),
    "text": (1009, _varying(25, is_text=True)),
    "bytea": (1001, _varying(17, is_text=False)),
}


def _array_class(type_name: str, array_oid: int) -> type[PgArray]:
    cls = type(f"PgArray_{type_name}", (PgArray,), {"__slots__": ()})

    class ArrayDumper(Dumper):
        format = pq.Format.BINARY
        oid = array_oid

        def dump(self, obj: Any) -> bytes:
            return obj.data  # type: ignore[no-any-return]

    adapters.register_dumper(cls, ArrayDumper)
    return cls


_CLASSES = {name: _array_class(name, array_oid) for name, (array_oid, _) in _TYPES.items()}
_ENCODERS = {name: encoder for name, (_, encoder) in _TYPES.items()}


def encode(type_name: str, values: Sequence[Any]) -> PgArray:
    """`values` as an array of `type_name` (int2, integer, bigint, float8, text, bytea)."""
    return _CLASSES[type_name](_ENCODERS[type_name](values))
