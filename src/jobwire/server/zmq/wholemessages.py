"""Whole-message receive and send (`jobwire._zmqframes`, C) for the ROUTER sockets, if usable.

The extension is optional: setup.py builds it next to the compiled hot modules, and without
it (a pure install, no compiler, a pyzmq whose libzmq cannot be found) the sockets keep
pyzmq's per-frame calls. `JOBWIRE_ZMQFRAMES=0` (and `JOBWIRE_PURE=1`, unless
`JOBWIRE_ZMQFRAMES=1` says otherwise) choose those too, so both paths stay tested. It must
use the libzmq that pyzmq loaded: it is given the file of pyzmq's compiled backend and
finds libzmq's functions among that file's dependencies.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

log = logging.getLogger("jobwire.zmq")

RecvMessage = Callable[[int], "tuple[bytes, list[bytes]] | None"]
SendMessage = Callable[[int, bytes, list[bytes]], None]

_reason = ""


def _off(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


def _load() -> tuple[RecvMessage, SendMessage] | None:
    global _reason
    chosen = os.environ.get("JOBWIRE_ZMQFRAMES", "")
    if chosen == "0" or (chosen == "" and _off("JOBWIRE_PURE")):
        _reason = "turned off by the environment"
        return None
    try:
        from jobwire import _zmqframes
    except ImportError:
        _reason = "not built"
        return None
    try:
        from zmq.backend.cython import _zmq as backend

        path = backend.__file__
        if path is None:
            raise OSError("pyzmq's backend has no file")
        _zmqframes.bind(path)
    except (ImportError, OSError) as exc:  # another pyzmq backend, or its libzmq not found
        _reason = f"pyzmq's libzmq not usable ({exc})"
        return None
    return _zmqframes.recv_message, _zmqframes.send_message


_functions = _load()
#: `recv_message(socket.underlying)`: (identity, frames), or None if no message waits.
recv_message: RecvMessage | None = _functions[0] if _functions else None
#: `send_message(socket.underlying, identity, frames)`.
send_message: SendMessage | None = _functions[1] if _functions else None


def status() -> str:
    """For `jobwire --version`: which path ZeroMQ messages take."""
    if recv_message is not None:
        return "whole messages (C)"
    return f"pyzmq frames ({_reason})"
