#!/bin/bash
# Stands in for gearmand in gearmand's test programs: run.sh copies it to the path libtest
# spawns (./gearmand/gearmand, configure.ac's GEARMAND_BINARY), with the two settings below
# filled in (libtest starts the server with an empty environment). libtest passes
# --pid-file, --port, --log-file, --verbose=INFO, --listen=localhost, -u root as root, and
# each test's own options; `jobwire serve` takes them all. The test's options come last, so
# they win over the defaults chosen here (gearmand's builtin queue; no HTTP or ZeroMQ
# ports, which parallel servers would all claim).
SERVER=@SERVER@    # jobwire, or gearmand: the gearmand built beside this file (the baseline)
JOBWIRE=@JOBWIRE@  # the jobwire executable
if [ "$SERVER" = gearmand ]; then
  exec "$(dirname "$0")/gearmand.real" "$@"
fi
exec "$JOBWIRE" serve -q builtin --http-port 0 --zmq-port 0 "$@"
