"""gearmand's command line for `jobwire serve`: what scripts and units written for gearmand
1.1.20 pass, with gearmand's meaning where jobwire has one (README, "Command line").

- exit codes: a bad argument exits 1 (click's usage errors exit 2 elsewhere);
- `--config-file PATH`: options from a file, whitespace-separated as on a command line
  (`--port 4730` or `--port=4730`, any number per line), the command line winning;
- `-v`: refused with gearmand's message (gearmand 1.x dropped it for `--verbose LEVEL`);
- `-q/--queue-type` mapped onto `--store`; `-u/--user`, `-f/--file-descriptors`,
  `--coredump` and `-d/--daemon` applied as gearmand applies them.
"""

from __future__ import annotations

import faulthandler
import os
import pwd
import re
import resource
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

#: The gearmand release whose command line `jobwire serve` takes.
GEARMAND_VERSION = "1.1.20"

#: gearmand's queue types (its plugins) that jobwire has stores for.
QUEUE_TYPES = ("builtin", "libsqlite3")

_SHORT_V = re.compile(r"-v+")


class GearmandUsageError(click.UsageError):
    """A bad argument: gearmand exits 1 (click's usage errors exit 2)."""

    exit_code = 1


class GearmandCommand(click.Command):
    """A click command that exits 1 on a bad argument, as gearmand does, and reads
    `--config-file` before parsing."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            _refuse_short_verbose(args)
            return super().parse_args(ctx, expand_config_file(args))
        except click.UsageError as exc:
            raise _exit_1(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:  # a BadParameter raised while checking the values
            raise _exit_1(exc) from None


def _exit_1(exc: click.UsageError) -> click.UsageError:
    if isinstance(exc, GearmandUsageError):
        return exc
    return GearmandUsageError(exc.format_message(), exc.ctx)


def _options_part(args: list[str]) -> list[str]:
    return args[: args.index("--")] if "--" in args else args


def _refuse_short_verbose(args: list[str]) -> None:
    for arg in _options_part(args):
        if _SHORT_V.fullmatch(arg):
            raise GearmandUsageError("Option -v has been deprecated, please use --verbose LEVEL")


def expand_config_file(args: list[str]) -> list[str]:
    """`args` with the options of `--config-file PATH` put before them (so that the command
    line wins: a later value replaces an earlier one). A missing value is left for click to
    refuse; a file that cannot be read is an error, as in gearmand."""
    path = None
    options = _options_part(args)
    for i, arg in enumerate(options):
        if arg.startswith("--config-file="):
            path = arg.removeprefix("--config-file=")
        elif arg == "--config-file" and i + 1 < len(options):
            path = options[i + 1]
    if path is None:
        return args
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise click.UsageError(
            f"Could not open configuration file {path}: {exc.strerror}"
        ) from None
    tokens: list[str] = []
    for line in text.splitlines():
        if not line.lstrip().startswith("#"):  # comments: an extension; gearmand has none
            tokens += line.split()
    if "--" in tokens:
        raise click.UsageError(f"{path}: '--' cannot appear in a configuration file")
    return tokens + args


def queue_store(queue_type: str, libsqlite3_db: str | None, store: str, store_given: bool) -> str:
    """The `--store` that gearmand's `--queue-type` (given explicitly) means."""
    kind = queue_type.lower()
    if kind == "builtin":
        mapped = "memory"
    elif kind == "libsqlite3":
        if not libsqlite3_db:
            raise click.BadParameter(
                "libsqlite3 needs --libsqlite3-db PATH", param_hint="--queue-type"
            )
        mapped = f"sqlite:{libsqlite3_db}"
    else:
        raise click.BadParameter(
            f"jobwire has no {queue_type!r} queue; it supports builtin (= --store memory) "
            "and libsqlite3 with --libsqlite3-db PATH (= --store sqlite:PATH)",
            param_hint="--queue-type",
        )
    if store_given and store != mapped:
        raise click.BadParameter(
            f"--queue-type {queue_type} means --store {mapped}, not --store {store}",
            param_hint="--queue-type",
        )
    return mapped


def switch_user(user: str) -> None:
    """Run as `user` from now on (gearmand's -u): switch when root; already that user: a
    no-op; anything else is an error."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise click.ClickException(f"Could not find user {user}") from None
    if os.geteuid() == 0:
        if entry.pw_uid == 0:
            return
        os.initgroups(entry.pw_name, entry.pw_gid)
        os.setgid(entry.pw_gid)
        os.setuid(entry.pw_uid)
    elif entry.pw_uid != os.geteuid():
        raise click.ClickException(f"Must be root to switch users (to {user}).")


def set_file_descriptors(count: int) -> None:
    """gearmand's -f: the soft limit on open files becomes `count` (the hard limit is raised
    to it if need be, which needs root)."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < count:
        hard = count
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (count, hard))
    except (OSError, ValueError) as exc:
        raise click.ClickException(
            f"Failed to set limit for the number of file descriptors to {count} ({exc}). "
            "Try running as root or giving a smaller value to -f."
        ) from None


def enable_coredump() -> None:
    """gearmand's --coredump: a fatal signal leaves a core file (the soft limit on core size
    is raised to the hard one) and Python's tracebacks of every thread on stderr."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))
    faulthandler.enable()


def daemonize() -> Callable[[], None]:
    """gearmand's -d: fork, start a new session, fork again, and let the first process exit
    only once the server is ready: 0 if it is, 1 if it died first. Until then the server
    keeps the caller's stdin/stdout/stderr (start-up errors are seen); once ready it
    detaches from them. Returns the callback the server calls when it listens."""
    read_end, write_end = os.pipe()
    if os.fork():  # the process that was started: wait for the word from the server
        os.close(write_end)
        with os.fdopen(read_end, "rb") as pipe:
            word = pipe.read(1)
        os._exit(0 if word == b"1" else 1)
    os.close(read_end)
    os.setsid()
    if os.fork():
        os._exit(0)

    def ready() -> None:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.close(devnull)
        os.write(write_end, b"1")
        os.close(write_end)

    return ready
