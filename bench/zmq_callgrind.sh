#!/bin/bash
# Instructions per Majordomo request in a `jobwire serve --store memory` process (all threads,
# libzmq's I/O thread included), counted by callgrind over a fixed number of requests after a
# warm-up. Repeatable on a busy machine, unlike requests/s. Needs valgrind, and mdpbench built
# by `.venv/bin/python bench/zmq.py` (bench/out/mdpbench).
#
#   bench/zmq_callgrind.sh [async|serial] [REQUESTS] [mdp1|mdp2]
#   JOBWIRE_BIN=/other/tree/.venv/bin/jobwire bench/zmq_callgrind.sh   # another build
#   JOBWIRE_BIN=zguide-c bench/zmq_callgrind.sh   # the Guide's C broker, as bench/zmq.py builds it
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
MODE=${1:-async}; N=${2:-6000}; PROTO=${3:-mdp1}
BIN=${JOBWIRE_BIN:-$REPO/.venv/bin/jobwire}
MB=$REPO/bench/out/mdpbench
if [ "$MODE" = serial ]; then LOAD="--clients 1 --pipeline 1 --workers 1"; WARM=300
else LOAD="--clients 4 --pipeline 100 --workers 4"; WARM=2000; fi
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
PORT=$(port); GPORT=$(port)
OUT=$(mktemp -d)
if [ "$BIN" = zguide-c ]; then
  CMD=("$REPO/bench/.zmq-peers/mdbroker-c/mdbroker" -q "tcp://127.0.0.1:$PORT")
else
  CMD=("$BIN" serve -L 127.0.0.1 --port "$GPORT" --store memory --http-port 0 --zmq-port "$PORT")
fi
valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$OUT/callgrind.out" \
  "${CMD[@]}" > "$OUT/server.log" 2>&1 &
VPID=$!
for _ in $(seq 1 600); do
  python3 -c "import socket;socket.create_connection(('127.0.0.1',$PORT),timeout=1)" 2>/dev/null && break
  sleep 0.2
done
# shellcheck disable=SC2086
"$MB" --endpoint "tcp://127.0.0.1:$PORT" $LOAD --requests $WARM --client-proto "$PROTO" \
  --worker-proto "$PROTO" --timeout 120 > /dev/null
callgrind_control -i on "$VPID" > /dev/null 2>&1
# shellcheck disable=SC2086
"$MB" --endpoint "tcp://127.0.0.1:$PORT" $LOAD --requests "$N" --client-proto "$PROTO" \
  --worker-proto "$PROTO" --timeout 300 > "$OUT/mdpbench.json"
callgrind_control -i off "$VPID" > /dev/null 2>&1
kill -INT "$VPID"; wait "$VPID" || true
TOTAL=$(callgrind_annotate "$OUT"/callgrind.out* 2>/dev/null \
  | awk '/PROGRAM TOTALS/ && !done { gsub(",", "", $1); print $1; done = 1 }')
echo "$MODE $PROTO: $((TOTAL / N)) instructions per request ($N requests; profile in $OUT)"
