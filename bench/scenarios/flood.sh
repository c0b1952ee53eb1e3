#!/usr/bin/env bash
# Flood, admission on and then off in the same run: batch arrivals at 3x the server's capacity and
# interactive chats at 30 % of it, open loop, for DURATION_S (15) each. Capacity is measured first
# (a closed loop of CAPACITY_USERS (32) users sending the batch shape for 10 s, its req/s);
# CAPACITY=R skips that. A GPU serves far more than 32 users at once: give it its max_seqs.
# The server is bench/scenarios/flood.json (admission on: batch requests the SLO guard predicts
# past their 10 s TTFT objective get 503 with Retry-After) and then flood-off.json (the same with
# "admission": false: everything is queued as it comes). No retries: a refusal is final.
# Prints a table, then as its last line one JSON object:
#   {"on": {...}, "off": {...}}, each with interactive_p99_ttft_ms, interactive_objective_ms,
#   goodput_rps (requests meeting their class's objectives per second), accepted (sent -
#   rejected), completed, rejected, rejected_without_retry_after.
# Usage: bench/scenarios/flood.sh [DURATION_S]
source "$(dirname "$0")/lib.sh"
DUR=${1:-15}
OBJECTIVE_MS=1000
echo "== flood, admission on then off: batch at 3x capacity + interactive at 30 %; $(machine)"
start_sluice "$SCEN/flood.json"
measure_capacity 10 "capacity,tier=batch" "${CAPACITY_USERS:-32}"
BATCH=$(awk -v c="$CAPACITY" 'BEGIN { printf "%.2f", 3 * c }')
INTER=$(awk -v c="$CAPACITY" 'BEGIN { printf "%.2f", 0.3 * c }')
echo "capacity ${CAPACITY} req/s (batch shape, ${CAPACITY_USERS:-32} users): batch at ${BATCH} req/s, interactive at ${INTER} req/s"
run() { # label
  bench --duration "$DUR" --ignore-eos --timeout 600 \
    --class "batch,rate=$BATCH,tier=batch,prompt=128,output=64,ttft_slo=10000,tpot_slo=1000" \
    --class "interactive,rate=$INTER,tier=interactive,endpoint=chat,prompt=lognormal:48:0.4,output=32,ttft_slo=$OBJECTIVE_MS,tpot_slo=100" \
    --label "$1" --summary "$OUT/summary.tsv" --json "$OUT/$1.json" --csv "$OUT/$1.csv" >/dev/null
  echo "admission $1: done; $(cut -d' ' -f1-3 /proc/loadavg) load average"
}
run on
stop_sluice
cp "$OUT/sluice.log" "$OUT/sluice-on.log"
start_sluice "$SCEN/flood-off.json"
run off
stop_sluice
cp "$OUT/sluice.log" "$OUT/sluice-off.log"
echo
table "$OUT/summary.tsv" label class sent ok rejected rej_no_retry errors req/s goodput/s ttft_p50 \
  ttft_p99 tpot_p99 e2el_p99
echo
awk -F'\t' -v obj="$OBJECTIVE_MS" '
  NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
  $col["class"] == "interactive" { p99[$1] = $col["ttft_p99"] }
  $col["class"] == "all" {
    good[$1] = $col["goodput/s"]; sent[$1] = $col["sent"]; ok[$1] = $col["ok"]
    rej[$1] = $col["rejected"]; norej[$1] = $col["rej_no_retry"]
  }
  END {
    printf "{"
    n = split("on off", run, " ")
    for (k = 1; k <= n; k++) {
      r = run[k]
      printf "%s\"%s\": {\"interactive_p99_ttft_ms\": %s, \"interactive_objective_ms\": %d, " \
        "\"goodput_rps\": %s, \"accepted\": %d, \"completed\": %d, \"rejected\": %d, " \
        "\"rejected_without_retry_after\": %d}", (k > 1 ? ", " : ""), r, p99[r], obj, good[r],
        sent[r] - rej[r], ok[r], rej[r], norej[r]
    }
    print "}"
  }' "$OUT/summary.tsv"
