"""The Binary Star state machine (protocols/zmq/bstar.py), every row of its table."""

from __future__ import annotations

import pytest

from jobwire.protocols.zmq.bstar import (
    BinaryStar,
    SplitBrain,
    State,
    decode_state,
    encode_state,
)

P, B, A, S = State.PRIMARY, State.BACKUP, State.ACTIVE, State.PASSIVE


def node(state: State, *, now: float = 0.0) -> BinaryStar:
    fsm = BinaryStar(state is not B, now, heartbeat=1.0)
    fsm.state = state
    return fsm


@pytest.mark.parametrize(
    ("state", "peer", "after"),
    [
        (P, B, A),
        (P, A, S),
        (P, P, P),
        (P, S, P),
        (B, A, S),
        (B, P, B),
        (B, B, B),
        (A, P, A),
        (A, B, A),
        (A, S, A),
        (S, P, A),  # the peer restarts and will go passive
        (S, B, A),
        (S, A, S),
    ],
)
def test_peer_events(state: State, peer: State, after: State) -> None:
    assert node(state).peer_state(peer, 0.0) is after


@pytest.mark.parametrize(("state", "peer"), [(A, A), (S, S)])
def test_dual_actives_and_dual_passives_are_fatal(state: State, peer: State) -> None:
    with pytest.raises(SplitBrain):
        node(state).peer_state(peer, 0.0)


def test_the_client_vote() -> None:
    primary = BinaryStar(True, 0.0, heartbeat=1.0)
    assert not primary.client_request(1.9)  # the peer may be active: wait two beats
    assert primary.client_request(2.0) and primary.active
    backup = BinaryStar(False, 0.0, heartbeat=1.0)
    assert not backup.client_request(100.0)  # a backup never starts serving on its own
    backup.peer_state(A, 100.0)
    assert backup.state is S
    assert not backup.client_request(101.9)  # the active peer spoke 1.9 s ago
    assert backup.client_request(102.0) and backup.active  # silent for two beats: failover
    assert backup.client_request(500.0)  # active stays active


def test_state_messages() -> None:
    for state in State:
        assert decode_state(encode_state(state)) is state
    for raw in (b"", b"0", b"5", b"12", b"x"):
        with pytest.raises(ValueError):
            decode_state(raw)
