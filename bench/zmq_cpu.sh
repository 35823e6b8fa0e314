#!/bin/bash
# A broker's CPU time per Majordomo request (user and system, from /proc/PID/stat) over a
# fixed number of requests after 500 warm-up ones. Needs mdpbench and the Guide's brokers as
# `.venv/bin/python bench/zmq.py` leaves them (bench/out, bench/.zmq-peers).
#
#   bench/zmq_cpu.sh BROKER [async|serial] [REQUESTS]
#   BROKER: a `jobwire` script (e.g. .venv/bin/jobwire, or another tree's), zguide-c or zguide-py
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
BROKER=$1; MODE=${2:-async}; N=${3:-30000}
MB=$REPO/bench/out/mdpbench
PEERS=$REPO/bench/.zmq-peers
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
PORT=$(port); GPORT=$(port)
LOG=$(mktemp)
case $BROKER in
  zguide-c) "$PEERS/mdbroker-c/mdbroker" -q "tcp://127.0.0.1:$PORT" > "$LOG" 2>&1 & ;;
  zguide-py) "$PEERS/venv/bin/python" "$PEERS/mdbroker-py/mdbroker.py" "tcp://127.0.0.1:$PORT" > "$LOG" 2>&1 & ;;
  *) "$BROKER" serve -L 127.0.0.1 --port "$GPORT" --store memory --http-port 0 --zmq-port "$PORT" > "$LOG" 2>&1 & ;;
esac
PID=$!
for _ in $(seq 1 300); do
  python3 -c "import socket;socket.create_connection(('127.0.0.1',$PORT),timeout=1)" 2>/dev/null && break
  sleep 0.1
done
if [ "$MODE" = serial ]; then LOAD="--clients 1 --pipeline 1 --workers 1"
else LOAD="--clients 4 --pipeline 100 --workers 4"; fi
# shellcheck disable=SC2086
"$MB" --endpoint "tcp://127.0.0.1:$PORT" $LOAD --requests 500 --timeout 60 > /dev/null
BEFORE=$(awk '{print $14, $15}' "/proc/$PID/stat")
# shellcheck disable=SC2086
RESULT=$("$MB" --endpoint "tcp://127.0.0.1:$PORT" $LOAD --requests "$N" --timeout 120)
AFTER=$(awk '{print $14, $15}' "/proc/$PID/stat")
kill -INT "$PID"; sleep 0.3; kill -9 "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true
python3 - "$BROKER" "$MODE" "$N" "$BEFORE" "$AFTER" "$RESULT" <<'PY'
import json, os, sys
broker, mode, n, before, after, result = sys.argv[1:]
tick, n = os.sysconf("SC_CLK_TCK"), int(n)
(u0, s0), (u1, s1) = (map(int, x.split()) for x in (before, after))
user, system = (u1 - u0) / tick * 1e6 / n, (s1 - s0) / tick * 1e6 / n
r = json.loads(result)
print(f"{broker} {mode}: user {user:.1f} + system {system:.1f} = {user + system:.1f} us/request;"
      f" {r['requests_per_s']:,.0f} req/s, p50 {r['p50_ms']:.3f} ms")
PY
