"""The Gearman packet table as the spec states it (specs/gearman.md section 1).

Kept independent of `jobwire.protocols.gearman.packets` on purpose: the codec tests compare
the implementation against this table, not against itself.
"""

from __future__ import annotations

#: Request types (client/worker -> server, magic \0REQ): number -> total field count.
REQUESTS: dict[str, tuple[int, int]] = {
    "CAN_DO": (1, 1),
    "CANT_DO": (2, 1),
    "RESET_ABILITIES": (3, 0),
    "PRE_SLEEP": (4, 0),
    "SUBMIT_JOB": (7, 3),
    "GRAB_JOB": (9, 0),
    "WORK_STATUS": (12, 3),
    "WORK_COMPLETE": (13, 2),
    "WORK_FAIL": (14, 1),
    "GET_STATUS": (15, 1),
    "ECHO_REQ": (16, 1),
    "SUBMIT_JOB_BG": (18, 3),
    "SUBMIT_JOB_HIGH": (21, 3),
    "SET_CLIENT_ID": (22, 1),
    "CAN_DO_TIMEOUT": (23, 2),
    "ALL_YOURS": (24, 0),
    "WORK_EXCEPTION": (25, 2),
    "OPTION_REQ": (26, 1),
    "WORK_DATA": (28, 2),
    "WORK_WARNING": (29, 2),
    "GRAB_JOB_UNIQ": (30, 0),
    "SUBMIT_JOB_HIGH_BG": (32, 3),
    "SUBMIT_JOB_LOW": (33, 3),
    "SUBMIT_JOB_LOW_BG": (34, 3),
    # function, unique, minute, hour, mday, month, wday, data
    "SUBMIT_JOB_SCHED": (35, 8),
    # function, unique, epoch, data
    "SUBMIT_JOB_EPOCH": (36, 4),
    # libgearman's layout: function, unique, reducer, aggregator (empty), data
    "SUBMIT_REDUCE_JOB": (37, 5),
    "SUBMIT_REDUCE_JOB_BACKGROUND": (38, 5),
    "GRAB_JOB_ALL": (39, 0),
    "GET_STATUS_UNIQUE": (41, 1),
}

#: Response types (server -> client/worker, magic \0RES): number -> total field count.
RESPONSES: dict[str, tuple[int, int]] = {
    "NOOP": (6, 0),
    "JOB_CREATED": (8, 1),
    "NO_JOB": (10, 0),
    "JOB_ASSIGN": (11, 3),
    "WORK_STATUS": (12, 3),
    "WORK_COMPLETE": (13, 2),
    "WORK_FAIL": (14, 1),
    "ECHO_RES": (17, 1),
    "ERROR": (19, 2),
    "STATUS_RES": (20, 5),
    "WORK_EXCEPTION": (25, 2),
    "OPTION_RES": (27, 1),
    "WORK_DATA": (28, 2),
    "WORK_WARNING": (29, 2),
    "JOB_ASSIGN_UNIQ": (31, 4),
    "JOB_ASSIGN_ALL": (40, 5),
    "STATUS_RES_UNIQUE": (42, 6),
}

#: Types only the server sends: a client sending one gets a non-fatal INVALID_COMMAND.
SERVER_ONLY = {name: spec for name, spec in RESPONSES.items() if name not in REQUESTS}
#: Types only clients and workers send.
CLIENT_ONLY = {name: spec for name, spec in REQUESTS.items() if name not in RESPONSES}

#: Realistic field values for each request type (the last field may hold NULs).
REQUEST_EXAMPLES: dict[str, tuple[bytes, ...]] = {
    "CAN_DO": (b"reverse",),
    "CANT_DO": (b"reverse",),
    "RESET_ABILITIES": (),
    "PRE_SLEEP": (),
    "SUBMIT_JOB": (b"reverse", b"u1", b"hello\0world\0"),
    "GRAB_JOB": (),
    "WORK_STATUS": (b"H:vm:1", b"3", b"10"),
    "WORK_COMPLETE": (b"H:vm:1", b"\0result\0"),
    "WORK_FAIL": (b"H:vm:1",),
    "GET_STATUS": (b"H:vm:1",),
    "ECHO_REQ": (b"\0ping\0\0",),
    "SUBMIT_JOB_BG": (b"reverse", b"", b"payload"),
    "SUBMIT_JOB_HIGH": (b"reverse", b"-", b"a\0b"),
    "SET_CLIENT_ID": (b"worker-1",),
    "CAN_DO_TIMEOUT": (b"reverse", b"5000"),
    "ALL_YOURS": (),
    "WORK_EXCEPTION": (b"H:vm:1", b"Traceback\0..."),
    "OPTION_REQ": (b"exceptions",),
    "WORK_DATA": (b"H:vm:1", b"chunk\0"),
    "WORK_WARNING": (b"H:vm:1", b"careful"),
    "GRAB_JOB_UNIQ": (),
    "SUBMIT_JOB_HIGH_BG": (b"reverse", b"u2", b""),
    "SUBMIT_JOB_LOW": (b"reverse", b"u3", b"\0"),
    "SUBMIT_JOB_LOW_BG": (b"reverse", b"u4", b"low"),
    "SUBMIT_JOB_SCHED": (b"reverse", b"u5", b"30", b"2", b"", b"", b"1", b"sched\0data"),
    "SUBMIT_JOB_EPOCH": (b"reverse", b"u6", b"1700000000", b"epoch\0data"),
    "SUBMIT_REDUCE_JOB": (b"count", b"u7", b"sum", b"", b"map\0data"),
    "SUBMIT_REDUCE_JOB_BACKGROUND": (b"count", b"u8", b"sum", b"", b"bg"),
    "GRAB_JOB_ALL": (),
    "GET_STATUS_UNIQUE": (b"u1",),
}

#: Realistic field values for each response type.
RESPONSE_EXAMPLES: dict[str, tuple[bytes, ...]] = {
    "NOOP": (),
    "JOB_CREATED": (b"H:vm:1",),
    "NO_JOB": (),
    "JOB_ASSIGN": (b"H:vm:1", b"reverse", b"pay\0load"),
    "WORK_STATUS": (b"H:vm:1", b"1", b"2"),
    "WORK_COMPLETE": (b"H:vm:1", b"done\0"),
    # gearmand sends a converted exception's WORK_FAIL with a trailing NUL: kept verbatim.
    "WORK_FAIL": (b"H:vm:6\0",),
    "ECHO_RES": (b"\0pong",),
    "ERROR": (b"QUEUE_ERROR", b"Job queue is full"),
    "STATUS_RES": (b"H:vm:1", b"1", b"0", b"0", b"0"),
    "WORK_EXCEPTION": (b"H:vm:1", b"boom\0"),
    "OPTION_RES": (b"exceptions",),
    "WORK_DATA": (b"H:vm:1", b"\0\0"),
    "WORK_WARNING": (b"H:vm:1", b"warn"),
    "JOB_ASSIGN_UNIQ": (b"H:vm:1", b"reverse", b"u1", b"data"),
    "JOB_ASSIGN_ALL": (b"H:vm:1", b"count", b"u7", b"sum", b"data\0"),
    "STATUS_RES_UNIQUE": (b"u1", b"1", b"0", b"0", b"0", b"0"),
}
