"""Who may do what: principals, their roles, tokens, TLS contexts and a per-principal rate.

`--auth FILE` names the principals (TOML, read with the standard library's `tomllib`)::

    [principals.billing]
    token_sha256 = "9f86d081884c7d65..."   # `jobwire auth hash-token`; the token is never stored
    roles = ["client"]

    [principals.render-farm]
    subject = "CN=render-farm,O=Example"   # a TLS client certificate's subject (--tls-client-ca)
    roles = ["worker"]

    [principals.zmq-worker]
    curve_public_key = "Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID"   # a ZeroMQ CURVE key (Z85)
    roles = ["worker"]

Roles: `client` submits jobs and reads their state, `worker` fetches and finishes them,
`admin` may do everything (it implies the two others). docs/security.md has the table of
what each role may do on every listener.

Tokens are random secrets (`jobwire auth new-token` makes one): a SHA-256 of 32 random bytes
cannot be searched, so one unsalted hash is enough and keeps a check cheap. A presented
token is hashed and compared with every principal's hash with `hmac.compare_digest`, none
skipped, so the time taken says nothing about which principal (if any) nearly matched.
Tokens are never logged: only principal names are.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import secrets
import ssl
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

log = logging.getLogger("jobwire.auth")

CLIENT: Final = "client"
WORKER: Final = "worker"
ADMIN: Final = "admin"
ROLES: Final = (CLIENT, WORKER, ADMIN)


class AuthFileError(ValueError):
    """The --auth file cannot be used; the message says where and why."""


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    roles: frozenset[str]

    def may(self, role: str) -> bool:
        """Whether this principal acts in `role` (admin may act in every role)."""
        return role in self.roles or ADMIN in self.roles

    @property
    def is_admin(self) -> bool:
        return ADMIN in self.roles


def hash_token(token: str | bytes) -> str:
    """The hex SHA-256 of a token, as `token_sha256` in the --auth file holds it."""
    raw = token.encode() if isinstance(token, str) else token
    return hashlib.sha256(raw).hexdigest()


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


@dataclass(slots=True)
class _Entry:
    principal: Principal
    token_hash: bytes | None = None
    subject: str | None = None
    curve_key: str | None = None


@dataclass
class Authenticator:
    """The principals of an --auth file, looked up by token, certificate subject or key."""

    entries: list[_Entry] = field(default_factory=list)

    @classmethod
    def from_file(cls, path: Path) -> Authenticator:
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, UnicodeDecodeError) as exc:
            raise AuthFileError(f"{path}: cannot read: {exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise AuthFileError(f"{path}: not TOML: {exc}") from exc
        return cls.from_mapping(data, str(path))

    @classmethod
    def from_mapping(cls, data: dict[str, Any], where: str = "auth") -> Authenticator:
        principals = data.get("principals")
        if not isinstance(principals, dict) or not principals:
            raise AuthFileError(f"{where}: no [principals.NAME] tables")
        entries: list[_Entry] = []
        for name, table in principals.items():
            if not isinstance(table, dict):
                raise AuthFileError(f"{where}: principals.{name} is not a table")
            unknown = set(table) - {"token_sha256", "subject", "curve_public_key", "roles"}
            if unknown:
                raise AuthFileError(f"{where}: principals.{name}: unknown keys {sorted(unknown)}")
            roles = table.get("roles")
            if (
                not isinstance(roles, list)
                or not roles
                or not all(isinstance(r, str) and r in ROLES for r in roles)
            ):
                raise AuthFileError(
                    f"{where}: principals.{name}.roles must list some of {', '.join(ROLES)}"
                )
            entry = _Entry(Principal(name, frozenset(roles)))
            token_hash = table.get("token_sha256")
            if token_hash is not None:
                if not isinstance(token_hash, str):
                    raise AuthFileError(f"{where}: principals.{name}.token_sha256: not a string")
                try:
                    digest = bytes.fromhex(token_hash)
                except ValueError:
                    digest = b""
                if len(digest) != 32:
                    raise AuthFileError(
                        f"{where}: principals.{name}.token_sha256 must be 64 hex digits "
                        "(jobwire auth hash-token)"
                    )
                entry.token_hash = digest
            subject = table.get("subject")
            if subject is not None:
                if not isinstance(subject, str) or not subject:
                    raise AuthFileError(f"{where}: principals.{name}.subject: not a string")
                entry.subject = normalise_subject(subject)
            key = table.get("curve_public_key")
            if key is not None:
                if not isinstance(key, str) or len(key) != 40:
                    raise AuthFileError(
                        f"{where}: principals.{name}.curve_public_key must be 40 Z85 characters"
                    )
                entry.curve_key = key
            if entry.token_hash is None and entry.subject is None and entry.curve_key is None:
                raise AuthFileError(
                    f"{where}: principals.{name} needs token_sha256, subject or curve_public_key"
                )
            entries.append(entry)
        return cls(entries)

    @property
    def principals(self) -> list[Principal]:
        return [entry.principal for entry in self.entries]

    def by_token(self, token: str | bytes) -> Principal | None:
        """The principal whose token this is; every hash is compared, in constant time."""
        raw = token.encode() if isinstance(token, str) else token
        digest = hashlib.sha256(raw).digest()
        found: Principal | None = None
        for entry in self.entries:
            if entry.token_hash is not None and hmac.compare_digest(digest, entry.token_hash):
                found = entry.principal
        return found

    def by_subject(self, subject: str) -> Principal | None:
        wanted = normalise_subject(subject)
        for entry in self.entries:
            if entry.subject is not None and entry.subject == wanted:
                return entry.principal
        return None

    def by_certificate(self, cert: dict[str, Any] | None) -> Principal | None:
        """The principal of a verified peer certificate (`SSLObject.getpeercert()`)."""
        if not cert:
            return None
        return self.by_subject(certificate_subject(cert))

    def by_curve_key(self, key: str) -> Principal | None:
        for entry in self.entries:
            if entry.curve_key is not None and hmac.compare_digest(key, entry.curve_key):
                return entry.principal
        return None

    def curve_keys(self) -> list[str]:
        return [entry.curve_key for entry in self.entries if entry.curve_key is not None]


def normalise_subject(subject: str) -> str:
    """`CN=a, O=b` and `cn=a,O=b` are the same subject: attribute names upper-cased, the
    spaces after commas dropped; the order is the certificate's."""
    parts = []
    for part in subject.split(","):
        name, sep, value = part.strip().partition("=")
        parts.append(f"{name.strip().upper()}{sep}{value.strip()}")
    return ",".join(parts)


