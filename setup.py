"""Build jobwire, compiling the hot modules (`jobwire.native.MODULES`) with mypyc if it can.

`JOBWIRE_PURE=1` skips compiling. A compile that fails (no C compiler or Python headers,
code mypyc rejects) prints a warning and leaves a pure-Python install that works the same.
Only a successful build writes `jobwire/native-build.txt`, the record without which
`jobwire.native` ignores compiled extensions; every build first deletes the old one.

Beside them, one hand-written C extension, `jobwire._zmqframes` (whole ZeroMQ messages per
call, `jobwire.server.zmq.wholemessages`), needs only Python's headers; if it fails to
build, the ZeroMQ sockets use pyzmq's per-frame calls and the rest of the build stands.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
PACKAGE = ROOT / "src" / "jobwire"
native: dict[str, Any] = runpy.run_path(str(PACKAGE / "native.py"))
record = ""
#: pip also runs this file for build requirements and metadata, which need no C sources.
BUILDS = {"build", "build_ext", "bdist_wheel", "editable_wheel", "develop", "install"}


def warn(message: str) -> None:
    print(f"jobwire: {message}; installing the pure-Python modules", file=sys.stderr)


def forget_build() -> None:
    """Drop the in-tree record and extensions of an earlier build (an editable install's)."""
    (PACKAGE / native["BUILD_RECORD"]).unlink(missing_ok=True)
    for path in PACKAGE.rglob("*.so"):
        path.unlink()


#: Hand-written C; its `.so` goes beside the mypyc ones (and `forget_build` deletes it too).
ZMQFRAMES = Extension(
    "jobwire._zmqframes",
    sources=["src/jobwire/_zmqframes.c"],
    extra_compile_args=["-O2", "-std=c11"],
    libraries=["dl"],
)


def extensions() -> list[Extension]:
    if os.environ.get("JOBWIRE_PURE", "") not in ("", "0"):
        return []
    return [*mypyc_extensions(), ZMQFRAMES]


def mypyc_extensions() -> list[Extension]:
    global record
    record = native["build_record"]()  # of the sources mypyc is about to read
    try:
        from mypyc.build import mypycify

        sources = [os.path.relpath(native["source"](name), ROOT) for name in native["MODULES"]]
        # The build environment lacks the third-party packages, so modules that are not
        # compiled may not type-check there: only the compiled ones' errors count. Its own
        # cache keeps `make lint`'s (made with those packages) from hiding such errors.
        # Without them an ignore that `make lint` needs can look unused: not an error here.
        options = [
            "--ignore-missing-imports",
            "--follow-imports=silent",
            "--no-warn-unused-ignores",
        ]
        options += ["--cache-dir", "build/mypyc/mypy-cache"]
        return list(
            mypycify(
                [*options, *sources],
                group_name=native["GROUP"],
                target_dir="build/mypyc",
            )
        )
    except (Exception, SystemExit) as exc:  # mypy missing, or mypyc rejects the code
        warn(f"mypyc could not translate the hot modules ({exc!r})")
        return []


class BuildExt(build_ext):
    """Builds the mypyc extensions, or none of them; records the sources of a good build.
    `jobwire._zmqframes` is built on its own: its failure leaves the others."""

    def build_extension(self, ext: Extension) -> None:
        if ext.name != ZMQFRAMES.name:
            super().build_extension(ext)
            return
        try:
            super().build_extension(ext)
        except Exception as exc:
            print(
                f"jobwire: the ZeroMQ whole-message extension did not build ({exc!r});"
                " the ZeroMQ sockets use pyzmq's per-frame calls",
                file=sys.stderr,
            )
            Path(self.get_ext_fullpath(ext.name)).unlink(missing_ok=True)

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler, no headers, a C error: stay pure
            warn(f"compiling the hot modules failed ({exc!r})")
            for output in self.get_outputs():
                Path(output).unlink(missing_ok=True)
            return
        if self.extensions:
            for target in {Path(self.build_lib) / "jobwire", self._package_dir()}:
                if any(target.glob("*__mypyc*.so")):
                    (target / native["BUILD_RECORD"]).write_text(record)

    def _package_dir(self) -> Path:
        return Path(self.get_finalized_command("build_py").get_package_dir("jobwire"))


building = bool(BUILDS & set(sys.argv))
if building:
    forget_build()
setup(ext_modules=extensions() if building else [], cmdclass={"build_ext": BuildExt})
