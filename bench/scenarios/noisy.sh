#!/usr/bin/env bash
# Noisy neighbour inside one tier. Tenants quiet and noisy both send to the batch tier of
# noisy.json: quiet a steady 2 req/s of short chats, noisy a flood of long completions (200-token
# prompts, the synthetic model's context being 256) at 8x the request rate measured for the
# 128/64 shape (CAPACITY=R skips the measurement): more prompt work than the server does, so the
# tier's queue grows all run. Runs, each
# DURATION_S (30) long: quiet alone; quiet with noisy under fairness "vtc" (virtual token
# counters, the default); the same under "fcfs" (arrival order, as before issue 30).
# Prints a table, then as its last line one JSON object:
#   {"alone_p99_ttft_ms", "vtc_p99_ttft_ms", "fcfs_p99_ttft_ms", "fcfs_over_vtc",
#    "tier_objective_ms", "noisy_tokens_per_s_vtc", "noisy_tokens_per_s_fcfs"} for quiet.
# Usage: bench/scenarios/noisy.sh [DURATION_S]
source "$(dirname "$0")/lib.sh"
DUR=${1:-30}
QUIET=sk-quiet-scenario-0001
NOISY=sk-noisy-scenario-0001
OBJECTIVE_MS=60000
QUIET_CLASS="quiet,rate=2,tenant=quiet,key=$QUIET,endpoint=chat,prompt=lognormal:48:0.4,output=32,ttft_slo=$OBJECTIVE_MS,tpot_slo=1000"
echo "== noisy neighbour inside one tier, vtc then fcfs; $(machine)"
sed 's/"fairness": "vtc"/"fairness": "fcfs"/' "$SCEN/noisy.json" >"$OUT/noisy-fcfs.json"
start_sluice "$SCEN/noisy.json"
measure_capacity 15 "capacity,key=$NOISY"
FLOOD=$(awk -v c="$CAPACITY" 'BEGIN { printf "%.2f", 8 * c }')
echo "capacity ${CAPACITY} req/s (128/64); noisy floods 200/16 at ${FLOOD} req/s"
bench --duration "$DUR" --warmup 3 --ignore-eos --class "$QUIET_CLASS" \
  --label alone --summary "$OUT/summary.tsv" --json "$OUT/alone.json" >/dev/null
flood() { # label
  bench --duration "$DUR" --ignore-eos --timeout 600 --class "$QUIET_CLASS" \
    --class "noisy,rate=$FLOOD,tenant=noisy,key=$NOISY,prompt=200,output=16,ttft_slo=$OBJECTIVE_MS,tpot_slo=1000" \
    --label "$1" --summary "$OUT/summary.tsv" --json "$OUT/$1.json" --csv "$OUT/$1.csv" >/dev/null
  echo "$1: done; $(cut -d' ' -f1-3 /proc/loadavg) load average"
}
flood vtc
stop_sluice
cp "$OUT/sluice.log" "$OUT/sluice-vtc.log"
start_sluice "$OUT/noisy-fcfs.json"
flood fcfs
stop_sluice
echo
table "$OUT/summary.tsv" label class sent ok rejected req/s goodput/s ttft_p50 ttft_p99 tpot_p99 \
  e2el_p99 out_tok/s
echo
awk -F'\t' -v obj="$OBJECTIVE_MS" '
  NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
  $col["class"] == "quiet" { p99[$1] = $col["ttft_p99"] }
  $col["class"] == "noisy" { tok[$1] = $col["out_tok/s"] }
  END {
    printf "{\"alone_p99_ttft_ms\": %s, \"vtc_p99_ttft_ms\": %s, \"fcfs_p99_ttft_ms\": %s, " \
      "\"fcfs_over_vtc\": %.1f, \"tier_objective_ms\": %d, \"noisy_tokens_per_s_vtc\": %s, " \
      "\"noisy_tokens_per_s_fcfs\": %s}\n", p99["alone"], p99["vtc"], p99["fcfs"],
      p99["fcfs"] / p99["vtc"], obj, tok["vtc"], tok["fcfs"]
  }' "$OUT/summary.tsv"
