"""Admin text protocol replies, byte for byte as gearmand 1.1.20 sends them.

Lists end with ".\\n"; OK/ERR replies end with "\\r\\n", except getpid, verbose and version,
which end with "\\n". Callers send each reply in one write: gearadmin stops reading when
no more data arrives within 5 ms.
"""

from __future__ import annotations

from collections.abc import Iterable

OK = b"OK\r\n"
#: maxqueue's reply: python-gearman/pygearman split on "\n" and insist on exactly "OK",
#: so gearmand's "OK\r\n" makes their send_maxqueue raise. We follow the real clients.
OK_MAXQUEUE = b"OK\n"
END = b".\n"


def err(code: str, text: str = "") -> bytes:
    """`text` may echo what the peer sent, undecodable bytes included (surrogateescape)."""
    line = f"ERR {code} {text}\r\n" if text else f"ERR {code}\r\n"
    return line.encode("utf-8", "surrogateescape")


def unknown_command(command: str) -> bytes:
    """gearmand names only the first word of the line."""
    return err("UNKNOWN_COMMAND", "Unknown+server+command" + command)


def ok_value(value: str) -> bytes:
    """getpid / verbose / version."""
    return f"OK {value}\n".encode("utf-8", "surrogateescape")


def _listing(lines: Iterable[str]) -> bytes:
    return "".join(lines).encode("utf-8", "surrogateescape") + END


def status(rows: Iterable[tuple[str, int, int, int]]) -> bytes:
    """FUNCTION, TOTAL (queued + running), RUNNING, AVAILABLE_WORKERS."""
    return _listing(
        f"{name}\t{total}\t{running}\t{workers}\n" for name, total, running, workers in rows
    )


def priority_status(rows: Iterable[tuple[str, int, int, int, int]]) -> bytes:
    """FUNCTION, queued HIGH, NORMAL, LOW, WORKERS."""
    return _listing(
        f"{name}\t{high}\t{normal}\t{low}\t{workers}\n" for name, high, normal, low, workers in rows
    )


def workers(rows: Iterable[tuple[int, str, str, Iterable[str]]]) -> bytes:
    """One line per connection: FD IP CLIENT-ID : FUNCTION..."""
    return _listing(
        f"{fd} {ip} {client_id} :{''.join(' ' + fn for fn in functions)}\n"
        for fd, ip, client_id, functions in rows
    )


def show_jobs(rows: Iterable[tuple[str, int, int, int]]) -> bytes:
    """HANDLE, RETRIES, IGNORE, PERSISTED."""
    return _listing(
        f"{handle}\t{retries}\t{ignore}\t{persisted}\n"
        for handle, retries, ignore, persisted in rows
    )


def show_unique_jobs(uniques: Iterable[str]) -> bytes:
    return _listing(f"{unique}\n" for unique in uniques)


def incomplete(command: str) -> bytes:
    """A command given too few arguments (maxqueue, create/drop function)."""
    return err(
        "INVALID_ARGUMENTS", "An+incomplete+set+of+arguments+was+sent+to+this+command+" + command
    )


UNKNOWN_JOB = err("UNKNOWN_JOB")
UNKNOWN_SHOW = err("UNKNOWN_SHOW_ARGUMENTS")
DROP_BUSY = b"ERR there are still connected workers or executing clients\r\n"
DROP_UNKNOWN = b"ERR function not found\r\n"
