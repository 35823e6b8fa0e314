"""Scripted raw-byte Gearman conversations for the differential test (gearmand vs jobwire).

Every expected reply below was recorded from Debian's gearmand 1.1.20+ds (package
gearman-job-server) started with ``--job-handle-prefix H:test``, so job handles are ``H:test:<n>``
with one global counter from 1 on a fresh server. jobwire must give the same bytes, except for the
cases listed in ``KNOWN_DIFFERENCES``, where jobwire deliberately fixes a gearmand defect.

A conversation is a list of steps. Each step sends bytes on a named connection (opened on first
use) and/or reads the replies it expects on that connection, in order. A step only runs after the
previous step's replies arrived, which orders events across connections without any sleeping:
e.g. a worker's GRAB_JOB is sent only after the client has seen JOB_CREATED.

To prove that a server sent *nothing* in reply to a packet, a case sends ECHO_REQ right behind
it: a server answers one connection's packets in order, so if the next reply is ECHO_RES,
nothing came before it. The runner also ends every case by echoing on each open connection, so
a stray extra reply anywhere fails the case.

Text listings (``status``, ``workers``, ``show jobs``...) are compared as multisets of lines:
gearmand prints them in hash-table or thread order, which no other server can (or should) copy.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass

# -- packets ----------------------------------------------------------------------------------

TYPES: dict[str, int] = {
    "CAN_DO": 1,
    "CANT_DO": 2,
    "RESET_ABILITIES": 3,
    "PRE_SLEEP": 4,
    "NOOP": 6,
    "SUBMIT_JOB": 7,
    "JOB_CREATED": 8,
    "GRAB_JOB": 9,
    "NO_JOB": 10,
    "JOB_ASSIGN": 11,
    "WORK_STATUS": 12,
    "WORK_COMPLETE": 13,
    "WORK_FAIL": 14,
    "GET_STATUS": 15,
    "ECHO_REQ": 16,
    "ECHO_RES": 17,
    "SUBMIT_JOB_BG": 18,
    "ERROR": 19,
    "STATUS_RES": 20,
    "SUBMIT_JOB_HIGH": 21,
    "SET_CLIENT_ID": 22,
    "CAN_DO_TIMEOUT": 23,
    "ALL_YOURS": 24,
    "WORK_EXCEPTION": 25,
    "OPTION_REQ": 26,
    "OPTION_RES": 27,
    "WORK_DATA": 28,
    "WORK_WARNING": 29,
    "GRAB_JOB_UNIQ": 30,
    "JOB_ASSIGN_UNIQ": 31,
    "SUBMIT_JOB_HIGH_BG": 32,
    "SUBMIT_JOB_LOW": 33,
    "SUBMIT_JOB_LOW_BG": 34,
    "SUBMIT_JOB_SCHED": 35,
    "SUBMIT_JOB_EPOCH": 36,
    "SUBMIT_REDUCE_JOB": 37,
    "SUBMIT_REDUCE_JOB_BACKGROUND": 38,
    "GRAB_JOB_ALL": 39,
    "JOB_ASSIGN_ALL": 40,
    "GET_STATUS_UNIQUE": 41,
    "STATUS_RES_UNIQUE": 42,
}
NAMES: dict[int, str] = {code: name for name, code in TYPES.items()}

REQ = b"\0REQ"
RES = b"\0RES"


def req(kind: str | int, *args: bytes, magic: bytes = REQ) -> bytes:
    """Encode a request: header + NUL-joined arguments (the last one is not NUL-terminated)."""
    code = TYPES[kind] if isinstance(kind, str) else kind
    body = b"\0".join(args)
    return magic + struct.pack(">II", code, len(body)) + body


def h(n: int) -> bytes:
    """The n-th job handle a fresh server started with ``--job-handle-prefix H:test`` hands out."""
    return b"H:test:%d" % n


# -- expected replies -------------------------------------------------------------------------

Arg = bytes | re.Pattern[bytes]
ANY: re.Pattern[bytes] = re.compile(rb".*", re.DOTALL)


@dataclass(frozen=True)
class Packet:
    """A binary response packet with magic ``\\0RES``.

    ``args`` are the NUL-separated fields; the body is split into exactly ``len(args)`` parts, so
    the last one may contain NULs. Each field is exact bytes or a regex matching it whole.
    """

    name: str
    args: tuple[Arg, ...] = ()


@dataclass(frozen=True)
class Line:
    """One text line including its ``\\n``: exact bytes or a regex matching it whole."""

    text: Arg


def _same(line: bytes) -> bytes:
    return line


@dataclass(frozen=True)
class Listing:
    """A text listing ended by ``.\\n``. Lines are given without ``\\n`` and compared as a
    multiset after ``normalise`` (applied to both sides)."""

    lines: tuple[bytes, ...]
    normalise: Callable[[bytes], bytes] = _same


@dataclass(frozen=True)
class Closed:
    """The server closes the connection (EOF or reset) without sending anything more."""


Reply = Packet | Line | Listing | Closed


def res(name: str, *args: Arg) -> Packet:
    return Packet(name, args)


def error(code: Arg, text: Arg) -> Packet:
    return Packet("ERROR", (code, text))


def listing(*lines: bytes) -> Listing:
    return Listing(lines)


_FD = re.compile(rb"^\d+ ")


def normalise_worker_line(line: bytes) -> bytes:
    """``workers`` line ``FD IP ID : fn...``: the fd becomes ``FD`` and the functions are sorted
    (gearmand lists them in reverse CAN_DO order)."""
    head, sep, functions = _FD.sub(b"FD ", line).partition(b" :")
    return head + sep + b"".join(b" " + fn for fn in sorted(functions.split()))


def workers(*lines: bytes) -> Listing:
    """A ``workers`` reply; write lines with ``FD`` for the descriptor."""
    return Listing(lines, normalise_worker_line)


OK = Line(b"OK\r\n")
ECHO = req("ECHO_REQ", b"sync")
ECHOED = res("ECHO_RES", b"sync")


# -- conversations ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    conn: str
    send: bytes = b""
    expect: tuple[Reply, ...] = ()
    hangup: bool = False
    tag: str = ""  # names the step for KNOWN_DIFFERENCES


def send(conn: str, data: bytes, *expect: Reply, tag: str = "") -> Step:
    return Step(conn, data, expect, tag=tag)


def recv(conn: str, *expect: Reply, tag: str = "") -> Step:
    return Step(conn, b"", expect, tag=tag)


def hangup(conn: str) -> Step:
    return Step(conn, hangup=True)


@dataclass(frozen=True)
class Case:
    name: str
    steps: tuple[Step, ...]
    # End by echoing on every connection still open (catches stray replies). Off where a
    # connection's state after the last step is deliberately left open.
    idle_check: bool = True


@dataclass(frozen=True)
class KnownDifference:
    """A gearmand defect jobwire fixes: why, and jobwire's expected replies per tagged step."""

    reason: str
    jobwire: dict[str, tuple[Reply, ...]]


def case(name: str, *steps: Step, idle_check: bool = True) -> Case:
    return Case(name, steps, idle_check)


