"""The server's Gearman reader: frames every request and hands it to a `Sink`.

A `Scanner` owns one connection's input. The common requests (plain submits with or
without a unique id, grabs, sleep, a result) are read in place, without building messages,
and reach the sink as typed calls (`submit_plain`, `grab`, `pre_sleep`, `work_complete`);
any other request reaches it as a `Packet` (`packet`), an admin line as an `AdminCommand`
(`admin`), bad input as a `ProtocolError` (`protocol_error`). What the fast loop does not
frame itself (a text line, a partial or oversized packet, a bad magic) goes to the general
`Decoder`, whose packets are routed the same way: a request reaches the same sink method
however the stream was cut into reads.

Compiled with mypyc (`jobwire.native`): the sink's methods are native calls, so the
listener subclasses `Sink`.
"""

from __future__ import annotations

import logging
from typing import Final

from mypy_extensions import i64, mypyc_attr

from jobwire.protocols.gearman.decoder import AdminCommand, Decoder, ProtocolError
from jobwire.protocols.gearman.packets import Packet
from jobwire.protocols.gearman.packets import PacketType as T

log = logging.getLogger("jobwire.gearman")

#: The longest unique id a submit may carry (gearmand's GEARMAN_MAX_UNIQUE_SIZE).
MAX_UNIQUE: Final = 64
#: Gearman's three priority levels, as `submit_plain` reports them: the engine's values.
HIGH: Final = 1
NORMAL: Final = 0
LOW: Final = -1

#: Sent for a request whose handling raised (one bad request must not end the connection).
SERVER_ERROR: Final = ProtocolError(
    "SERVER_ERROR", "Internal error handling the request", fatal=False
)

# Enum member lookups cost ~0.1 us each in Python 3.11; the per-packet paths use these.
_WORK_COMPLETE: Final = int(T.WORK_COMPLETE)
_GRAB_JOB: Final = int(T.GRAB_JOB)
_GRAB_JOB_UNIQ: Final = int(T.GRAB_JOB_UNIQ)
_GRAB_JOB_ALL: Final = int(T.GRAB_JOB_ALL)
_PRE_SLEEP: Final = int(T.PRE_SLEEP)

_PLAIN_SUBMITS: Final[dict[int, tuple[int, bool]]] = {
    T.SUBMIT_JOB: (NORMAL, False),
    T.SUBMIT_JOB_BG: (NORMAL, True),
    T.SUBMIT_JOB_HIGH: (HIGH, False),
    T.SUBMIT_JOB_HIGH_BG: (HIGH, True),
    T.SUBMIT_JOB_LOW: (LOW, False),
    T.SUBMIT_JOB_LOW_BG: (LOW, True),
}
#: SUBMIT_JOB* packets without extra fields: (priority, background) at the index of their
#: packet type, None at the others. Compiled, indexing a list is native; a dict lookup by
#: integer hashes and compares objects.
_PLAIN_SUBMIT_BY_TYPE: Final[list[tuple[int, bool] | None]] = [
    _PLAIN_SUBMITS.get(ptype) for ptype in range(max(_PLAIN_SUBMITS) + 1)
]


@mypyc_attr(allow_interpreted_subclasses=True)  # tests record the calls
class Sink:
    """What a `Scanner` calls for each request, in the order they arrived.

    The listener subclasses it (compiled, these are native calls). Byte fields are exactly
    as sent. `tick` is called every 16 packets of a long read, a chance to look at other
    work (a store's commits) while the read is handled.
    """

    def submit_plain(
        self, function: bytes, unique: bytes, payload: bytes, priority: int, background: bool
    ) -> None:
        """SUBMIT_JOB, _BG, _HIGH, _HIGH_BG, _LOW, _LOW_BG; `unique` (b"": none) is at most
        `MAX_UNIQUE` bytes (longer ones come as a `packet`); `priority` is HIGH/NORMAL/LOW."""
        raise NotImplementedError

    def work_complete(self, number: int, handle: bytes, result: bytes) -> None:
        """WORK_COMPLETE. `number` is N when the handle is `PREFIX:N` (`handle_number`), and
        then `handle` may be b"" (it is PREFIX + N, not cut out of the read); else 0."""
        raise NotImplementedError

    def grab(self, kind: int) -> None:
        """GRAB_JOB, GRAB_JOB_UNIQ or GRAB_JOB_ALL (`kind` is the packet type)."""
        raise NotImplementedError

    def pre_sleep(self) -> None:
        raise NotImplementedError

    def packet(self, packet: Packet) -> None:
        """Any other request, with its fields split as `REQUEST_ARGC` says."""
        raise NotImplementedError

    def admin(self, command: AdminCommand) -> None:
        raise NotImplementedError

    def protocol_error(self, error: ProtocolError) -> None:
        """Input refused, or a request whose handling raised (`SERVER_ERROR`). After a
        fatal error the scanner reads nothing more."""
        raise NotImplementedError

    def tick(self) -> None:
        pass


