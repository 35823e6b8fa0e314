"""The Rota wire types (protocols/rota/wire.py): one declaration, the decoder, the encoder and
the published JSON Schema (`GET /rota/v1/schema.json`) agree, and so do docs/rota.md's
examples."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jsonschema_rs
import orjson
import pytest

from jobwire.protocols.rota import (
    REVISION,
    Beat,
    ErrorCode,
    Heartbeat,
    Registration,
    RotaError,
    SetState,
    Welcome,
    decode_server_message,
    decode_worker_message,
    encode,
    schema,
)
from tests.protocols.test_rota import HEARTBEATS, SERVER_MESSAGES

DOCS = Path(__file__).parents[2] / "docs" / "rota.md"
VALIDATOR = jsonschema_rs.Draft202012Validator(schema())

NEW_MESSAGES = [
    SetState("quiet"),
    SetState("running"),
    SetState("terminate"),
    Beat(),
    Welcome("rota:2", 5.0, 1024, (), REVISION, 0.5),
]


@pytest.mark.parametrize("message", [*HEARTBEATS, *SERVER_MESSAGES, *NEW_MESSAGES])
def test_every_encoded_message_is_valid_against_the_schema(message: Any) -> None:
    VALIDATOR.validate(orjson.loads(encode(message)))


@pytest.mark.parametrize("message", NEW_MESSAGES)
def test_revision_2_server_messages_round_trip(message: Any) -> None:
    assert decode_server_message(encode(message)) == message


def test_a_registration_says_its_revision() -> None:
    hb = Heartbeat(seq=1, register=Registration("h", "Linux", 1, None, (), revision=REVISION))
    assert decode_worker_message(encode(hb)) == hb
    assert orjson.loads(encode(hb))["register"]["revision"] == REVISION


def test_a_revision_1_welcome_has_no_beats() -> None:
    welcome = decode_server_message(
        b'{"v":1,"type":"welcome","worker":"rota:1",'
        b'"heartbeat_timeout":5,"max_message":1024,"specs":[]}'
    )
    assert welcome == Welcome("rota:1", 5.0, 1024, (), 1, None)


def test_an_unknown_state_is_refused_and_an_unknown_type_is_only_unknown() -> None:
    with pytest.raises(RotaError) as bad:
        decode_server_message(b'{"v":1,"type":"state","state":"nap"}')
    assert bad.value.code is ErrorCode.INVALID_MESSAGE
    assert bad.value.message.startswith("state:")
    with pytest.raises(RotaError) as unknown:
        decode_server_message(b'{"v":1,"type":"future"}')
    assert unknown.value.code is ErrorCode.UNKNOWN_TYPE and not unknown.value.fatal


@pytest.mark.parametrize(
    "result",
    [
        {"job": "j", "outcome": "success", "data": {"n": 2**64}},
        {"job": "j", "outcome": "failure", "error": {"details": [-(2**63) - 1]}},
    ],
)
def test_integers_beyond_64_bits_are_refused_not_rounded(result: dict[str, Any]) -> None:
    frame = orjson.dumps({"v": 1, "type": "heartbeat", "seq": 4, "results": ["RESULT"]})
    text = frame.decode().replace('"RESULT"', _big_json(result))
    with pytest.raises(RotaError) as info:
        decode_worker_message(text)
    assert (info.value.code, info.value.seq) == (ErrorCode.INVALID_MESSAGE, 4)
    assert "results[0]" in info.value.message


def _big_json(value: Any) -> str:
    """JSON with integers orjson cannot write (the standard library can)."""
    import json

    return json.dumps(value)


def test_limits_are_in_the_schema() -> None:
    defs = schema()["$defs"]
    wants = defs["Heartbeat"]["properties"]["wants"]["anyOf"][0]
    assert (wants["minimum"], wants["maximum"]) == (0, 100_000)
    assert defs["Progress"]["properties"]["job"]["maxLength"] == 1024
    assert set(defs) >= {"SetState", "Beat", "Welcome", "Heartbeat"}


def _doc_examples() -> list[dict[str, Any]]:
    blocks = re.findall(r"```json\n(.*?)```", DOCS.read_text(), re.DOTALL)
    examples = []
    for block in blocks:
        text = re.sub(r"…", "", block)
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            continue
        if isinstance(value, dict) and "v" in value:
            examples.append(value)
    return examples


def test_the_documents_examples_are_valid() -> None:
    examples = _doc_examples()
    assert len(examples) >= 4
    for example in examples:
        VALIDATOR.validate(example)