# Connection names: c, c2, c3 = clients; w, w2 = workers; admin = text protocol. The runner opens
# `admin` before every case (see test_differential.settle).

NOT_FOUND = b"Job given in work result not found"
NOT_EXPECTED = error(b"INVALID_COMMAND", b"Command not expected")
# Each work packet's own text for a handle the sending connection does not hold.
NOT_HELD_ERRORS: tuple[tuple[str, tuple[bytes, ...], bytes], ...] = (
    ("WORK_STATUS", (b"1", b"2"), NOT_FOUND),
    ("WORK_DATA", (b"d",), b"Job does not exist on server"),
    ("WORK_WARNING", (b"d",), b"Job does not exist on server"),
    ("WORK_COMPLETE", (b"d",), NOT_FOUND),
    ("WORK_FAIL", (), NOT_FOUND),
    ("WORK_EXCEPTION", (b"d",), b"An exception was received for a job that does not exist"),
)
U63 = b"u" * 63
U64 = b"u" * 64
U65 = b"u" * 65
FAR_FUTURE = b"4102444800"  # 2100-01-01T00:00:00Z

CASES: list[Case] = [
    # -- basics ------------------------------------------------------------------------------
    case(
        "echo",
        send("c", req("ECHO_REQ", b"hello\0world"), res("ECHO_RES", b"hello\0world")),
        send("c", req("ECHO_REQ"), res("ECHO_RES", b"")),
    ),
    case(
        "submit_job_bg",
        send("c", req("SUBMIT_JOB_BG", b"f", b"", b"data"), res("JOB_CREATED", h(1))),
        send("c", req("GET_STATUS", h(1)), res("STATUS_RES", h(1), b"1", b"0", b"0", b"0")),
        send("admin", b"status\n", listing(b"f\t1\t0\t0")),
        send("admin", b"show jobs\n", listing(h(1) + b"\t0\t0\t1")),
    ),
    case(
        "submit_every_priority",
        send("c", req("SUBMIT_JOB", b"f", b"", b"n"), res("JOB_CREATED", h(1))),
        send("c", req("SUBMIT_JOB_HIGH", b"f", b"", b"h"), res("JOB_CREATED", h(2))),
        send("c", req("SUBMIT_JOB_LOW", b"f", b"", b"l"), res("JOB_CREATED", h(3))),
        send("c", req("SUBMIT_JOB_BG", b"f", b"", b"n"), res("JOB_CREATED", h(4))),
        send("c", req("SUBMIT_JOB_HIGH_BG", b"f", b"", b"h"), res("JOB_CREATED", h(5))),
        send("c", req("SUBMIT_JOB_LOW_BG", b"f", b"", b"l"), res("JOB_CREATED", h(6))),
        send("admin", b"prioritystatus\n", listing(b"f\t2\t2\t2\t0")),
        send("admin", b"status\n", listing(b"f\t6\t0\t0")),
    ),
    # -- coalescing --------------------------------------------------------------------------
    case(
        "coalesce_same_unique_fg_fg_bg",
        send("c", req("SUBMIT_JOB", b"f", b"u1", b"d1"), res("JOB_CREATED", h(1))),
        send("c2", req("SUBMIT_JOB", b"f", b"u1", b"d2"), res("JOB_CREATED", h(1))),
        send("c3", req("SUBMIT_JOB_BG", b"f", b"u1", b"d3"), res("JOB_CREATED", h(1))),
        send(
            "c3",
            req("GET_STATUS_UNIQUE", b"u1"),
            res("STATUS_RES_UNIQUE", b"u1", b"1", b"0", b"0", b"0", b"2"),
        ),
        send("admin", b"status\n", listing(b"f\t1\t0\t0")),
        send("admin", b"show unique jobs\n", listing(b"u1")),
        send(
            "w",
            req("CAN_DO", b"f") + req("GRAB_JOB_UNIQ"),
            res("JOB_ASSIGN_UNIQ", h(1), b"f", b"u1", b"d1"),
        ),
        send("w", req("WORK_DATA", h(1), b"part")),
        recv("c", res("WORK_DATA", h(1), b"part")),
        recv("c2", res("WORK_DATA", h(1), b"part")),
        send("w", req("WORK_COMPLETE", h(1), b"done")),
        recv("c", res("WORK_COMPLETE", h(1), b"done")),
        recv("c2", res("WORK_COMPLETE", h(1), b"done")),
        send("w", req("GRAB_JOB"), res("NO_JOB")),
    ),
    case(
        "coalesce_dash_unique_on_data",
        send("c", req("SUBMIT_JOB_BG", b"f", b"-", b"same"), res("JOB_CREATED", h(1))),
        send("c", req("SUBMIT_JOB_BG", b"f", b"-", b"same"), res("JOB_CREATED", h(1))),
        send("c", req("SUBMIT_JOB_BG", b"f", b"-", b"other"), res("JOB_CREATED", h(2))),
        send("admin", b"show unique jobs\n", listing(b"-", b"-")),
        send("admin", b"status\n", listing(b"f\t2\t0\t0")),
        send(
            "w",
            req("CAN_DO", b"f") + req("GRAB_JOB_UNIQ") + req("GRAB_JOB_UNIQ") + req("GRAB_JOB"),
            res("JOB_ASSIGN_UNIQ", h(1), b"f", b"-", b"same"),
            res("JOB_ASSIGN_UNIQ", h(2), b"f", b"-", b"other"),
            res("NO_JOB"),
        ),
    ),
    case(
        "empty_unique_never_coalesces",
        send("c", req("SUBMIT_JOB_BG", b"f", b"", b"x"), res("JOB_CREATED", h(1))),
        send("c", req("SUBMIT_JOB_BG", b"f", b"", b"x"), res("JOB_CREATED", h(2))),
        send("c2", req("SUBMIT_JOB", b"f", b"", b"x"), res("JOB_CREATED", h(3))),
        send("admin", b"show unique jobs\n", listing(b"", b"", b"")),
        send("admin", b"status\n", listing(b"f\t3\t0\t0")),
    ),
    case(
        "same_unique_other_function",
        send("c", req("SUBMIT_JOB_BG", b"f", b"u1", b"x"), res("JOB_CREATED", h(1))),
        send("c", req("SUBMIT_JOB_BG", b"g", b"u1", b"x"), res("JOB_CREATED", h(2))),
        send("admin", b"show unique jobs\n", listing(b"u1", b"u1")),
        send("admin", b"status\n", listing(b"f\t1\t0\t0", b"g\t1\t0\t0")),
    ),
    # -- grabbing ----------------------------------------------------------------------------
    case(
        "grab_job_variants",
        send("c", req("SUBMIT_JOB_BG", b"f", b"u1", b"d1"), res("JOB_CREATED", h(1))),
        send("c", req("SUBMIT_JOB_BG", b"f", b"u2", b"d2"), res("JOB_CREATED", h(2))),
        send("c", req("SUBMIT_JOB_BG", b"f", b"u3", b"d3"), res("JOB_CREATED", h(3))),
        send("w", req("CAN_DO", b"f") + req("GRAB_JOB"), res("JOB_ASSIGN", h(1), b"f", b"d1")),
        send("w", req("GRAB_JOB_UNIQ"), res("JOB_ASSIGN_UNIQ", h(2), b"f", b"u2", b"d2")),
        # GRAB_JOB_ALL on a job without reducer answers JOB_ASSIGN_UNIQ, not JOB_ASSIGN_ALL.
        send("w", req("GRAB_JOB_ALL"), res("JOB_ASSIGN_UNIQ", h(3), b"f", b"u3", b"d3")),
        send("w", req("GRAB_JOB_ALL"), res("NO_JOB")),
        send("admin", b"status\n", listing(b"f\t3\t3\t1")),
    ),
    case(
        "grab_job_all_reduce_jobs",
        # libgearman layout: FUNC\0UNIQ\0REDUCER\0AGGREGATOR(empty)\0DATA
        send(
            "c",
            req("SUBMIT_REDUCE_JOB_BACKGROUND", b"f", b"u1", b"red", b"", b"DATA"),
            res("JOB_CREATED", h(1)),
        ),
        send(
            "c2",
            req("SUBMIT_REDUCE_JOB", b"f", b"u2", b"red", b"", b"DATA2"),
            res("JOB_CREATED", h(2)),
        ),
        send(
            "w",
            req("CAN_DO", b"f") + req("GRAB_JOB_ALL") + req("GRAB_JOB_ALL"),
            res("JOB_ASSIGN_ALL", h(1), b"f", b"u1", b"red", b"DATA"),
            res("JOB_ASSIGN_ALL", h(2), b"f", b"u2", b"red", b"DATA2"),
        ),
        send("w", req("WORK_COMPLETE", h(2), b"r")),
        recv("c2", res("WORK_COMPLETE", h(2), b"r")),
    ),
    case(
        "grab_reduce_job_without_grab_all",
        send(
            "c",
            req("SUBMIT_REDUCE_JOB_BACKGROUND", b"f", b"u1", b"red", b"", b"D1"),
            res("JOB_CREATED", h(1)),
        ),
        send(
            "w",
            req("CAN_DO", b"f") + req("GRAB_JOB_UNIQ"),
            res("JOB_ASSIGN_UNIQ", h(1), b"f", b"u1", b"D1"),
        ),
        send(
            "c",
            req("SUBMIT_REDUCE_JOB_BACKGROUND", b"f", b"u2", b"red", b"", b"D2"),
            res("JOB_CREATED", h(2)),
        ),
        send("w", req("GRAB_JOB"), res("JOB_ASSIGN", h(2), b"f", b"D2")),
    ),
    case(
        "no_job",
        send("w", req("GRAB_JOB"), res("NO_JOB")),
        send("c", req("SUBMIT_JOB_BG", b"f", b"", b"x"), res("JOB_CREATED", h(1))),
        send("w", req("CAN_DO", b"g") + req("GRAB_JOB"), res("NO_JOB")),
        send("w", req("GRAB_JOB_UNIQ"), res("NO_JOB")),
        send("w", req("GRAB_JOB_ALL"), res("NO_JOB")),
    ),
    case(
        "cant_do_and_reset_abilities",
        send("c", req("SUBMIT_JOB_BG", b"f", b"", b"x"), res("JOB_CREATED", h(1))),
        send("w", req("CAN_DO", b"f") + req("CAN_DO", b"g") + ECHO, ECHOED),
        send("admin", b"status\n", listing(b"f\t1\t0\t1", b"g\t0\t0\t1")),
        send("w", req("CANT_DO", b"f") + req("GRAB_JOB"), res("NO_JOB")),
        send("admin", b"status\n", listing(b"f\t1\t0\t0", b"g\t0\t0\t1")),
        send(
            "admin",
            b"workers\n",
            workers(b"FD 127.0.0.1 - :", b"FD 127.0.0.1 - :", b"FD 127.0.0.1 - : g"),
        ),
        send("w", req("CAN_DO", b"f") + req("RESET_ABILITIES") + req("GRAB_JOB"), res("NO_JOB")),
        send("admin", b"status\n", listing(b"f\t1\t0\t0", b"g\t0\t0\t0")),
        send(
            "admin",
            b"workers\n",
            workers(b"FD 127.0.0.1 - :", b"FD 127.0.0.1 - :", b"FD 127.0.0.1 - :"),
        ),
    ),
    # -- sleeping and waking -----------------------------------------------------------------
    case(
        "pre_sleep_noop_when_work_waiting",
        send("c", req("SUBMIT_JOB_BG", b"f", b"", b"x"), res("JOB_CREATED", h(1))),
        send("w", req("CAN_DO", b"f") + req("PRE_SLEEP"), res("NOOP")),
        send("w", req("GRAB_JOB_UNIQ"), res("JOB_ASSIGN_UNIQ", h(1), b"f", b"", b"x")),
    ),
    case(
        "pre_sleep_woken_by_submit",
        send("w", req("CAN_DO", b"f") + req("PRE_SLEEP") + ECHO, ECHOED),
        send("c", req("SUBMIT_JOB_BG", b"f", b"", b"x"), res("JOB_CREATED", h(1))),
        recv("w", res("NOOP")),
        send("w", req("GRAB_JOB"), res("JOB_ASSIGN", h(1), b"f", b"x")),
        # Nothing left to run: PRE_SLEEP gets no immediate NOOP.
        send("w", req("PRE_SLEEP") + ECHO, ECHOED),
    ),
    # -- priorities --------------------------------------------------------------------------
    case(
        "priority_order_one_function",
        send("c", req("SUBMIT_JOB_LOW_BG", b"f", b"", b"l1"), res("JOB_CREATED", h(1))),
        send("c", req("SUBMIT_JOB_BG", b"f", b"", b"n1"), res("JOB_CREATED", h(2))),
        send("c", req("SUBMIT_JOB_HIGH_BG", b"f", b"", b"h1"), res("JOB_CREATED", h(3))),
        send("c", req("SUBMIT_JOB_LOW", b"f", b"", b"l2"), res("JOB_CREATED", h(4))),
        send("c", req("SUBMIT_JOB_HIGH", b"f", b"", b"h2"), res("JOB_CREATED", h(5))),
        send("c", req("SUBMIT_JOB", b"f", b"", b"n2"), res("JOB_CREATED", h(6))),
        send("admin", b"prioritystatus\n", listing(b"f\t2\t2\t2\t0")),
        send(
            "w",
            req("CAN_DO", b"f") + req("GRAB_JOB") * 7,
            res("JOB_ASSIGN", h(3), b"f", b"h1"),
            res("JOB_ASSIGN", h(5), b"f", b"h2"),
            res("JOB_ASSIGN", h(2), b"f", b"n1"),
            res("JOB_ASSIGN", h(6), b"f", b"n2"),
            res("JOB_ASSIGN", h(1), b"f", b"l1"),
            res("JOB_ASSIGN", h(4), b"f", b"l2"),
            res("NO_JOB"),
        ),
        send("admin", b"prioritystatus\n", listing(b"f\t0\t0\t0\t1")),
    ),
    case(
        "priority_order_across_functions",
        send("c", req("SUBMIT_JOB_LOW_BG", b"a", b"", b"l"), res("JOB_CREATED", h(1))),
        send("c", req("SUBMIT_JOB_HIGH_BG", b"b", b"", b"h"), res("JOB_CREATED", h(2))),
        send("c", req("SUBMIT_JOB_BG", b"a", b"", b"n"), res("JOB_CREATED", h(3))),
        send(
            "w",
            req("CAN_DO", b"b") + req("CAN_DO", b"a") + req("GRAB_JOB") * 4,
            # gearmand 1.1.20: per function, last CAN_DO first; HIGH of `b` comes last.
            res("JOB_ASSIGN", h(3), b"a", b"n"),
            res("JOB_ASSIGN", h(1), b"a", b"l"),
            res("JOB_ASSIGN", h(2), b"b", b"h"),
            res("NO_JOB"),
            tag="grabs",
        ),
    ),
    # -- work results ------------------------------------------------------------------------
    case(
        "foreground_work_updates_forwarded",
        send("w", req("CAN_DO", b"f") + ECHO, ECHOED),
        send("c", req("SUBMIT_JOB", b"f", b"u", b"in"), res("JOB_CREATED", h(1))),
        send("w", req("GRAB_JOB"), res("JOB_ASSIGN", h(1), b"f", b"in")),
        send("admin", b"status\n", listing(b"f\t1\t1\t1")),
        send("admin", b"show jobs\n", listing(h(1) + b"\t0\t0\t0")),
        send("w", req("WORK_STATUS", h(1), b"1", b"4")),
        recv("c", res("WORK_STATUS", h(1), b"1", b"4")),
        send("w", req("WORK_DATA", h(1), b"da\0ta")),
        recv("c", res("WORK_DATA", h(1), b"da\0ta")),
        send("w", req("WORK_WARNING", h(1), b"careful")),
        recv("c", res("WORK_WARNING", h(1), b"careful")),
        send("c", req("GET_STATUS", h(1)), res("STATUS_RES", h(1), b"1", b"1", b"1", b"4")),
        send("w", req("WORK_COMPLETE", h(1), b"re\0sult")),
        recv("c", res("WORK_COMPLETE", h(1), b"re\0sult")),
        send("c", req("GET_STATUS", h(1)), res("STATUS_RES", h(1), b"0", b"0", b"0", b"0")),
        send("w", req("WORK_COMPLETE", h(1), b"again"), error(b"JOB_NOT_FOUND", NOT_FOUND)),
        send("admin", b"status\n", listing(b"f\t0\t0\t1")),
        send("admin", b"show jobs\n", listing()),
    ),
    case(
        "background_work_updates_not_forwarded",
        send("c", req("SUBMIT_JOB_BG", b"f", b"", b"in"), res("JOB_CREATED", h(1))),
        send("w", req("CAN_DO", b"f") + req("GRAB_JOB"), res("JOB_ASSIGN", h(1), b"f", b"in")),
        send("w", req("WORK_STATUS", h(1), b"2", b"3") + ECHO, ECHOED),
        send("c2", req("GET_STATUS", h(1)), res("STATUS_RES", h(1), b"1", b"1", b"2", b"3")),
        send("w", req("WORK_DATA", h(1), b"x") + req("WORK_COMPLETE", h(1), b"r") + ECHO, ECHOED),
        send("c2", req("GET_STATUS", h(1)), res("STATUS_RES", h(1), b"0", b"0", b"0", b"0")),
    ),
    case(
        "work_fail",
        send("c", req("SUBMIT_JOB", b"f", b"", b"x"), res("JOB_CREATED", h(1))),
        send("w", req("CAN_DO", b"f") + req("GRAB_JOB"), res("JOB_ASSIGN", h(1), b"f", b"x")),
        send("w", req("WORK_FAIL", h(1))),
        recv("c", res("WORK_FAIL", h(1))),
        send("w", req("GRAB_JOB"), res("NO_JOB")),
        send("admin", b"status\n", listing(b"f\t0\t0\t1")),
    ),
    case(
        "work_exception_without_option",
        send("c", req("SUBMIT_JOB", b"f", b"", b"x"), res("JOB_CREATED", h(1))),
        send("w", req("CAN_DO", b"f") + req("GRAB_JOB"), res("JOB_ASSIGN", h(1), b"f", b"x")),
        send("w", req("WORK_EXCEPTION", h(1), b"boom")),
        # Converted to WORK_FAIL, and gearmand keeps a trailing NUL after the handle.
        recv("c", res("WORK_FAIL", h(1), b""), tag="converted"),
        send("w", req("GRAB_JOB"), res("NO_JOB")),
    ),
    case(
        "work_exception_with_option",
        send("c", req("OPTION_REQ", b"exceptions"), res("OPTION_RES", b"exceptions")),
        send("c", req("SUBMIT_JOB", b"f", b"", b"x"), res("JOB_CREATED", h(1))),
        send("w", req("CAN_DO", b"f") + req("GRAB_JOB"), res("JOB_ASSIGN", h(1), b"f", b"x")),
        send("w", req("WORK_EXCEPTION", h(1), b"boom")),
        recv("c", res("WORK_EXCEPTION", h(1), b"boom")),
        # The job is finished, not retried.
        send("w", req("GRAB_JOB"), res("NO_JOB")),
        send("admin", b"status\n", listing(b"f\t0\t0\t1")),
    ),
    case(
        "work_exception_coalesced_clients",
        send("c", req("OPTION_REQ", b"exceptions"), res("OPTION_RES", b"exceptions")),
        send("c", req("SUBMIT_JOB", b"f", b"u", b"x"), res("JOB_CREATED", h(1))),
        send("c2", req("SUBMIT_JOB", b"f", b"u", b"x"), res("JOB_CREATED", h(1))),
        send("w", req("CAN_DO", b"f") + req("GRAB_JOB"), res("JOB_ASSIGN", h(1), b"f", b"x")),
        send("w", req("WORK_EXCEPTION", h(1), b"boom")),
        recv("c", res("WORK_EXCEPTION", h(1), b"boom")),
        recv("c2", res("WORK_FAIL", h(1), b""), tag="converted"),
    ),
    case(
        "work_exception_background_job",
        send("c", req("SUBMIT_JOB_BG", b"f", b"", b"x"), res("JOB_CREATED", h(1))),
        send("w", req("CAN_DO", b"f") + req("GRAB_JOB"), res("JOB_ASSIGN", h(1), b"f", b"x")),
        send("w", req("WORK_EXCEPTION", h(1), b"boom") + ECHO, ECHOED),
        send("w", req("GRAB_JOB"), res("NO_JOB")),
    ),
    case(
        "option_req_unknown",
        send(
            "c",
            req("OPTION_REQ", b"bogus"),
            error(b"UNKNOWN_OPTION", b"Server does not recognize given option"),
        ),
        send("c", req("OPTION_REQ", b"exceptions"), res("OPTION_RES", b"exceptions")),
    ),
    case(
        "get_status_unknown",
        send("c", req("GET_STATUS", h(77)), res("STATUS_RES", h(77), b"0", b"0", b"0", b"0")),
        send(
            "c",
            req("GET_STATUS_UNIQUE", b"nope"),
            res("STATUS_RES_UNIQUE", b"nope", b"0", b"0", b"0", b"0", b"0"),
        ),
    ),
    case(
        "get_status_unique",
        send("c", req("SUBMIT_JOB", b"f", b"u", b"x"), res("JOB_CREATED", h(1))),
        send("c2", req("SUBMIT_JOB_BG", b"f", b"v", b"x"), res("JOB_CREATED", h(2))),
        send(
            "c2",
            req("GET_STATUS_UNIQUE", b"v"),
            res("STATUS_RES_UNIQUE", b"v", b"1", b"0", b"0", b"0", b"0"),
        ),
        send(
            "c2",
            req("GET_STATUS_UNIQUE", b"u"),
            res("STATUS_RES_UNIQUE", b"u", b"1", b"0", b"0", b"0", b"1"),
        ),
        send("w", req("CAN_DO", b"f") + req("GRAB_JOB"), res("JOB_ASSIGN", h(1), b"f", b"x")),
        send("w", req("WORK_STATUS", h(1), b"3", b"4")),
        recv("c", res("WORK_STATUS", h(1), b"3", b"4")),
        send(
            "c2",
            req("GET_STATUS_UNIQUE", b"u"),
            res("STATUS_RES_UNIQUE", b"u", b"1", b"1", b"3", b"4", b"1"),
        ),
    ),
    case(
        "work_result_for_handle_not_held",
        send("c", req("SUBMIT_JOB_BG", b"f", b"", b"1"), res("JOB_CREATED", h(1))),
        send("c", req("SUBMIT_JOB_BG", b"f", b"", b"2"), res("JOB_CREATED", h(2))),
        send("w", req("CAN_DO", b"f") + req("GRAB_JOB"), res("JOB_ASSIGN", h(1), b"f", b"1")),
        # w2 holds nothing: h(1) is held by w, h(2) is queued, h(9) does not exist.
        *(
            send("w2", req(kind, handle, *args), error(b"JOB_NOT_FOUND", text))
            for handle in (h(1), h(2), h(9))
            for kind, args, text in NOT_HELD_ERRORS
        ),
        send("admin", b"status\n", listing(b"f\t2\t1\t1")),
    ),
    # -- worker lifecycle --------------------------------------------------------------------
    case(
        "set_client_id_in_workers",
        send(
            "w",
            req("SET_CLIENT_ID", b"wk1") + req("CAN_DO", b"fnA") + req("CAN_DO", b"fnB") + ECHO,
            ECHOED,
        ),
        send("c", req("SUBMIT_JOB_BG", b"fnA", b"", b"x"), res("JOB_CREATED", h(1))),
        send(
            "admin",
            b"workers\n",
            workers(
                b"FD 127.0.0.1 - :",  # admin
                b"FD 127.0.0.1 - :",  # c
                b"FD 127.0.0.1 wk1 : fnA fnB",
            ),
        ),
        send("admin", b"status\n", listing(b"fnA\t1\t0\t1", b"fnB\t0\t0\t1")),
    ),
    case(
        "set_client_id_truncated_to_127_bytes",
        send("w", req("SET_CLIENT_ID", b"x" * 200) + ECHO, ECHOED),
        send(
            "admin",
            b"workers\n",
            workers(b"FD 127.0.0.1 - :", b"FD 127.0.0.1 " + b"x" * 127 + b" :"),
        ),
    ),
    case(
        "can_do_timeout_requeues",
        send("c", req("SUBMIT_JOB", b"f", b"u", b"x"), res("JOB_CREATED", h(1))),
        send(
            "w",
            req("CAN_DO_TIMEOUT", b"f", b"1000") + req("GRAB_JOB"),
            res("JOB_ASSIGN", h(1), b"f", b"x"),
        ),
        # w2 sleeps, and is woken once the timed-out job is requeued (after ~1 s). If the requeue
        # happens before PRE_SLEEP is read, the NOOP comes at once: the same single reply.
        send("w2", req("CAN_DO", b"f") + req("PRE_SLEEP"), res("NOOP")),
        # gearmand 1.1.20 requeues from an I/O thread and queues the NOOP *before* it links the
        # job back into the queue (fixed in 2.0), so a GRAB sent on the NOOP alone can race it
        # and get NO_JOB. The round trips below put the grab well after the requeue.
        send("admin", b"show jobs\n", listing(h(1) + b"\t1\t0\t0")),
        send("admin", b"status\n", listing(b"f\t1\t0\t2")),
        send("w", req("WORK_COMPLETE", h(1), b"late"), error(b"JOB_NOT_FOUND", NOT_FOUND)),
        send("w2", req("GRAB_JOB"), res("JOB_ASSIGN", h(1), b"f", b"x")),
        # The client was told nothing about the timeout; the next thing it sees is w2's result.
        send("w2", req("WORK_COMPLETE", h(1), b"ok")),
        recv("c", res("WORK_COMPLETE", h(1), b"ok")),
    ),
    case(
        "worker_disconnect_requeues",
        send("c", req("SUBMIT_JOB", b"f", b"u", b"x"), res("JOB_CREATED", h(1))),
        send("w", req("CAN_DO", b"f") + req("GRAB_JOB"), res("JOB_ASSIGN", h(1), b"f", b"x")),
        send("w2", req("CAN_DO", b"f") + req("PRE_SLEEP") + ECHO, ECHOED),
        hangup("w"),
        recv("w2", res("NOOP")),
        send("w2", req("GRAB_JOB_UNIQ"), res("JOB_ASSIGN_UNIQ", h(1), b"f", b"u", b"x")),
        send("admin", b"show jobs\n", listing(h(1) + b"\t1\t0\t0")),
        send("w2", req("WORK_COMPLETE", h(1), b"ok")),
        recv("c", res("WORK_COMPLETE", h(1), b"ok")),
    ),
    # -- scheduled jobs ----------------------------------------------------------------------
    case(
        "submit_job_epoch_future",
        send(
            "c",
            req("SUBMIT_JOB_EPOCH", b"f", b"u", FAR_FUTURE, b"later"),
            res("JOB_CREATED", h(1)),
        ),
        send("w", req("CAN_DO", b"f") + req("GRAB_JOB"), res("NO_JOB")),
        send("w", req("GRAB_JOB_ALL"), res("NO_JOB")),
        send("w", req("PRE_SLEEP") + ECHO, ECHOED),
        send("c", req("GET_STATUS", h(1)), res("STATUS_RES", h(1), b"1", b"0", b"0", b"0")),
        send("admin", b"status\n", listing(b"f\t1\t0\t1")),
    ),
    case(
        "submit_job_epoch_past",
        send("c", req("SUBMIT_JOB_EPOCH", b"f", b"u", b"1", b"now"), res("JOB_CREATED", h(1))),
        send("w", req("CAN_DO", b"f") + req("GRAB_JOB"), res("JOB_ASSIGN", h(1), b"f", b"now")),
    ),
    case(
        "submit_job_sched",
        send(
            "c",
            # minute, hour, day of month, month, day of week
            req("SUBMIT_JOB_SCHED", b"f", b"u", b"30", b"12", b"1", b"1", b"1", b"data"),
            NOT_EXPECTED,
            tag="sched",
        ),
        send("w", req("CAN_DO", b"f") + req("GRAB_JOB"), res("NO_JOB")),
    ),
    # -- admin text protocol -----------------------------------------------------------------
    case(
        "admin_status_and_prioritystatus",
        send("c", req("SUBMIT_JOB_HIGH_BG", b"f", b"", b"h"), res("JOB_CREATED", h(1))),
        send("c", req("SUBMIT_JOB_BG", b"f", b"", b"n"), res("JOB_CREATED", h(2))),
        send("c", req("SUBMIT_JOB_LOW", b"f", b"", b"l"), res("JOB_CREATED", h(3))),
        send("c", req("SUBMIT_JOB_BG", b"g", b"", b"n"), res("JOB_CREATED", h(4))),
        send("w", req("CAN_DO", b"f") + req("GRAB_JOB"), res("JOB_ASSIGN", h(1), b"f", b"h")),
        send("w2", req("CAN_DO", b"f") + req("CAN_DO", b"e") + ECHO, ECHOED),
        send("admin", b"status\n", listing(b"e\t0\t0\t1", b"f\t3\t1\t2", b"g\t1\t0\t0")),
        send(
            "admin",
            b"prioritystatus\n",
            listing(b"e\t0\t0\t0\t1", b"f\t0\t1\t1\t2", b"g\t0\t1\t0\t0"),
        ),
        # Functions outlive their jobs and workers.
        send("w", req("WORK_COMPLETE", h(1), b"") + req("RESET_ABILITIES") + ECHO, ECHOED),
        send("w2", req("RESET_ABILITIES") + ECHO, ECHOED),
        send("admin", b"status\n", listing(b"e\t0\t0\t0", b"f\t2\t0\t0", b"g\t1\t0\t0")),
    ),
    case(
        "admin_workers",
        send("c", req("SUBMIT_JOB_BG", b"f", b"", b"x"), res("JOB_CREATED", h(1))),
        send("w", req("CAN_DO", b"f") + req("CAN_DO", b"g") + ECHO, ECHOED),
        send("w2", req("SET_CLIENT_ID", b"second") + req("CAN_DO", b"g") + ECHO, ECHOED),
        send(
            "admin",
            b"workers\n",
            workers(
                b"FD 127.0.0.1 - :",
                b"FD 127.0.0.1 - :",
                b"FD 127.0.0.1 - : f g",
                b"FD 127.0.0.1 second : g",
            ),
        ),
    ),
    case(
        "admin_show_jobs",
        send("c", req("SUBMIT_JOB_BG", b"f", b"u1", b"x"), res("JOB_CREATED", h(1))),
        send("c", req("SUBMIT_JOB_BG", b"f", b"u2", b"x"), res("JOB_CREATED", h(2))),
        send("c", req("SUBMIT_JOB", b"f", b"u3", b"x"), res("JOB_CREATED", h(3))),
        send("w", req("CAN_DO", b"f") + req("GRAB_JOB"), res("JOB_ASSIGN", h(1), b"f", b"x")),
        # HANDLE, retries, ignored (cancelled), queued in the persistent queue (bg jobs only).
        send(
            "admin",
            b"show jobs\n",
            listing(h(1) + b"\t0\t0\t1", h(2) + b"\t0\t0\t1", h(3) + b"\t0\t0\t0"),
        ),
        send("admin", b"show unique jobs\n", listing(b"u1", b"u2", b"u3")),
    ),
    case(
        "admin_cancel_job",
        send("admin", b"cancel job H:test:1\n", Line(b"ERR UNKNOWN_JOB\r\n")),
        send("c", req("SUBMIT_JOB", b"f", b"", b"fg"), res("JOB_CREATED", h(1))),
        send("c2", req("SUBMIT_JOB_BG", b"f", b"", b"bg"), res("JOB_CREATED", h(2))),
        send("admin", b"cancel job H:test:1\n", OK),
        recv("c", res("WORK_FAIL", h(1))),
        send("admin", b"cancel job H:test:2\n", OK),
        # Cancelled jobs are never handed out.
        send("w", req("CAN_DO", b"f") + req("GRAB_JOB"), res("NO_JOB")),
        send("admin", b"status\n", listing(b"f\t0\t0\t1")),
        send("admin", b"show jobs\n", listing()),
        send("admin", b"cancel job H:test:2\n", Line(b"ERR UNKNOWN_JOB\r\n")),
    ),
    case(
        "admin_create_function",
        send("admin", b"create function foo\n", OK),
        # gearmand creates "fo": it takes the argument's size minus 2 (one too many with `\n`).
        send("admin", b"status\n", listing(b"fo\t0\t0\t0"), tag="status"),
    ),
    case(
        "admin_create_function_crlf",
        # With `\r\n` gearmand's off-by-one lands on the `\r`, so the name comes out right.
        send("admin", b"create function foo\r\n", OK),
        send("admin", b"status\n", listing(b"foo\t0\t0\t0")),
        send("admin", b"prioritystatus\n", listing(b"foo\t0\t0\t0\t0")),
    ),
    case(
        "admin_drop_function",
        send("admin", b"drop function nope\n", Line(b"ERR function not found\r\n")),
        send("c", req("SUBMIT_JOB", b"f", b"", b"x"), res("JOB_CREATED", h(1))),
        send("w", req("CAN_DO", b"f") + req("GRAB_JOB"), res("JOB_ASSIGN", h(1), b"f", b"x")),
        send(
            "admin",
            b"drop function f\n",
            Line(b"ERR there are still connected workers or executing clients\r\n"),
        ),
        send("w", req("WORK_COMPLETE", h(1), b"r")),
        recv("c", res("WORK_COMPLETE", h(1), b"r")),
        send("w", req("CANT_DO", b"f") + ECHO, ECHOED),
        send("admin", b"status\n", listing(b"f\t0\t0\t0")),
        send("admin", b"drop function f\n", OK),
        send("admin", b"status\n", listing()),
        send("admin", b"drop function f\n", Line(b"ERR function not found\r\n")),
    ),
    case(
        "admin_maxqueue_arguments",
        send(
            "admin",
            b"maxqueue\n",
            Line(
                b"ERR INVALID_ARGUMENTS An+incomplete+set+of+arguments+was+sent+to+this+"
                b"command+maxqueue\r\n"
            ),
        ),
        # Unknown function: OK, and nothing is created.
        send("admin", b"maxqueue nofunc 3\n", OK, tag="maxqueue"),
        send("admin", b"status\n", listing()),
    ),
    case(
        "admin_maxqueue_limit",
        send("c", req("SUBMIT_JOB_BG", b"f", b"u1", b"1"), res("JOB_CREATED", h(1))),
        send("admin", b"maxqueue f 1\n", OK, tag="maxqueue"),
        send(
            "c",
            req("SUBMIT_JOB_BG", b"f", b"u2", b"2"),
            error(b"QUEUE_ERROR", b"Job queue is full"),
        ),
        send("c", req("SUBMIT_JOB", b"f", b"", b"3"), error(b"QUEUE_ERROR", b"Job queue is full")),
        # A submit that coalesces onto a queued job adds nothing, so it is accepted.
        send("c", req("SUBMIT_JOB_BG", b"f", b"u1", b"1"), res("JOB_CREATED", h(1))),
        send("admin", b"maxqueue f 0\n", OK, tag="maxqueue"),  # 0 = unlimited
        send("c", req("SUBMIT_JOB_BG", b"f", b"u2", b"2"), res("JOB_CREATED", h(2))),
        send("admin", b"status\n", listing(b"f\t2\t0\t0")),
    ),
    case(
        "admin_maxqueue_per_priority",
        send("c", req("SUBMIT_JOB_HIGH_BG", b"f", b"", b"1"), res("JOB_CREATED", h(1))),
        # maxqueue FUNC HIGH NORMAL LOW; each limit is checked against all of f's jobs.
        send("admin", b"maxqueue f 3 2 1\n", OK, tag="maxqueue"),
        send(
            "c",
            req("SUBMIT_JOB_LOW_BG", b"f", b"", b"2"),
            error(b"QUEUE_ERROR", b"Job queue is full"),
        ),
        send("c", req("SUBMIT_JOB_BG", b"f", b"", b"3"), res("JOB_CREATED", h(2))),
        send(
            "c",
            req("SUBMIT_JOB_BG", b"f", b"", b"4"),
            error(b"QUEUE_ERROR", b"Job queue is full"),
        ),
        send("c", req("SUBMIT_JOB_HIGH_BG", b"f", b"", b"5"), res("JOB_CREATED", h(3))),
        send(
            "c",
            req("SUBMIT_JOB_HIGH_BG", b"f", b"", b"6"),
            error(b"QUEUE_ERROR", b"Job queue is full"),
        ),
        send("admin", b"prioritystatus\n", listing(b"f\t2\t1\t0\t0")),
    ),
    case(
        "admin_getpid_verbose_version",
        send("admin", b"getpid\n", Line(re.compile(rb"OK [0-9]+\n"))),
        send(
            "admin",
            b"verbose\n",
            Line(re.compile(rb"OK (FATAL|ALERT|CRITICAL|ERROR|WARNING|NOTICE|INFO|DEBUG)\n")),
        ),
        send("admin", b"version\n", Line(re.compile(rb"OK [^\r\n]+\n"))),
    ),
    case(
        "admin_unknown_commands",
        send("admin", b"bogus\n", Line(b"ERR UNKNOWN_COMMAND Unknown+server+commandbogus\r\n")),
        send("admin", b"bogus arg\n", Line(b"ERR UNKNOWN_COMMAND Unknown+server+commandbogus\r\n")),
        send("admin", b"show x\n", Line(b"ERR UNKNOWN_SHOW_ARGUMENTS\r\n")),
        send("admin", b"show\n", Line(b"ERR UNKNOWN_COMMAND Unknown+server+commandshow\r\n")),
        send("admin", b"\n", Line(b"ERR UNKNOWN_COMMAND Unknown+server+command\r\n")),
        send("admin", b"\r\n", Line(b"ERR UNKNOWN_COMMAND Unknown+server+command\r\n")),
    ),
    case(
        "admin_case_and_line_endings",
        send("c", req("SUBMIT_JOB_BG", b"f", b"", b"x"), res("JOB_CREATED", h(1))),
        send("admin", b"STATUS\n", listing(b"f\t1\t0\t0")),
        send("admin", b"Status\r\n", listing(b"f\t1\t0\t0")),
        send("admin", b"sHoW  JoBs\r\n", listing(h(1) + b"\t0\t0\t1")),
        send("admin", b"PRIORITYSTATUS\r\n", listing(b"f\t0\t1\t0\t0")),
        send("admin", b"WORKERS\r\n", workers(b"FD 127.0.0.1 - :", b"FD 127.0.0.1 - :")),
        send("admin", b"cancel job H:test:9\r\n", Line(b"ERR UNKNOWN_JOB\r\n")),
    ),
    case(
        "admin_pipelined_and_split_lines",
        send("c", req("SUBMIT_JOB_BG", b"f", b"", b"x"), res("JOB_CREATED", h(1))),
        send(
            "admin",
            b"status\r\nmaxqueue f 5\r\nbogus\n",
            listing(b"f\t1\t0\t0"),
            OK,
            Line(b"ERR UNKNOWN_COMMAND Unknown+server+commandbogus\r\n"),
            tag="pipelined",
        ),
        send("admin", b"sta"),
        send("admin", b"tus\n", listing(b"f\t1\t0\t0")),
    ),
    case(
        "text_and_binary_mixed",
        send(
            "c",
            req("ECHO_REQ", b"a")
            + b"status\n"
            + req("SUBMIT_JOB_BG", b"f", b"", b"x")
            + b"STATUS\r\n"
            + req("GET_STATUS", h(1)),
            res("ECHO_RES", b"a"),
            listing(),
            res("JOB_CREATED", h(1)),
            listing(b"f\t1\t0\t0"),
            res("STATUS_RES", h(1), b"1", b"0", b"0", b"0"),
        ),
    ),
    # -- bad input ---------------------------------------------------------------------------
    case(
        "bad_magic",
        send("c", b"\0BAD" + struct.pack(">II", 16, 1) + b"x" + ECHO, Closed(), tag="bad"),
    ),
    case(
        "response_magic_from_client",
        send(
            "c",
            req("ECHO_REQ", b"x", magic=RES) + ECHO,
            error(b"INVALID_MAGIC", b"Request magic expected"),
            ECHOED,
        ),
    ),
    case(
        "unknown_packet_type",
        send("c", req(43) + ECHO, Closed(), tag="bad"),
    ),
    case(
        "packet_type_zero",
        send("c", req(0, b"status") + ECHO, Closed(), tag="bad"),
    ),
    case(
        "unused_packet_type_5",
        send("c", req(5) + ECHO, NOT_EXPECTED, ECHOED),
    ),
    case(
        "server_only_packets_from_client",
        *(
            send("c", packet + ECHO, NOT_EXPECTED, ECHOED)
            for packet in (
                req("NOOP"),
                req("JOB_CREATED", h(1)),
                req("NO_JOB"),
                req("JOB_ASSIGN", h(1), b"f", b"d"),
                req("ECHO_RES", b"x"),
                req("ERROR", b"CODE", b"text"),
                req("STATUS_RES", h(1), b"0", b"0", b"0", b"0"),
                req("OPTION_RES", b"exceptions"),
                req("JOB_ASSIGN_UNIQ", h(1), b"f", b"u", b"d"),
                req("JOB_ASSIGN_ALL", h(1), b"f", b"u", b"r", b"d"),
                req("STATUS_RES_UNIQUE", b"u", b"0", b"0", b"0", b"0", b"0"),
                req("ALL_YOURS"),
            )
        ),
    ),
    case(
        "unique_65_bytes_too_large",
        send(
            "c",
            req("SUBMIT_JOB_BG", b"f", U65, b"x") + ECHO,
            error(b"ARGUMENT_TOO_LARGE", b"Unique value too large"),
            ECHOED,
        ),
        send(
            "c",
            req("SUBMIT_JOB", b"f", U65, b"x"),
            error(b"ARGUMENT_TOO_LARGE", b"Unique value too large"),
        ),
        send(
            "c",
            req("SUBMIT_JOB_EPOCH", b"f", U65, FAR_FUTURE, b"x"),
            error(b"ARGUMENT_TOO_LARGE", b"Unique value too large"),
        ),
        send("admin", b"status\n", listing()),
    ),
    case(
        "unique_64_bytes_accepted",
        send("c", req("SUBMIT_JOB_BG", b"f", U64, b"x"), res("JOB_CREATED", h(1))),
        # gearmand accepts 64 bytes but keeps 63 in a 64-byte buffer: the same unique does not
        # coalesce, and JOB_ASSIGN_UNIQ carries the 63 bytes plus a NUL that shifts into the data.
        send("c", req("SUBMIT_JOB", b"f", U64, b"x"), res("JOB_CREATED", h(2)), tag="again"),
        send("admin", b"show unique jobs\n", listing(U63, U63), tag="unique"),
        send(
            "w",
            req("CAN_DO", b"f") + req("GRAB_JOB_UNIQ"),
            res("JOB_ASSIGN_UNIQ", h(1), b"f", U63, b"\0x"),
            tag="assign",
        ),
    ),
    case(
        "missing_argument_separators",
        # SUBMIT_JOB_BG needs FUNC\0UNIQ\0DATA; gearmand looks for the NULs past the end of the
        # body, swallows the ECHO_REQ behind it and drops the connection.
        send("c", req("SUBMIT_JOB_BG", b"fonly") + ECHO, Closed(), tag="bad"),
        idle_check=False,
    ),
    case(
        "work_status_not_numeric",
        send("c", req("SUBMIT_JOB", b"f", b"", b"x"), res("JOB_CREATED", h(1))),
        send("w", req("CAN_DO", b"f") + req("GRAB_JOB"), res("JOB_ASSIGN", h(1), b"f", b"x")),
        # Forwarded verbatim; the stored progress reads as 0/0.
        send("w", req("WORK_STATUS", h(1), b"abc", b"x"), tag="junk"),
        recv("c", res("WORK_STATUS", h(1), b"abc", b"x"), tag="forwarded"),
        send("c", req("GET_STATUS", h(1)), res("STATUS_RES", h(1), b"1", b"1", b"0", b"0")),
    ),
]