# The fast loop reads headers and finds separators with these instead of struct and split:
# compiled, indexing bytes is a native operation, and no intermediate objects are made.
# Their `i64` locals are machine integers (no overflow checks, no boxing); they take and
# return `int`, as slicing with an `i64` index would take mypyc's generic path.
def request_head(data: bytes, pos: int) -> int:
    """The header at data[pos:pos + 12] as `type << 32 | size`, or -1 if it is not a
    request's or its type is out of range (the decoder then reports it)."""
    at: i64 = pos
    if data[at] != 0 or data[at + 1] != 82 or data[at + 2] != 69 or data[at + 3] != 81:
        return -1  # not b"\0REQ"
    if data[at + 4] or data[at + 5]:
        return -1  # a type over 65535: none exists
    ptype: i64 = (data[at + 6] << 8) | data[at + 7]
    b0: i64 = data[at + 8]
    b1: i64 = data[at + 9]
    b2: i64 = data[at + 10]
    b3: i64 = data[at + 11]
    return (ptype << 32) | (b0 << 24) | (b1 << 16) | (b2 << 8) | b3


def find_nul(data: bytes, pos: int, stop: int) -> int:
    """The index of the first NUL byte in data[pos:stop], or -1."""
    at: i64 = pos
    end: i64 = stop
    while at < end:
        if data[at] == 0:
            return at
        at += 1
    return -1


def handle_number(data: bytes, begin: int, stop: int, prefix: bytes) -> int:
    """N if data[begin:stop] is exactly `prefix` + N as the engine numbers job ids (N > 0,
    no leading zero), else 0. Read in place: a result's handle is found without slicing it
    out of the read, and then by number, not by hashing a decoded string. The one place
    that parses handles back into numbers."""
    first: i64 = begin
    start: i64 = first + len(prefix)  # where the digits begin
    end: i64 = stop
    if end <= start or end - start > 18 or data[start] == 48:  # no digits, too many, "0…"
        return 0
    number: i64 = 0
    at = start
    while at < end:
        digit: i64 = data[at] - 48
        if digit < 0 or digit > 9:
            return 0
        number = number * 10 + digit
        at += 1
    at = first
    while at < start:
        if data[at] != prefix[at - first]:
            return 0
        at += 1
    return number


