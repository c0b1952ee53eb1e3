#!/usr/bin/env bash
# Flood: batch arrivals at 3x the server's capacity and interactive arrivals at 30 % of it, open
# loop, for 30 s. Capacity is measured first, in the same run: a closed loop of 32 users sending
# the batch shape for 15 s (its req/s). Set CAPACITY=R to skip that measurement.
# What it shows depends on admission control (a later issue): until then sluice queues every
# request, so the flood's backlog delays interactive requests too, and nothing is rejected.
# Usage: bench/scenarios/flood.sh [DURATION_S]
source "$(dirname "$0")/lib.sh"
DUR=${1:-30}
echo "== flood: batch at 3x capacity + interactive at 30 %; $(machine)"
start_sluice "$SCEN/stories15M.json"
if [ -z "${CAPACITY:-}" ]; then
  bench --concurrency 32 --duration 15 --warmup 3 --prompt 128 --output 64 --ignore-eos \
    --class "capacity,tier=batch" --label capacity --summary "$OUT/capacity.tsv" >/dev/null
  CAPACITY=$(awk -F'\t' 'NR == 2 { print $7 }' "$OUT/capacity.tsv")
fi
BATCH=$(awk -v c="$CAPACITY" 'BEGIN { printf "%.2f", 3 * c }')
INTER=$(awk -v c="$CAPACITY" 'BEGIN { printf "%.2f", 0.3 * c }')
echo "capacity ${CAPACITY} req/s (batch shape, 32 users): batch at ${BATCH} req/s, interactive at ${INTER} req/s"
bench --duration "$DUR" --ignore-eos --timeout 600 --max-retries 2 \
  --class "batch,rate=$BATCH,tier=batch,prompt=128,output=64,ttft_slo=60000,tpot_slo=1000" \
  --class "interactive,rate=$INTER,tier=interactive,endpoint=chat,prompt=lognormal:48:0.4,output=32,ttft_slo=1000,tpot_slo=100" \
  --label flood --summary "$OUT/summary.tsv" --json "$OUT/flood.json" --csv "$OUT/flood.csv"
stop_sluice
echo
table "$OUT/summary.tsv" class sent ok rejected errors req/s goodput/s ttft_p50 ttft_p99 tpot_p99 \
  e2el_p99
