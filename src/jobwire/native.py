"""Which modules setup.py compiles with mypyc, and whether this process runs them compiled.

The .py files stay the reference: `JOBWIRE_PURE=1` runs them even where the compiled
extensions are installed, and so does a build whose sources changed after it was compiled,
so stale compiled code never runs. Calls between these modules are native, so they load
all compiled or all pure, never mixed. This module is never compiled, and `import jobwire`
runs it, so it imports little.
"""

from __future__ import annotations

import os
import sys
import zlib
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec

#: The Gearman and Majordomo hot paths, the OJS push's and the SDK's, compiled together into
#: one shared library (`jobwire.hot__mypyc`).
MODULES = (
    "jobwire.engine.engine",
    "jobwire.engine.events",
    "jobwire.engine.job",
    "jobwire.engine.jobindex",
    "jobwire.engine.lanes",
    "jobwire.engine.timers",
    "jobwire.engine.worker",
    "jobwire.protocols.gearman.decoder",
    "jobwire.protocols.gearman.packets",
    "jobwire.protocols.gearman.replies",
    "jobwire.protocols.gearman.scanner",
    "jobwire.server.gearman.acks",
    "jobwire.server.gearman.admin",
    "jobwire.server.gearman.handlers",
    "jobwire.server.gearman.server",
    "jobwire.server.gearman.transport",
    "jobwire.server.runtime",
    "jobwire.protocols.zmq.frames",
    "jobwire.protocols.zmq.mdp",
    "jobwire.protocols.zmq.services",
    "jobwire.server.zmq.majordomo",
    "jobwire.server.zmq.sockets",
    "jobwire.store.frames",
    "jobwire.ports.journal",
    "jobwire.store.redolog",
    "jobwire.store.sqlite",
    # The OJS binding's push path: its sans-IO parts, the HTTP plumbing, the direct
    # dispatch, the push route and the service with its edges middleware. The msgspec
    # structs stay in the interpreted messages.py: msgspec reads their annotations, which
    # mypyc does not keep.
    "jobwire.protocols.ojs.ids",
    "jobwire.protocols.ojs.times",
    "jobwire.protocols.ojs.envelope",
    "jobwire.server.ojs.render",
    "jobwire.server.ojs.http",
    "jobwire.server.ojs.direct",
    "jobwire.server.ojs.jobs",
    "jobwire.server.ojs.app",
    # The Python SDK's per-job path (client connections, the worker). `client.py` is not
    # among them: mypyc does not compile async generators (`AsyncClient.stream`); its
    # per-job part is `submit.py`'s base class.
    "jobwire.sdk.connection",
    "jobwire.sdk.lifecycle",
    "jobwire.sdk.payload",
    "jobwire.sdk.session",
    "jobwire.sdk.slots",
    "jobwire.sdk.submit",
    "jobwire.sdk.worker",
)
GROUP = "jobwire.hot"
#: Written beside this file by setup.py after a successful compile: the sources it compiled.
BUILD_RECORD = "native-build.txt"
PACKAGE = os.path.dirname(os.path.abspath(__file__))

_reason = ""  # why the pure sources run, when they do


def source(module: str) -> str:
    return os.path.join(PACKAGE, *module.split(".")[1:]) + ".py"


def build_record() -> str:
    """A checksum of each module's source (to notice edits, so CRC-32 is enough)."""
    lines = []
    for name in MODULES:
        with open(source(name), "rb") as file:
            lines.append(f"{zlib.crc32(file.read()):08x} {name}\n")
    return "".join(lines)


class _PureFinder:
    """A meta path finder: MODULES from their .py files, ahead of the extensions beside them."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in MODULES:
            return None
        from importlib.util import spec_from_file_location

        return spec_from_file_location(fullname, source(fullname))


def choose() -> None:
    """Run the pure sources unless a current compiled build is installed (`import jobwire`)."""
    global _reason
    if os.environ.get("JOBWIRE_PURE", "") not in ("", "0"):
        _reason = "JOBWIRE_PURE is set"
    else:
        try:
            with open(os.path.join(PACKAGE, BUILD_RECORD)) as file:
                built = file.read()
        except OSError:
            _reason = "not compiled"
        else:
            if built != build_record():
                _reason = "sources changed since the compiled build: make install"
    if _reason and not any(isinstance(f, _PureFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PureFinder())


def status() -> str:
    """`compiled (mypyc)` or `pure Python (why)`, from how the hot modules actually loaded."""
    from importlib import import_module
    from importlib.machinery import EXTENSION_SUFFIXES

    files = [import_module(name).__file__ or "" for name in MODULES]
    if all(file.endswith(tuple(EXTENSION_SUFFIXES)) for file in files):
        return "compiled (mypyc)"
    return f"pure Python ({_reason or 'not compiled'})"


if __name__ == "__main__":  # the Makefile's list of compiled sources
    root = os.path.dirname(os.path.dirname(PACKAGE))
    print(" ".join(os.path.relpath(source(name), root) for name in MODULES))
