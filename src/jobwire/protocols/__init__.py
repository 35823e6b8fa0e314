"""Sans-IO codecs: bytes in, typed messages out, and back. No sockets, no engine."""
