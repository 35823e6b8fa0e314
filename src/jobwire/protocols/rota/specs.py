"""Job specs: validation, canonical form and checksum.

A job spec is a JSON object with at least `name` (the job type: the OJS `type`, the Gearman
function). Everything else (description, parameter schema, version, ...) is the deployer's.

Canonical form (docs/rota.md, "Job specs"): the UTF-8 bytes of the spec's compact JSON with
object keys sorted by Unicode code point, no whitespace, strings escaped only where JSON
requires it (`"`, `\\`, control characters: `\\b \\f \\n \\r \\t`, other ones as `\\u00xx`),
integers in plain decimal. Floats are refused (their text differs between languages); so are
integers beyond ±(2**53 - 1). This is RFC 8785 (JCS) for the values allowed, except that JCS
sorts keys by UTF-16 code units, which only differs for keys with characters above U+FFFF.
The checksum is the lowercase hex SHA-256 of the canonical form.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from jobwire.protocols.json_depth import MAX_DEPTH, too_deep

MAX_SPEC = 64 * 1024  # bytes of canonical form
MAX_NAME = 255
_SAFE = 2**53 - 1


class SpecError(ValueError):
    """The document is not a valid job spec."""


def _check(value: Any, path: str) -> None:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, int):
        if not -_SAFE <= value <= _SAFE:
            raise SpecError(f"{path}: integers must be within ±(2**53 - 1)")
        return
    if isinstance(value, float):
        raise SpecError(f"{path}: numbers with a fraction or exponent are not allowed in specs")
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check(item, f"{path}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            _check(item, f"{path}.{key}")
        return
    raise SpecError(f"{path}: {type(value).__name__} is not JSON")


def validate_spec(spec: Any) -> str:
    """Check that `spec` is a job spec; return its name. Raises SpecError."""
    if not isinstance(spec, dict):
        raise SpecError("a job spec is a JSON object")
    name = spec.get("name")
    if not isinstance(name, str) or not name or len(name) > MAX_NAME or "\0" in name:
        raise SpecError(f"name must be a non-empty string of at most {MAX_NAME} characters")
    _check(spec, "$")
    return name


def canonical(spec: Any) -> bytes:
    """The canonical form of a valid spec (see the module doc). Raises SpecError."""
    validate_spec(spec)
    data = orjson.dumps(spec, option=orjson.OPT_SORT_KEYS)
    if len(data) > MAX_SPEC:
        raise SpecError(f"the spec is {len(data)} bytes in canonical form; the limit is {MAX_SPEC}")
    return data


def checksum(spec: Any) -> str:
    """Lowercase hex SHA-256 of the canonical form. Raises SpecError."""
    return hashlib.sha256(canonical(spec)).hexdigest()


def load_spec(data: bytes | str) -> dict[str, Any]:
    """Parse and validate a spec document (a file, a request body). Raises SpecError."""
    try:
        spec = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise SpecError(f"not JSON: {exc}") from None
    if too_deep(data, spec):
        raise SpecError(f"nested deeper than {MAX_DEPTH} levels")
    validate_spec(spec)
    canonical(spec)  # the size check
    assert isinstance(spec, dict)
    return spec
