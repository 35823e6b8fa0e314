"""Binary Star (ZeroMQ Guide, chapter 4), sans-IO: the primary/backup state machine.

Each server publishes its state (a decimal digit) every `heartbeat` seconds and hears its
peer's; the peer is dead `2 * heartbeat` after its last state. A server serves clients only
while ACTIVE. Failover takes two things, the "client vote": a client asking a passive server,
and a silent peer. Two actives (split brain) or two passives (nobody serves) are fatal.

| state   | event          | result |
|---------|----------------|--------|
| PRIMARY | PEER_BACKUP    | ACTIVE |
| PRIMARY | PEER_ACTIVE    | PASSIVE |
| PRIMARY | CLIENT_REQUEST | ACTIVE if the peer is silent, else refused |
| BACKUP  | PEER_ACTIVE    | PASSIVE |
| BACKUP  | CLIENT_REQUEST | refused |
| ACTIVE  | PEER_ACTIVE    | fatal: dual actives |
| PASSIVE | PEER_PRIMARY, PEER_BACKUP | ACTIVE (the peer restarts and will go passive) |
| PASSIVE | PEER_PASSIVE   | fatal: dual passives |
| PASSIVE | CLIENT_REQUEST | ACTIVE if the peer is silent ("failover"), else refused |
"""

from __future__ import annotations

from enum import IntEnum


class State(IntEnum):
    PRIMARY = 1  # started as primary, peer not heard yet
    BACKUP = 2  # started as backup, peer not heard yet
    ACTIVE = 3  # serving clients
    PASSIVE = 4  # not serving; takes over if the peer dies and a client asks


class SplitBrain(RuntimeError):
    """Dual actives or dual passives: the pair is misconfigured or partitioned."""


class BinaryStar:
    def __init__(self, primary: bool, now: float, heartbeat: float = 1.0) -> None:
        self.state = State.PRIMARY if primary else State.BACKUP
        self.heartbeat = heartbeat
        # A peer that has not spoken yet counts as alive for two beats after we start.
        self.peer_expiry = now + 2 * heartbeat

    @property
    def active(self) -> bool:
        return self.state is State.ACTIVE

    def peer_state(self, peer: State, now: float) -> State:
        """The peer published `peer`; returns our state after it. Raises SplitBrain."""
        self.peer_expiry = now + 2 * self.heartbeat
        state = self.state
        if state is State.PRIMARY:
            if peer is State.BACKUP:
                self.state = State.ACTIVE
            elif peer is State.ACTIVE:
                self.state = State.PASSIVE
        elif state is State.BACKUP:
            if peer is State.ACTIVE:
                self.state = State.PASSIVE
        elif state is State.ACTIVE:
            if peer is State.ACTIVE:
                raise SplitBrain("dual actives: both servers of the pair are active")
        elif peer in (State.PRIMARY, State.BACKUP):
            self.state = State.ACTIVE  # passive, and the peer is restarting
        elif peer is State.PASSIVE:
            raise SplitBrain("dual passives: neither server of the pair would serve")
        return self.state

    def client_request(self, now: float) -> bool:
        """A client asks: True if we serve it (we are, or just became, active)."""
        state = self.state
        if state is State.ACTIVE:
            return True
        if state in (State.PRIMARY, State.PASSIVE) and now >= self.peer_expiry:
            self.state = State.ACTIVE
            return True
        return False


def encode_state(state: State) -> bytes:
    return b"%d" % state


def decode_state(raw: bytes) -> State:
    """Raises ValueError for anything but "1" to "4"."""
    if len(raw) != 1:
        raise ValueError(f"not a Binary Star state: {raw[:8]!r}")
    return State(int(raw))