_SHORT_NAMES: Final = {
    "commonName": "CN",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "emailAddress": "EMAILADDRESS",
    "domainComponent": "DC",
}


def certificate_subject(cert: dict[str, Any]) -> str:
    """A peer certificate's subject as `CN=...,O=...`, in the certificate's order."""
    parts = []
    for rdn in cert.get("subject", ()):
        for name, value in rdn:
            parts.append(f"{_SHORT_NAMES.get(name, name).upper()}={value}")
    return ",".join(parts)


def bearer_token(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer TOKEN` header (None: missing or another scheme)."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def is_loopback(host: str) -> bool:
    """Whether a --listen address reaches this machine only."""
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


# ------------------------------------------------------------------ TLS


@dataclass
class TLSFiles:
    """--tls-cert, --tls-key and (mutual TLS) --tls-client-ca."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.load(context)
        return context

    def load(self, context: ssl.SSLContext) -> None:
        """(Re-)read the files into `context`: handshakes from now on use them; established
        connections keep the keys they agreed on. The files are tried on a scratch context
        first, so a broken file leaves `context` as it was (ssl.SSLError or OSError)."""
        scratch = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        scratch.load_cert_chain(self.cert, self.key)
        if self.client_ca is not None:
            scratch.load_verify_locations(cafile=self.client_ca)
        context.load_cert_chain(self.cert, self.key)
        if self.client_ca is not None:
            context.load_verify_locations(cafile=self.client_ca)
            context.verify_mode = ssl.CERT_REQUIRED
        else:
            context.verify_mode = ssl.CERT_NONE


# ------------------------------------------------------------------ rate


class RateLimiter:
    """Requests per second per key (a principal's name, or a peer address without --auth):
    a token bucket of `rate` tokens a second holding at most `rate` (a one-second burst),
    and at least one."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = max(1.0, rate)
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}

    def take(self, key: str) -> float:
        """0.0 if a request of `key` may go on now, else the seconds until it may."""
        now = self._clock()
        tokens, last = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        if tokens >= 1.0:
            self._buckets[key] = (tokens - 1.0, now)
            if len(self._buckets) > 100_000:  # keys of long-gone peers: start afresh
                self._buckets.clear()
            return 0.0
        self._buckets[key] = (tokens, now)
        return (1.0 - tokens) / self.rate


@dataclass
class Security:
    """The security settings every listener sees (None/empty: off)."""

    auth: Authenticator | None = None
    tls: TLSFiles | None = None
    #: The one server-side context, shared by the Gearman and HTTP listeners, re-read in
    #: place on SIGHUP (`reload`).
    context: ssl.SSLContext | None = None
    rate: float | None = None
    _limiter: RateLimiter | None = field(default=None, repr=False)

    def rate_limiter(self) -> RateLimiter | None:
        """--rate-limit's one limiter, shared by the HTTP and Gearman ports (a principal's
        requests on both count against one budget); None without --rate-limit."""
        if self.rate and self._limiter is None:
            self._limiter = RateLimiter(self.rate)
        return self._limiter

    def reload(self) -> None:
        if self.tls is not None and self.context is not None:
            self.tls.load(self.context)
            log.info("TLS certificate files re-read")
