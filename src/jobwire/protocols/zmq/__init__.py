"""ZeroMQ request-reply protocols, sans-IO: Majordomo 0.1/0.2 (`mdp`), its management
interface and Titanic (`services`), the Paranoid Pirate protocol (`ppp`), and the rule that
maps multipart bodies to a job's payload bytes and back (`frames`).

Nothing here knows about sockets or the engine: `jobwire.server.zmq` does the wiring and
`jobwire.sdk.zmq` holds the clients and workers.
"""
