"""Errors answered or met by every listener, counted by kind for `/metrics`
(`jobwire_errors_total{kind=...}`).

Kinds are `LISTENER_CODE` in lower case: `http_not_found` (an OJS error code over HTTP),
`gearman_queue_error` (an ERROR packet sent, by its code), `ws_malformed_json` (a `/work`
socket closed for what its worker sent), `mdp_invalid` (a ZeroMQ message dropped), ...
Counting is a dict increment on paths that already build an error reply, so it costs the
hot paths nothing; the exporter reads the counter when scraped. One counter for the
process: a server is one process.
"""

from __future__ import annotations

from collections import Counter

ERRORS: Counter[str] = Counter()


def count_error(kind: str) -> None:
    """Count one error of `kind` (a `LISTENER_CODE` name, see the module's docstring)."""
    ERRORS[kind.lower()] += 1
