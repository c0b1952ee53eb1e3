#!/usr/bin/env bash
# Slow loris: what 2,000 connections sending request heads a byte at a time cost a normal client.
# The same closed loop (USERS users, default 4; REQUESTS measured requests of a 32-token prompt
# and 16 output tokens) runs twice against one server: quiet, then while sluice-slowloris holds
# LORIS connections (default 2000) that each send one byte every INTERVAL_MS (default 1000; 0:
# as fast as the sockets take them). The server keeps its defaults (header_timeout_ms 10 s: a
# slow head is answered 408 and its client opens another). The attacker shares the 2 vCPUs with
# the server and the load generator, at nice 10.
# Usage: bench/scenarios/slowloris.sh [REQUESTS] [INTERVAL_MS]
source "$(dirname "$0")/lib.sh"
N=${1:-200}
INTERVAL=${2:-1000}
USERS=${USERS:-4}
LORIS_CONNS=${LORIS:-2000}
LORIS_BIN=$BUILD/bench/sluice-slowloris
echo "== slow loris: $LORIS_CONNS connections, a byte each every $INTERVAL ms; $(machine)"
start_sluice "$SCEN/stories15M.json"
run() {
  bench --concurrency "$USERS" --num-requests "$N" --num-warmups 8 --prompt 32 --output 16 \
    --ignore-eos --label "$1" --summary "$OUT/summary.tsv" >/dev/null
}
run quiet
nice -n 10 "$LORIS_BIN" --url "$URL" --connections "$LORIS_CONNS" --interval-ms "$INTERVAL" \
  >"$OUT/loris.txt" 2>"$OUT/loris.log" &
LORIS_PID=$!
for _ in $(seq 600); do
  grep -q 'connections open' "$OUT/loris.log" && break
  sleep 0.2
done
cat "$OUT/loris.log"
run slowloris
kill -TERM "$LORIS_PID"
wait "$LORIS_PID" || true
cat "$OUT/loris.txt"
stop_sluice
echo
table "$OUT/summary.tsv" label class ok errors req/s ttft_p50 ttft_p99 tpot_p50 tpot_p99 e2el_p50 \
  e2el_p99
awk -F'\t' 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
  { for (k in c) v[$1, k] = $c[k] }
  END {
    printf "slowloris / quiet:"
    n = split("ttft_p50 ttft_p99 e2el_p50 e2el_p99", m, " ")
    for (i = 1; i <= n; i++)
      printf " %s %.2fx", m[i], v["slowloris", m[i]] / v["quiet", m[i]]
    print ""
  }' "$OUT/summary.tsv"