class Scanner:
    """One connection's input: `feed` each read; the sink hears of every request in it."""

    def __init__(self, sink: Sink, prefix: bytes, max_packet: int) -> None:
        self.sink = sink
        #: The start of the job handles the engine numbers (`handle_number`).
        self.prefix = prefix
        self.max_packet = max_packet
        self.decoder = Decoder(max_packet=max_packet)

    @property
    def failed(self) -> bool:
        """A fatal error was reported: the stream can no longer be framed."""
        return self.decoder.failed

    def feed(self, data: bytes) -> None:
        """Handle every request complete in the input so far; keep the rest for later."""
        decoder = self.decoder
        if decoder.buffered:
            if decoder.short_of(len(data)):  # the buffered packet is still incomplete
                decoder.feed(data)  # appends, without copying the growing buffer
                return
            data = decoder.take_buffered() + data
        if not decoder.failed:
            done = self._scan(data)
            if done:
                data = data[done:]
        if len(data):  # compiled, len() is native where the truth of bytes is a call
            self._decode(data)

    def _scan(self, data: bytes) -> int:
        """Handle the complete packets at the front of `data`; return the bytes consumed.

        The common packets are handled here; any other complete packet goes through the
        decoder on its own. A text line, a partial or oversized packet or a bad magic stops
        the run: the decoder takes the rest, so framing errors are handled in one place.
        """
        sink = self.sink
        pos = 0
        end = len(data)
        max_packet = self.max_packet
        count = 0
        while end - pos >= 12:
            count += 1
            if not count & 15:
                sink.tick()
            head = request_head(data, pos)
            if head < 0:
                break
            size = head & 0xFFFFFFFF
            start = pos + 12
            stop = start + size
            if stop > end or size > max_packet:
                break
            ptype = head >> 32
            try:
                if ptype == _WORK_COMPLETE:
                    nul = find_nul(data, start, stop)
                    if nul >= 0:
                        number = handle_number(data, start, nul, self.prefix)
                        sink.work_complete(
                            number, b"" if number else data[start:nul], data[nul + 1 : stop]
                        )
                        pos = stop
                        continue
                elif ptype in (_GRAB_JOB, _GRAB_JOB_UNIQ, _GRAB_JOB_ALL):
                    sink.grab(ptype)
                    pos = stop
                    continue
                elif ptype == _PRE_SLEEP:
                    sink.pre_sleep()
                    pos = stop
                    continue
                else:
                    table = _PLAIN_SUBMIT_BY_TYPE
                    plain = table[ptype] if ptype < len(table) else None
                    if plain is not None:
                        # The fields are function, unique id, payload: find the two NULs
                        # instead of splitting, which would copy the packet body once more.
                        nul = find_nul(data, start, stop)
                        nul2 = find_nul(data, nul + 1, stop) if nul >= 0 else -1
                        if nul2 >= 0 and nul2 - nul - 1 <= MAX_UNIQUE:
                            # No *plain: a starred call is a slow generic call once compiled.
                            priority, background = plain
                            sink.submit_plain(
                                data[start:nul],
                                data[nul + 1 : nul2],
                                data[nul2 + 1 : stop],
                                priority,
                                background,
                            )
                            pos = stop
                            continue
            except Exception:  # one bad request must not take the connection down
                self._failed(ptype)
                pos = stop
                continue
            # Any other packet, or a malformed common one: the general way, on its own.
            self._decode(data[pos:stop])
            if self.decoder.failed:  # an unknown packet type: nothing after it is read
                return end
            pos = stop
        return pos

    def _decode(self, data: bytes) -> None:
        """Decode `data` and route each message (every packet type, errors, admin)."""
        sink = self.sink
        for message in self.decoder.feed(data):
            if type(message) is Packet:
                self._route(message)
            elif type(message) is AdminCommand:
                try:
                    sink.admin(message)
                except Exception:
                    self._failed(-1)
            else:
                assert isinstance(message, ProtocolError)
                sink.protocol_error(message)
                if message.fatal:
                    break

    def _route(self, packet: Packet) -> None:
        """A decoded packet to the sink method the fast loop would have called."""
        sink = self.sink
        ptype = packet.type
        args = packet.args
        try:
            if ptype == _WORK_COMPLETE:
                handle = args[0]
                number = handle_number(handle, 0, len(handle), self.prefix)
                sink.work_complete(number, handle, args[1])
            elif ptype in (_GRAB_JOB, _GRAB_JOB_UNIQ, _GRAB_JOB_ALL):
                sink.grab(ptype)
            elif ptype == _PRE_SLEEP:
                sink.pre_sleep()
            else:
                table = _PLAIN_SUBMIT_BY_TYPE
                plain = table[ptype] if ptype < len(table) else None
                if plain is not None and len(args[1]) <= MAX_UNIQUE:
                    priority, background = plain
                    sink.submit_plain(args[0], args[1], args[2], priority, background)
                else:
                    sink.packet(packet)
        except Exception:  # one bad request must not take the connection down
            self._failed(ptype)

    def _failed(self, ptype: int) -> None:
        if ptype < 0:
            log.exception("handling an admin command failed")
        else:
            log.exception("handling packet type %d failed", ptype)
        self.sink.protocol_error(SERVER_ERROR)
