"""Incremental Gearman decoder: feed bytes, get every complete packet and admin line.

Binary or text is decided per message by its first byte (NUL = binary), as gearmand does,
so one connection may mix both. Bad input becomes a `ProtocolError` in the output, after
the messages that preceded it; a fatal one stops the decoder for good, because the stream
can no longer be framed.
"""

from __future__ import annotations

from typing import Final

from jobwire.protocols.gearman.packets import (
    HEADER_SIZE,
    REQ_MAGIC,
    REQUEST_ARGC,
    RES_MAGIC,
    RESPONSE_ARGC,
    Packet,
    PacketType,
)

DEFAULT_MAX_PACKET: Final = 64 * 1024 * 1024
DEFAULT_MAX_LINE: Final = 8192


class ProtocolError:
    """A message the decoder could not accept, with the ERROR code and text to send."""

    __slots__ = ("code", "fatal", "text")

    def __init__(self, code: str, text: str, *, fatal: bool) -> None:
        self.code = code
        self.text = text
        self.fatal = fatal

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProtocolError) and (self.code, self.text, self.fatal) == (
            other.code,
            other.text,
            other.fatal,
        )

    def __hash__(self) -> int:
        return hash((self.code, self.text, self.fatal))

    def __repr__(self) -> str:
        return f"ProtocolError({self.code!r}, {self.text!r}, fatal={self.fatal})"


class AdminCommand:
    """One admin text line, split on runs of spaces; `line` is the raw line without EOL."""

    __slots__ = ("args", "line")

    def __init__(self, line: bytes) -> None:
        self.line = line
        self.args = line.decode("utf-8", "surrogateescape").split()

    @property
    def name(self) -> str:
        return self.args[0].lower() if self.args else ""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AdminCommand) and self.line == other.line

    def __hash__(self) -> int:
        return hash(self.line)

    def __repr__(self) -> str:
        return f"AdminCommand({self.line!r})"


Message = Packet | AdminCommand | ProtocolError

MAX_PACKET_TYPE: Final = max(PacketType)
NOT_EXPECTED: Final = ProtocolError("INVALID_COMMAND", "Command not expected", fatal=False)


def _argc_list(argc: dict[int, int]) -> list[int]:
    """`argc` as a list by packet type, -1 for a type that does not flow this way."""
    table = [-1] * (MAX_PACKET_TYPE + 1)
    for ptype, count in argc.items():
        table[ptype] = count
    return table


_REQUEST_ARGC: Final = _argc_list(REQUEST_ARGC)
_RESPONSE_ARGC: Final = _argc_list(RESPONSE_ARGC)
# Literal constants for the per-packet checks: compiled, a Final int literal is a native
# constant, where a module global is a dictionary look-up (and `max(PacketType)` an enum
# member, compared generically).
_HEADER: Final = 12
_LAST_TYPE: Final = 42
_R: Final = 82  # b"R": the magics are NUL R E, then Q or S
_E: Final = 69
assert (HEADER_SIZE, int(MAX_PACKET_TYPE), *REQ_MAGIC[1:3]) == (_HEADER, _LAST_TYPE, _R, _E)