# -- deliberate differences -------------------------------------------------------------------

ERROR_CODE = re.compile(rb"[A-Z][A-Z_]*")

KNOWN_DIFFERENCES: dict[str, KnownDifference] = {
    "submit_job_sched": KnownDifference(
        "gearmand never implemented SUBMIT_JOB_SCHED and answers ERROR INVALID_COMMAND; jobwire "
        "schedules the job (cron fields) and answers JOB_CREATED.",
        {"sched": (res("JOB_CREATED", h(1)),)},
    ),
    "admin_create_function": KnownDifference(
        "gearmand truncates the name given to `create function` (arg_size-2 in text.cc: one "
        "byte too many with a `\\n` line end); jobwire creates the function it was asked for.",
        {"status": (listing(b"foo\t0\t0\t0"),)},
    ),
    "unknown_packet_type": KnownDifference(
        "gearmand drops the connection without a word on a type >= 43; jobwire says why "
        "(ERROR INVALID_COMMAND, any text) before closing.",
        {"bad": (error(b"INVALID_COMMAND", ANY), Closed())},
    ),
    "packet_type_zero": KnownDifference(
        "Type 0 is gearmand's internal TEXT command and it drops the connection without a word; "
        "jobwire says why (ERROR INVALID_COMMAND, any text) before closing.",
        {"bad": (error(b"INVALID_COMMAND", ANY), Closed())},
    ),
    "bad_magic": KnownDifference(
        "gearmand drops a connection whose binary header has neither \\0REQ nor \\0RES without a "
        "word; jobwire says why (ERROR INVALID_MAGIC, any text) before closing.",
        {"bad": (error(b"INVALID_MAGIC", ANY), Closed())},
    ),
    "unique_64_bytes_accepted": KnownDifference(
        "gearmand stores a 64-byte unique truncated to 63 bytes, so it never coalesces and "
        "JOB_ASSIGN_UNIQ shifts a NUL into the workload; jobwire keeps all 64 bytes.",
        {
            "again": (res("JOB_CREATED", h(1)),),
            "unique": (listing(U64),),
            "assign": (res("JOB_ASSIGN_UNIQ", h(1), b"f", U64, b"x"),),
        },
    ),
    "missing_argument_separators": KnownDifference(
        "gearmand searches for missing NUL separators beyond the packet's body, eats the next "
        "packet and drops the connection; jobwire keeps to the body size and answers an ERROR.",
        {"bad": (error(ERROR_CODE, ANY),)},
    ),
    **{
        name: KnownDifference(
            "gearmand answers maxqueue with `OK\\r\\n`; python-gearman and pygearman split "
            "replies on `\\n` and insist on exactly `OK`, so their send_maxqueue raises. jobwire "
            "answers `OK\\n`, which those clients accept (tests/interop/test_pygearman.py).",
            (
                {
                    "pipelined": (
                        listing(b"f\t1\t0\t0"),
                        Line(b"OK\n"),
                        Line(b"ERR UNKNOWN_COMMAND Unknown+server+commandbogus\r\n"),
                    )
                }
                if name == "admin_pipelined_and_split_lines"
                else {"maxqueue": (Line(b"OK\n"),)}
            ),
        )
        for name in (
            "admin_maxqueue_arguments",
            "admin_maxqueue_limit",
            "admin_maxqueue_per_priority",
            "admin_pipelined_and_split_lines",
        )
    },
    **{
        name: KnownDifference(
            "When gearmand turns WORK_EXCEPTION into WORK_FAIL for a client that did not ask "
            "for exceptions, it sends the handle with a stray trailing NUL; jobwire sends the "
            "plain WORK_FAIL a worker-originated failure has.",
            {"converted": (res("WORK_FAIL", h(1)),)},
        )
        for name in ("work_exception_without_option", "work_exception_coalesced_clients")
    },
    "work_status_not_numeric": KnownDifference(
        "gearmand forwards a WORK_STATUS whose numbers are not numbers and reports 0/0; "
        "jobwire answers the worker ERROR INVALID_ARGUMENT and forwards nothing.",
        {
            "junk": (error(b"INVALID_ARGUMENT", ANY),),
            "forwarded": (),
        },
    ),
    "priority_order_across_functions": KnownDifference(
        "gearmand 1.1.x takes priority per function, in reverse CAN_DO order (gearman/gearmand "
        "#173, fixed by PR #431 after 1.1.22); jobwire hands out HIGH before NORMAL before LOW "
        "across all of a worker's functions.",
        {
            "grabs": (
                res("JOB_ASSIGN", h(2), b"b", b"h"),
                res("JOB_ASSIGN", h(3), b"a", b"n"),
                res("JOB_ASSIGN", h(1), b"a", b"l"),
                res("NO_JOB"),
            )
        },
    ),
}
