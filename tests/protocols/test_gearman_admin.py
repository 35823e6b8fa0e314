"""Admin text replies (protocols/gearman/admin.py) byte for byte against gearmand 1.1.20.

The expected bytes come from gearmand's libgearman-server/text.cc at tag 1.1.20 and the
probes recorded in specs/gearman.md section 2, never from admin.py itself.
"""

from __future__ import annotations

from jobwire.protocols.gearman import admin
from jobwire.protocols.gearman.decoder import AdminCommand, Decoder

# ---------------------------------------------------------------------- fixed replies


def test_ok_ends_with_crlf() -> None:
    assert admin.OK == b"OK\r\n"  # TEXT_SUCCESS


def test_maxqueue_ok_is_a_deliberate_difference() -> None:
    # gearmand sends "OK\r\n"; python-gearman/pygearman's send_maxqueue only accepts "OK\n".
    assert admin.OK_MAXQUEUE == b"OK\n"


def test_list_terminator() -> None:
    assert admin.END == b".\n"


def test_unknown_job() -> None:
    assert admin.UNKNOWN_JOB == b"ERR UNKNOWN_JOB\r\n"


def test_unknown_show_arguments() -> None:
    assert admin.UNKNOWN_SHOW == b"ERR UNKNOWN_SHOW_ARGUMENTS\r\n"


def test_drop_function_refusals() -> None:
    assert admin.DROP_BUSY == b"ERR there are still connected workers or executing clients\r\n"
    assert admin.DROP_UNKNOWN == b"ERR function not found\r\n"


def test_incomplete_arguments() -> None:
    assert admin.incomplete("maxqueue") == (
        b"ERR INVALID_ARGUMENTS "
        b"An+incomplete+set+of+arguments+was+sent+to+this+command+maxqueue\r\n"
    )
    assert admin.incomplete("drop") == (
        b"ERR INVALID_ARGUMENTS An+incomplete+set+of+arguments+was+sent+to+this+command+drop\r\n"
    )


def test_unknown_command_names_the_command() -> None:
    assert admin.unknown_command("foo") == b"ERR UNKNOWN_COMMAND Unknown+server+commandfoo\r\n"
    # An empty line: gearmand's arg[0] is empty.
    assert admin.unknown_command("") == b"ERR UNKNOWN_COMMAND Unknown+server+command\r\n"


def test_unknown_command_keeps_undecodable_bytes() -> None:
    # The decoder maps non-UTF-8 bytes to surrogates; gearmand echoes the raw bytes back.
    (command,) = Decoder().feed(b"\xff\xfeq bar\n")
    assert isinstance(command, AdminCommand)
    assert admin.unknown_command(command.args[0]) == (
        b"ERR UNKNOWN_COMMAND Unknown+server+command\xff\xfeq\r\n"
    )


def test_err_with_and_without_text() -> None:
    assert admin.err("UNKNOWN_JOB") == b"ERR UNKNOWN_JOB\r\n"
    assert admin.err("CREATE_FUNCTION", "fo") == b"ERR CREATE_FUNCTION fo\r\n"
    assert admin.err("X", "\udcff") == b"ERR X \xff\r\n"


def test_getpid_verbose_version_end_with_lf_only() -> None:
    assert admin.ok_value("399") == b"OK 399\n"
    assert admin.ok_value("INFO") == b"OK INFO\n"
    assert admin.ok_value("1.1.20+ds") == b"OK 1.1.20+ds\n"


# ---------------------------------------------------------------------- listings


def test_status_rows() -> None:
    rows = [("reverse", 3, 1, 2), ("idle", 0, 0, 0)]
    assert admin.status(rows) == b"reverse\t3\t1\t2\nidle\t0\t0\t0\n.\n"


def test_status_empty() -> None:
    assert admin.status([]) == b".\n"


def test_status_takes_a_generator() -> None:
    assert admin.status((f"f{i}", i, 0, 1) for i in range(2)) == b"f0\t0\t0\t1\nf1\t1\t0\t1\n.\n"


def test_priority_status_rows() -> None:
    rows = [("reverse", 1, 2, 3, 4), ("other", 0, 0, 0, 0)]
    assert admin.priority_status(rows) == b"reverse\t1\t2\t3\t4\nother\t0\t0\t0\t0\n.\n"
    assert admin.priority_status([]) == b".\n"


def test_workers_matches_the_gearmand_probe() -> None:
    rows: list[tuple[int, str, str, list[str]]] = [
        (26, "127.0.0.1", "-", []),
        (29, "127.0.0.1", "wk1", ["fnA"]),
    ]
    assert admin.workers(rows) == b"26 127.0.0.1 - :\n29 127.0.0.1 wk1 : fnA\n.\n"


def test_workers_with_several_functions() -> None:
    rows = [(7, "::1", "w", ("a", "b", "c"))]
    assert admin.workers(rows) == b"7 ::1 w : a b c\n.\n"
    assert admin.workers([]) == b".\n"


def test_workers_parse_as_python_gearman_expects() -> None:
    # python-gearman splits on single spaces and needs token[3] == ":".
    line = admin.workers([(29, "10.0.0.1", "wk1", ["fnA", "fnB"])]).split(b"\n")[0]
    tokens = line.decode().split(" ")
    assert tokens[3] == ":"
    assert tokens[4:] == ["fnA", "fnB"]


def test_show_jobs_rows() -> None:
    rows = [("H:vm:1", 0, 0, 1), ("H:vm:2", 3, 1, 0)]
    assert admin.show_jobs(rows) == b"H:vm:1\t0\t0\t1\nH:vm:2\t3\t1\t0\n.\n"
    assert admin.show_jobs([]) == b".\n"


def test_show_unique_jobs_rows() -> None:
    # 1.1.20 prints only the unique (later versions add the handle); empty unique = empty line.
    assert admin.show_unique_jobs(["u1", "", "u3"]) == b"u1\n\nu3\n.\n"
    assert admin.show_unique_jobs([]) == b".\n"


def test_listings_encode_non_utf8_names_back_to_their_bytes() -> None:
    name = b"fn\xff".decode("utf-8", "surrogateescape")
    assert admin.status([(name, 1, 0, 0)]) == b"fn\xff\t1\t0\t0\n.\n"
    assert admin.show_unique_jobs(["\u00e9"]) == b"\xc3\xa9\n.\n"
