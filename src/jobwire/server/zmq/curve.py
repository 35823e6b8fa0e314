"""CURVE on the ZeroMQ endpoints, and roles by client key (`--zmq-curve-secret`).

Every ROUTER the server binds becomes a CURVE server with the key pair of
`--zmq-curve-secret FILE` (a ZeroMQ certificate: `jobwire auth curve-keypair`, or pyzmq's
`zmq.auth.create_certificates`). Which clients may connect is checked during the handshake by
a ZAP handler (pyzmq's ThreadAuthenticator, in its own thread): the public keys of the
--auth file's principals (`curve_public_key`) and of `--zmq-curve-clients FILE` (one Z85 key
a line; other lines starting with `#` are comments). With neither, any client key is
accepted: the traffic is encrypted, nobody is authenticated.

With --auth, each message carries its sender's key (the ZAP User-Id), which names the
principal; `RoleCheck` then lets a client key send client messages only (MDP client
requests, MMI, Titanic, Paranoid Pirate and Freelance requests) and a worker key worker
messages only (MDP worker commands, the Pirate backend, WMP). A refused Majordomo request is
answered with the error body `403`; a refused Majordomo worker is sent DISCONNECT; a refused
WMP message is answered ERROR `reason=forbidden: ...` by WMP's own rule (a message that is not
WMP at all is dropped); other refusals are dropped (those protocols have no way to say no)
and logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

import zmq
from jobwire.server.auth import CLIENT, WORKER, Authenticator

log = logging.getLogger("jobwire.zmq")

#: The ZAP domain of jobwire's sockets (the authenticator's callbacks are per domain).
DOMAIN: Final = "jobwire"
#: A refused Majordomo request's error status (the body is `majordomo.error_body`).
FORBIDDEN: Final = b"403"


@dataclass
class CurveOptions:
    """The server's key pair and the client keys allowed (empty: any)."""

    public: bytes
    secret: bytes
    clients: frozenset[bytes] = field(default_factory=frozenset)

    @classmethod
    def load(
        cls, secret_file: Path, clients_file: Path | None, auth: Authenticator | None
    ) -> CurveOptions:
        try:
            public, secret = zmq.auth.load_certificate(secret_file)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{secret_file}: not a ZeroMQ certificate: {exc}") from exc
        if secret is None:
            raise ValueError(f"{secret_file} holds no secret key (use the .key_secret file)")
        keys: set[bytes] = set()
        if auth is not None:
            keys.update(key.encode() for key in auth.curve_keys())
        if clients_file is not None:
            for number, line in enumerate(clients_file.read_text().splitlines(), 1):
                text = line.strip()
                # Z85 keys may hold (and start with) "#": a 40-character word is a key.
                if len(text) == 40 and not any(c.isspace() for c in text):
                    keys.add(text.encode())
                elif text and not text.startswith("#"):
                    raise ValueError(f"{clients_file}:{number}: not a 40-character Z85 key")
        return cls(public, secret, frozenset(keys))


class _Keys:
    """The ZAP credentials provider: an immutable set, read from the authenticator's thread."""

    def __init__(self, keys: frozenset[bytes]) -> None:
        self.keys = keys

    def callback(self, domain: str, key: bytes) -> bool:
        return key in self.keys


def start_authenticator(context: zmq.Context[Any], curve: CurveOptions) -> ThreadAuthenticator:
    """The ZAP handler every CURVE handshake on `context` asks."""
    authenticator = ThreadAuthenticator(context, log=logging.getLogger("jobwire.zmq.zap"))
    authenticator.start()
    if curve.clients:
        authenticator.configure_curve_callback(DOMAIN, credentials_provider=_Keys(curve.clients))
    else:
        authenticator.configure_curve(DOMAIN, zmq.auth.CURVE_ALLOW_ANY)
    return authenticator


def make_curve_server(sock: zmq.Socket[Any], curve: CurveOptions) -> None:
    """Before bind: this socket is a CURVE server."""
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_SECRETKEY, curve.secret)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, curve.public)
    sock.setsockopt(zmq.ZAP_DOMAIN, DOMAIN.encode())


#: `check(identity, frames, user_id)`: True lets the message through.
Check = Callable[[bytes, list[bytes], str], bool]

_MDP_CLIENT: Final = (b"MDPC01", b"MDPC02")
_MDP_WORKER: Final = (b"MDPW01", b"MDPW02")


class RoleCheck:
    """Role checks per listener, for messages whose sender's key the ZAP handler named."""

    def __init__(self, auth: Authenticator, send_majordomo: Callable[[bytes, list[bytes]], None]):
        self.auth = auth
        self.send_majordomo = send_majordomo

    def _may(self, user_id: str, role: str) -> bool:
        principal = self.auth.by_curve_key(user_id)
        return principal is not None and principal.may(role)

    def fixed(self, role: str, listener: str) -> Check:
        """A listener all of whose messages need `role`."""

        def check(identity: bytes, frames: list[bytes], user_id: str) -> bool:
            if self._may(user_id, role):
                return True
            log.warning("%s: refused a message of a key without the %s role", listener, role)
            return False

        return check

    def wmp(self, refuse: Callable[[bytes, list[bytes], str], None]) -> Check:
        """The WMP manager's socket: worker keys only; `refuse(identity, frames, reason)`
        answers anything else ERROR (`WmpManager.refuse`)."""

        def check(identity: bytes, frames: list[bytes], user_id: str) -> bool:
            if self._may(user_id, WORKER):
                return True
            log.warning("wmp: refused a message of a key without the worker role")
            refuse(identity, frames, "forbidden: this key's principal lacks the worker role")
            return False

        return check

    def majordomo(self, identity: bytes, frames: list[bytes], user_id: str) -> bool:
        header = frames[1] if len(frames) > 1 else b""
        if header in _MDP_CLIENT:
            if self._may(user_id, CLIENT):
                return True
            self._refuse_request(identity, frames)
            return False
        if header in _MDP_WORKER:
            if self._may(user_id, WORKER):
                return True
            log.warning("majordomo: refused a worker key without the worker role")
            # DISCONNECT: the worker is told to go (MDP's only refusal of a worker).
            self.send_majordomo(identity, [b"", header, b"\x05"])
            return False
        return True  # not MDP: the broker drops it as invalid

    def _refuse_request(self, identity: bytes, frames: list[bytes]) -> None:
        from jobwire.protocols.zmq import mdp
        from jobwire.server.zmq.majordomo import error_body

        log.warning("majordomo: refused a request of a key without the client role")
        try:
            message = mdp.decode(frames)
        except mdp.MdpError:
            return
        if isinstance(message, mdp.Request):
            body = error_body(FORBIDDEN, "this key's principal lacks the client role")
            self.send_majordomo(identity, mdp.reply(message.version, message.service, body))
