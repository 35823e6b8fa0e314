"""The server's encoded replies (protocols/gearman/replies.py) against the general encoder."""

from __future__ import annotations

import pytest

from jobwire.protocols.gearman import replies
from jobwire.protocols.gearman.packets import HEADER_SIZE, encode
from jobwire.protocols.gearman.packets import PacketType as T


@pytest.mark.parametrize("prefix", ["H:t:", "H:" + "long-host-name." * 4 + ":"])
def test_job_created_across_blocks_of_numbers(prefix: str) -> None:
    created = replies.CreatedReplies()
    for number in [*range(1, 2100), 999, 5, 1000, 123456, 123457, 1001]:
        job_id = f"{prefix}{number}"
        reply = created.reply(number, job_id)
        assert reply == encode(T.JOB_CREATED, job_id.encode()), number
        assert replies.created_handle(reply) == job_id.encode()


def test_job_created_of_an_id_the_engine_did_not_number() -> None:
    created = replies.CreatedReplies()
    created.reply(1500, "H:1500")
    assert created.reply(0, "client-chosen") == encode(T.JOB_CREATED, b"client-chosen")
    assert replies.job_created(b"x") == encode(T.JOB_CREATED, b"x")


def test_the_per_job_replies_are_the_general_encoding() -> None:
    h, f, u, r, p = b"H:1", b"fn", b"uniq", b"red", b"payload\0with nul"
    assert replies.job_assign(h, f, p) == encode(T.JOB_ASSIGN, h, f, p)
    assert replies.job_assign_uniq(h, f, u, p) == encode(T.JOB_ASSIGN_UNIQ, h, f, u, p)
    assert replies.job_assign_all(h, f, u, r, p) == encode(T.JOB_ASSIGN_ALL, h, f, u, r, p)
    for ptype in (T.WORK_COMPLETE, T.WORK_DATA, T.WORK_WARNING, T.WORK_EXCEPTION):
        assert replies.work_result(ptype, h, p) == encode(ptype, h, p)
        assert replies.work_result(ptype, h, b"") == encode(ptype, h, b"")
    assert replies.work_status(h, b"1", b"2") == encode(T.WORK_STATUS, h, b"1", b"2")
    assert replies.work_fail(h) == encode(T.WORK_FAIL, h)
    big = bytes(5000)
    assert replies.job_assign(h, f, big) == encode(T.JOB_ASSIGN, h, f, big)
    assert len(replies.job_assign(h, f, big)) == HEADER_SIZE + len(h) + len(f) + 5002


def test_the_other_replies() -> None:
    assert replies.status_res(b"H:1", b"1", b"0", b"3", b"4") == encode(
        T.STATUS_RES, b"H:1", b"1", b"0", b"3", b"4"
    )
    assert replies.status_res_unique(b"u", b"1", b"1", b"0", b"0", b"2") == encode(
        T.STATUS_RES_UNIQUE, b"u", b"1", b"1", b"0", b"0", b"2"
    )
    assert replies.echo_res(b"ping") == encode(T.ECHO_RES, b"ping")
    assert replies.option_res(b"exceptions") == encode(T.OPTION_RES, b"exceptions")
    assert replies.error("QUEUE_ERROR", "Job could not be stored") == replies.NOT_STORED
    assert encode(T.ERROR, b"QUEUE_ERROR", b"Job could not be stored") == replies.NOT_STORED