class Decoder:
    """Frames a byte stream into messages. One per connection."""

    __slots__ = (
        "_argc",
        "_buf",
        "_last",
        "_need",
        "_other_last",
        "_text",
        "failed",
        "max_line",
        "max_packet",
    )

    def __init__(
        self,
        *,
        max_packet: int = DEFAULT_MAX_PACKET,
        max_line: int = DEFAULT_MAX_LINE,
        server_side: bool = True,
    ) -> None:
        self._buf = bytearray()  # an incomplete message carried over to the next feed
        self._need = 0  # bytes the buffered packet needs before parsing is worth trying
        self.max_packet = max_packet
        self.max_line = max_line
        self.failed = False
        # The magic's last byte (Q or S) for this side and the other; the argument counts.
        if server_side:
            self._last, self._other_last, self._argc = REQ_MAGIC[3], RES_MAGIC[3], _REQUEST_ARGC
        else:
            self._last, self._other_last, self._argc = RES_MAGIC[3], REQ_MAGIC[3], _RESPONSE_ARGC
        self._text = server_side  # only servers accept admin lines

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def short_of(self, more: int) -> bool:
        """Would the buffered packet still be incomplete after `more` bytes?

        Lets a caller that parses reads itself hand a large packet's pieces to `feed`
        (which only appends them) instead of copying the growing buffer on every read.
        """
        return len(self._buf) + more < self._need

    def take_buffered(self) -> bytes:
        """Remove and return the incomplete message carried over from earlier feeds."""
        data = bytes(self._buf)
        self._buf.clear()
        self._need = 0
        return data

    def feed(self, data: bytes) -> list[Message]:
        """Add bytes; return every message now complete.

        The common case (nothing left over from the previous read) parses `data` in place;
        only a trailing partial message is copied into the buffer.
        """
        if self.failed:
            return []
        buf = self._buf
        if buf:
            if len(buf) + len(data) < self._need:  # still short of the pending packet
                buf += data
                return []
            buf += data
            data = bytes(buf)
            buf.clear()
        out: list[Message] = []
        pos = 0
        end_of_data = len(data)
        argc_table = self._argc
        last_expected = self._last
        self._need = 0
        while pos < end_of_data:
            if data[pos] != 0:
                after_line = self._text_line(data, pos, out)
                if after_line < 0:  # incomplete line, or a fatal error
                    break
                pos = after_line
                continue
            if end_of_data - pos < _HEADER:
                break
            # The header byte by byte: compiled, indexing bytes is native, where struct's
            # unpack is a generic call and its fields boxed ints (this runs once a packet).
            last = data[pos + 3]
            if (
                data[pos + 1] != _R
                or data[pos + 2] != _E
                or (last != last_expected and last != self._other_last)
            ):
                out.append(self._fail("INVALID_MAGIC", "Request magic expected"))
                break
            ptype = data[pos + 4] << 24 | data[pos + 5] << 16 | data[pos + 6] << 8 | data[pos + 7]
            size = data[pos + 8] << 24 | data[pos + 9] << 16 | data[pos + 10] << 8 | data[pos + 11]
            if size > self.max_packet:
                out.append(
                    self._fail("ARGUMENT_TOO_LARGE", f"Packet of {size} bytes exceeds the limit")
                )
                break
            start = pos + _HEADER
            end = start + size
            if end > end_of_data:
                self._need = end - pos
                break
            if last != last_expected:
                # The other side's magic: framed correctly, so skip it and carry on (gearmand).
                pos = end
                out.append(ProtocolError("INVALID_MAGIC", "Request magic expected", fatal=False))
                continue
            argc = argc_table[ptype] if ptype <= _LAST_TYPE else -1
            if argc < 0:
                pos = end
                if 0 < ptype <= _LAST_TYPE:
                    # A known type that only flows the other way, or the unused type 5.
                    out.append(NOT_EXPECTED)
                    continue
                out.append(self._fail("INVALID_COMMAND", f"Unknown packet type {ptype}"))
                break
            if argc == 0:
                args: tuple[bytes, ...] = ()
            elif argc == 1:
                args = (data[start:end],)
            else:
                args = tuple(data[start:end].split(b"\0", argc - 1))
                if len(args) != argc:
                    pos = end
                    out.append(
                        ProtocolError(
                            "INVALID_PACKET",
                            f"Expected {argc} arguments, got {len(args)}",
                            fatal=False,
                        )
                    )
                    continue
            out.append(Packet(ptype, args))
            pos = end
        if self.failed:
            self._need = 0
        elif pos < end_of_data:
            buf += memoryview(data)[pos:]
        return out

    def _text_line(self, data: bytes, pos: int, out: list[Message]) -> int:
        """Decode one admin line at `pos`; return the next position, or -1 to wait/stop."""
        if not self._text:
            out.append(self._fail("INVALID_MAGIC", "Response magic expected"))
            return -1
        newline = data.find(b"\n", pos)
        if newline < 0:
            if len(data) - pos > self.max_line:
                out.append(self._fail("ARGUMENT_TOO_LARGE", "Command line too long"))
            return -1
        if newline - pos > self.max_line:
            out.append(self._fail("ARGUMENT_TOO_LARGE", "Command line too long"))
            return -1
        line = data[pos:newline]
        if line.endswith(b"\r"):
            line = line[:-1]
        out.append(AdminCommand(line))
        return newline + 1

    def _fail(self, code: str, text: str) -> ProtocolError:
        self.failed = True
        return ProtocolError(code, text, fatal=True)
